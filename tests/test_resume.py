"""resume.py: an interrupted run resumed from its state ends with the params and losses
of a run never interrupted; a damaged or foreign state is one line before any step."""

import math
import os
import random
import re
import signal
import subprocess
import sys

import numpy as np
import pytest
import torch

import trainer
from conftest import run_signal_handlers
from machinery import files, resume
from test_trainer import tiny_setup


def train_to_end(tmp_path, interrupt_at=None, precision='fp32', prepare=lambda gpt: None):
    """Train the tiny setup; with interrupt_at=k, SIGINT arrives during step k and the
    run is then resumed. prepare(model) runs on each new model before training (a
    finetuning method). Returns the final state_dict."""
    random.seed(0)
    gpt, ds, config = tiny_setup(resume_path=str(tmp_path / 'state.resume'), precision=precision)
    prepare(gpt)
    steps = {'n': 0}
    forward = gpt.forward

    def counting_forward(*args, **kwargs):
        steps['n'] += 1
        if steps['n'] == interrupt_at:
            os.kill(os.getpid(), signal.SIGINT)
        return forward(*args, **kwargs)

    gpt.forward = counting_forward
    if interrupt_at is not None:
        steps_per_epoch = math.ceil(len(ds) / config.batch_size)
        epoch, step = divmod(interrupt_at - 1, steps_per_epoch)
        with (
            run_signal_handlers(),
            pytest.raises(resume.TrainingInterrupted, match=f"epoch {epoch + 1}, step {step + 1};"),
        ):
            trainer.Trainer(gpt, ds, None, config).train()
        assert (tmp_path / 'state.resume').exists()
        # a new process: fresh model, scrambled random states
        random.seed(123)
        torch.manual_seed(123)
        gpt, ds, config = tiny_setup(
            resume_path=str(tmp_path / 'state.resume'), resume=True, precision=precision
        )
        prepare(gpt)
    trainer.Trainer(gpt, ds, None, config).train()
    return gpt.state_dict()


@pytest.mark.parametrize('interrupt_at', [3, 5, 11])  # mid-epoch, an epoch's last step, later
def test_interrupt_and_resume_equals_uninterrupted(tmp_path, interrupt_at):
    straight = train_to_end(tmp_path)
    resumed = train_to_end(tmp_path, interrupt_at)
    for k in straight:
        assert torch.equal(straight[k], resumed[k]), k


def test_a_run_killed_after_its_saved_state_resumes_to_the_same_params_and_metrics(tmp_path):
    """A run that dies without saving (a kill, a machine lost) during epoch 2, its state saved
    at epoch 1's end, after logging steps past it: resumed, its params and its metrics CSV's
    steps and losses are an uninterrupted run's."""

    def run(name, die_at=None, resume=False):
        random.seed(123 if resume else 0)  # resumed: as a new process, the state restores it
        gpt, ds, config = tiny_setup(
            resume_path=str(tmp_path / f'{name}.resume'), resume=resume, save_every_s=0,
            log_every=1, metrics_path=str(tmp_path / f'{name}.csv'),
        )  # fmt: skip
        steps, forward = {'n': 0}, gpt.forward

        def dying_forward(*args, **kwargs):
            steps['n'] += 1
            if steps['n'] == die_at:
                raise SystemExit('killed')
            return forward(*args, **kwargs)

        gpt.forward = dying_forward
        trainer.Trainer(gpt, ds, None, config).train()
        return gpt.state_dict()

    def logged(name):
        lines = (tmp_path / f'{name}.csv').read_text().splitlines()[1:]
        return [line.split(',')[1:3] for line in lines]  # step, loss

    straight = run('straight')
    steps_per_epoch = len(logged('straight')) // 3
    with pytest.raises(SystemExit, match='killed'):
        run('killed', die_at=steps_per_epoch + 3)
    assert len(logged('killed')) == steps_per_epoch + 2  # two steps past the saved state
    resumed = run('killed', resume=True)
    assert all(torch.equal(straight[k], resumed[k]) for k in straight)
    assert logged('killed') == logged('straight')


def saved_state(tmp_path):
    """A resumable state of tiny_setup after one step (so the optimizer has moments), as
    Trainer.save_state writes it; returned as loaded with weights_only=True."""
    gpt, ds, config = tiny_setup(resume_path=str(tmp_path / 'state.resume'))
    t = trainer.Trainer(gpt, ds, None, config)
    random.seed(0)
    x, y = t.batch(ds, 0)
    t.update(t.loss(x, y))
    t.epoch, t.step, t.tokens, t.elapsed = 0, 1, y.numel(), 1.5
    t.save_state()
    return torch.load(tmp_path / 'state.resume', weights_only=True)


def resume_to_end(tmp_path, steps=None):
    """Resume tiny_setup from tmp_path/state.resume and train to the end; returns the model.
    Counts the steps run in `steps` (a list)."""
    gpt, ds, config = tiny_setup(resume_path=str(tmp_path / 'state.resume'), resume=True)
    forward = gpt.forward

    def counting_forward(*args, **kwargs):
        if steps is not None:
            steps.append(1)
        return forward(*args, **kwargs)

    gpt.forward = counting_forward
    trainer.Trainer(gpt, ds, None, config).train()
    return gpt


def test_resumable_state_is_plain_values_and_restores_numpy(tmp_path):
    np.random.seed(3)
    state = saved_state(tmp_path)  # loads with weights_only=True
    assert isinstance(state['numpy_rng'][1], list)
    expected = np.random.rand(3)
    np.random.seed(99)
    gpt, ds, config = tiny_setup(resume_path=str(tmp_path / 'state.resume'), resume=True)
    t = trainer.Trainer(gpt, ds, None, config)
    resume.load(config.resume_path, t)
    assert (t.epoch, t.step) == (0, 1)
    assert np.array_equal(np.random.rand(3), expected)


def damage_optimizer(state, change):
    optimizer = {**state['optimizer'], 'state': dict(state['optimizer']['state'])}
    change(optimizer)
    return {**state, 'optimizer': optimizer}


DAMAGED_STATES = [
    # (what, state -> what the file holds, expected message after "--resume: PATH")
    ('a list', lambda s: [s], r': not a resumable state \(it holds a list\)$'),
    (
        'missing part',
        lambda s: {k: v for k, v in s.items() if k != 'optimizer'},
        r": not a resumable state \('optimizer' is nothing\)$",
    ),
    (
        'part of the wrong type',
        lambda s: {**s, 'process_rngs': tuple(s['process_rngs'])},
        r": not a resumable state \('process_rngs' is a tuple\)$",
    ),
    (
        'other settings',
        lambda s: {**s, 'config': {**s['config'], 'batch_size': 4}},
        r' was saved by a run with other settings: batch_size 4 \(this run: 8\)\. To continue that run, give it '
        r'those settings again; to start afresh, leave out --resume \(or delete the file\)$',
    ),
    (
        'epoch beyond the run',
        lambda s: {**s, 'epoch': 99},
        r': damaged \(epoch 99, step 1 do not exist in this run\)$',
    ),
    (
        'model weight of the wrong shape',
        lambda s: {**s, 'model': {**s['model'], 'head.weight': torch.zeros(3)}},
        r": does not fit this run's model \('head.weight' has shape \(3,\), expected \(\d+, 32\)\)$",
    ),
    (
        'model weight not a tensor',
        lambda s: {**s, 'model': {**s['model'], 'head.weight': 0.5}},
        r": 'head.weight' is a float, not a tensor$",
    ),
    ('empty model', lambda s: {**s, 'model': {}}, r': the state_dict is empty$'),
    (
        'nan model weight',
        lambda s: {**s, 'model': {**s['model'], 'ln_f.bias': torch.full((32,), float('nan'))}},
        r": 'ln_f.bias' has 32 non-finite value\(s\)",
    ),
    (
        'optimizer moment of the wrong shape',
        lambda s: damage_optimizer(
            s, lambda o: o['state'].update({0: {**o['state'][0], 'exp_avg': torch.zeros(3)}})
        ),
        r': damaged \(optimizer exp_avg of shape \(3,\) for a parameter of shape',
    ),
    (
        'optimizer groups',
        lambda s: damage_optimizer(s, lambda o: o.update(param_groups=o['param_groups'][:1])),
        r': damaged \(.*parameter groups',
    ),
    ('python random state', lambda s: {**s, 'python_rng': (3, (1, 2), None)}, r': damaged \(.+\)$'),
    (
        'numpy random state',
        lambda s: {**s, 'numpy_rng': ('MT19937', [1, 2], 0, 0, 0.0)},
        r': damaged \(.+\)$',
    ),
    (
        'torch random state',
        lambda s: {
            **s,
            'process_rngs': [{**s['process_rngs'][0], 'torch': torch.zeros(3, dtype=torch.uint8)}],
        },
        r': damaged \(.+\)$',
    ),
    ('random states of fewer processes', lambda s: {**s, 'process_rngs': []}, r': damaged \(.+\)$'),
    (
        'an object',
        lambda s: {**s, 'numpy_rng': np.random.get_state()},
        r': refused: it holds code or objects \(numpy\.\S+\), .* If you trust the file \(an earlier version '
        r'of this code wrote it\), convert it in place with: python -c ',
    ),
]


@pytest.mark.parametrize(
    'what, damage, message', DAMAGED_STATES, ids=[c[0] for c in DAMAGED_STATES]
)
def test_damaged_resumable_state_is_one_line_before_any_step(tmp_path, what, damage, message):
    torch.save(damage(saved_state(tmp_path)), tmp_path / 'state.resume')
    steps = []
    with pytest.raises(files.UserError) as raised:
        resume_to_end(tmp_path, steps)
    assert len(str(raised.value).splitlines()) == 1, str(raised.value)
    assert re.search(r'^--resume: \S+state.resume' + message, str(raised.value)), str(raised.value)
    assert steps == [] and (tmp_path / 'state.resume').exists()


@pytest.mark.parametrize(
    'content, message',
    [
        (b'', r'not a resumable state \(the file is empty or cut short\)'),
        (
            b'not a state',
            r'not a resumable state, or a damaged one \(torch.load: UnpicklingError\)',
        ),
    ],
)
def test_resumable_state_that_is_no_torch_file(tmp_path, content, message):
    (tmp_path / 'state.resume').write_bytes(content)
    with pytest.raises(files.UserError, match=r'^--resume: \S+state.resume: ' + message + '$'):
        resume_to_end(tmp_path)


def test_a_state_saved_before_plain_values_converts_and_resumes_exactly(tmp_path):
    """Earlier versions saved numpy's random state as an ndarray: such a state is refused,
    and once converted with the printed command it resumes to the same model as now."""
    state = saved_state(tmp_path)
    expected = resume_to_end(tmp_path).state_dict()
    name, keys, *rest = state['numpy_rng']
    old = {k: v for k, v in state.items() if k not in ('scaler', 'processes', 'process_rngs')}
    old.update(
        numpy_rng=(name, np.array(keys, dtype=np.uint32), *rest),
        torch_rng=state['process_rngs'][0]['torch'],
        cuda_rng=state['process_rngs'][0]['cuda'],
    )
    torch.save(old, tmp_path / 'state.resume')
    with pytest.raises(
        files.UserError, match=r'refused: it holds code or objects \(numpy'
    ) as raised:
        resume_to_end(tmp_path)
    command = str(raised.value).split(' with: ')[1]
    subprocess.run(sys.executable + command[len('python') :], shell=True, check=True)
    resumed = resume_to_end(tmp_path).state_dict()
    assert all(torch.equal(resumed[k], expected[k]) for k in expected)


def test_fp16_gradient_scaler_skips_overflows_and_resumes_exactly(tmp_path):
    """fp16 autocast with torch.amp.GradScaler, on the CPU: a scale too large for fp16
    makes gradients overflow, those steps are skipped and the scale halves; the scale is
    part of the resumable state, so an interrupted run resumes to the same params."""

    def run(interrupt_at=None, resume=False):
        random.seed(0)
        gpt, ds, config = tiny_setup(
            resume_path=str(tmp_path / 'state.resume'), precision='fp16', resume=resume
        )
        t = trainer.Trainer(gpt, ds, None, config)
        if not resume:
            t.scaler = torch.amp.GradScaler('cpu', init_scale=2.0**40)
        real, steps = gpt.forward, {'n': 0}

        def counting_forward(*args, **kwargs):
            steps['n'] += 1
            if steps['n'] == interrupt_at:
                t.stopper.signal = signal.SIGINT
            return real(*args, **kwargs)

        gpt.forward = counting_forward
        t.train()
        return t, gpt.state_dict()

    straight, params = run()
    assert 0 < straight.scaler.get_scale() < 2.0**36  # several steps overflowed, and were skipped
    assert all(torch.isfinite(v).all() for v in params.values())
    with pytest.raises(resume.TrainingInterrupted):
        run(interrupt_at=2)
    saved = torch.load(tmp_path / 'state.resume', weights_only=False)['scaler']
    assert saved['scale'] == 2.0**38  # two overflowing steps so far
    resumed, resumed_params = run(resume=True)
    assert resumed.scaler.get_scale() == straight.scaler.get_scale()
    for k in params:
        assert torch.equal(params[k], resumed_params[k]), k


@pytest.mark.parametrize('saved, present', [(2, 1), (1, 2), (0, 1)])
def test_random_states_of_missing_gpus_are_left_out(monkeypatch, saved, present):
    """A state saved where `saved` GPUs were visible restores the random state of each GPU
    present that it holds one for, and only those: a machine with fewer GPUs resumes."""
    restored = []
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: present > 0)
    monkeypatch.setattr(torch.cuda, 'device_count', lambda: present)
    monkeypatch.setattr(torch.cuda, 'set_rng_state', lambda state, device: restored.append(device))
    rng = {'torch': torch.get_rng_state(), 'cuda': [torch.get_rng_state()] * saved}
    resume.set_torch_rng_state(rng, 'cuda')
    assert restored == list(range(min(saved, present)))
