"""cuda_graphs.py (CUDA's default, --cuda_graph): the training step replayed from CUDA
graphs trains as the eager step does. On the CPU the capture is replaced by a plain call
of the same step on the same static buffers, which checks everything but the capture: the
warm-up steps, one buffer pair per batch shape (an epoch's short last batch its own), the
learning rate as a tensor the schedule writes, the copied-out losses, and resumable
states, bit for bit; and, compiled (torch's eager backend standing in for inductor), the
short batch padded to one shape, within rounding, and a compiler that fails. On a CUDA
GPU (skipped elsewhere) the real graphs against the eager step in each precision,
compiled with inductor too, for every variant and a student's complex-number RoPE; a
step that cannot be captured; and two runs' graphs replayed at once on two streams."""

import itertools
import os
import random
import re
import subprocess
import sys

import pytest
import torch

import attention
import bench
import dataset
import run
import trainer
from conftest import ROOT, stopped_at_call, tiny_corpus
from machinery import cuda_graphs, devices, dropout, resume
from machinery.files import UserError
from test_model import VARIANTS, make_gpt
from test_trainer import tiny_setup

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason='no CUDA GPU here')


def train(graphed, device='cpu', **overrides):
    """The tiny setup trained whole-batch (as a GPU trains); returns the trainer, the
    per-step losses and the learning rates its optimizer held at each step."""
    random.seed(0)
    gpt, ds, config = tiny_setup(device=device, cuda_graph=graphed, log_every=1, **overrides)
    t = trainer.Trainer(gpt, ds, None, config)
    t.packs = False
    losses, rates = [], []
    step = t.unlogged_step = t.train_step

    def logged_step(x, y):
        loss = step(x, y)
        losses.append(loss.item())
        rates.append(float(t.optimizer.param_groups[0]['lr']))  # the rate this step used
        return loss

    t.train_step = logged_step
    t.train()
    return t, losses, rates


def test_graphed_step_trains_as_the_eager_step_bit_for_bit():
    """The cosine schedule writes the rate into the tensor AdamW reads, at every step."""
    eager, eager_losses, eager_rates = train(False)
    graphed, graphed_losses, graphed_rates = train(True)
    assert graphed_losses == eager_losses
    assert len(graphed_rates) == 15 and graphed_rates == eager_rates
    assert len(set(eager_rates)) > 8  # warm-up, then decay: most steps a new rate
    for (name, p), q in zip(eager.model.named_parameters(), graphed.model.parameters()):
        assert torch.equal(p, q), name
    step = graphed.unlogged_step
    # 3 eager warm-up steps, each shape's first step eager (the epoch's short last batch:
    # epoch 1), then one buffer pair per shape: 8 rows, and the epoch's last 5
    assert step.eager_left == 0 and sorted(step.captured) == [(5, 31), (8, 31)]
    assert all(group['lr'] is step.lr for group in graphed.optimizer.param_groups)


@pytest.mark.parametrize('precision', ['bf16', 'fp16'])
def test_graphed_step_in_each_precision(precision):
    """bf16 and fp16 (the loss scaler's unscaling and update inside the step)."""
    settings = dict(learning_rate=2**-10, lr_decay=False, precision=precision)
    _, eager_losses, _ = train(False, **settings)
    graphed, graphed_losses, _ = train(True, **settings)
    assert graphed_losses == eager_losses
    assert graphed.scaler.is_enabled() == (precision == 'fp16')


def train_interrupted(tmp_path, stop_at, resumed_settings, **settings):
    """The tiny setup stopped (as by Ctrl-C) during step stop_at, then resumed with
    resumed_settings instead and trained to the end; returns the saved state as it was
    and the final params."""
    path = str(tmp_path / 'state.resume')
    random.seed(0)
    gpt, ds, config = tiny_setup(resume_path=path, **settings)
    t = trainer.Trainer(gpt, ds, None, config)
    t.packs = False
    t.train_step = stopped_at_call(stop_at, t.train_step, t)
    with pytest.raises(resume.TrainingInterrupted):
        t.train()
    saved = torch.load(path, weights_only=True)
    random.seed(1)
    gpt, ds, config = tiny_setup(resume_path=path, resume=True, **resumed_settings)
    t = trainer.Trainer(gpt, ds, None, config)
    t.packs = False
    t.train()
    return saved, gpt.state_dict()


@pytest.mark.parametrize('resumed_with_graphs', [True, False])
def test_graphed_run_resumes_exactly_with_or_without_graphs(tmp_path, resumed_with_graphs):
    """Stopped after its graphs took over. The saved optimizer holds its learning rate as
    a number and is not capturable, so the state resumes without graphs too; either way
    the params are the straight graphed run's."""
    settings = dict(learning_rate=2**-10, lr_decay=False)
    straight = train(True, **settings)[0].model.state_dict()
    saved, resumed = train_interrupted(
        tmp_path,
        cuda_graphs.WARMUP + 4,
        dict(settings, cuda_graph=resumed_with_graphs),
        cuda_graph=True,
        **settings,
    )
    for group in saved['optimizer']['param_groups']:
        assert isinstance(group['lr'], float) and group['capturable'] is False
    for k in straight:
        assert torch.equal(straight[k], resumed[k]), k


def test_conditions_of_the_flag():
    cuda_graphs.check('cuda', 1)
    cuda_graphs.check('cpu', 1, stand_in=True)  # the tests' plain calls
    with pytest.raises(UserError, match='CUDA GPUs only'):
        cuda_graphs.check('mps', 1, stand_in=True)
    for device, processes, why in [
        ('cpu', 1, 'CUDA GPUs only'),
        ('mps', 1, 'CUDA GPUs only'),
        ('cuda', 2, 'one process only'),
    ]:
        with pytest.raises(UserError, match=why):
            cuda_graphs.check(device, processes)


def test_pad_rows_adds_rows_of_pad():
    x, y = torch.arange(6).view(2, 3) + 1, torch.arange(6).view(2, 3)
    px, py = cuda_graphs.pad_rows(x, y, 4)
    assert px.tolist() == [[1, 2, 3], [4, 5, 6], [0, 0, 0], [0, 0, 0]]
    assert py.tolist() == [[0, 1, 2], [3, 4, 5], [0, 0, 0], [0, 0, 0]]
    assert cuda_graphs.pad_rows(x, y, 2)[0] is x and cuda_graphs.pad_rows(x, y, 0)[1] is y


def compile_on_the_cpu(monkeypatch, backend='eager'):
    """--compile allowed on the CPU, with `backend` in place of inductor's GPU kernels
    (dynamo's 'eager' runs the traced graph as it is: the same arithmetic)."""
    torch._dynamo.reset()
    monkeypatch.setattr(devices, 'COMPILED_DEVICES', ('cpu',))
    monkeypatch.setattr(devices, 'COMPILE_OPTIONS', dict(devices.COMPILE_OPTIONS, backend=backend))


@pytest.mark.slow
def test_compiled_graphed_step_pads_the_short_batch(monkeypatch):
    """Compiled, the epoch's short last batch is padded with rows of PAD: one shape (one
    compilation) a phase. The full batches' losses are the eager step's bit for bit, the
    short one's within rounding (the mean over more rows sums in another order), and so
    is everything after it."""
    settings = dict(learning_rate=2**-10, lr_decay=False)
    eager, eager_losses, _ = train(False, **settings)
    compile_on_the_cpu(monkeypatch)
    graphed, graphed_losses, _ = train(True, compile=True, **settings)
    steps = eager.steps_per_epoch
    assert len(eager.train_dataset) % eager.config.batch_size  # a short last batch
    assert graphed_losses[: steps - 1] == eager_losses[: steps - 1]
    torch.testing.assert_close(graphed_losses, eager_losses, rtol=1e-5, atol=0)
    assert sorted(graphed.graphed.captured) == [(8, 31)]
    assert graphed.graphed.eager_left == 0
    # AdamW turns rounding into steps of the learning rate's size in weights whose
    # gradient is rounding alone (the key biases'), so the whole is compared
    a, b = (torch.cat([p.flatten() for p in t.model.parameters()]) for t in (graphed, eager))
    assert (a - b).norm() / b.norm() < 1e-4


@pytest.mark.parametrize('graphed', [False, True])
def test_a_model_the_compiler_fails_on_trains_uncompiled(monkeypatch, capsys, graphed):
    """A compiler that raises (no working Triton, code torch.compile cannot take): one
    line says so, and training goes on as written, to the uncompiled run's params."""
    settings = dict(learning_rate=2**-10, lr_decay=False)
    eager = train(graphed, **settings)[0].model.state_dict()

    def failing_backend(graph, example_inputs):
        raise RuntimeError("planted: no compiler here\nsecond line")

    compile_on_the_cpu(monkeypatch, failing_backend)
    monkeypatch.setattr(devices, 'NOTES', set())  # each test's note
    t = train(graphed, compile=True, **settings)[0]
    assert t.model._compiled_call_impl is None
    err = capsys.readouterr().err
    assert err.count("note: torch.compile failed on this model") == 1
    assert "planted: no compiler here" in err and "second line" not in err
    for k, v in t.model.state_dict().items():
        assert torch.equal(v, eager[k]), k


def test_a_failure_of_the_models_own_code_is_raised_as_it_is(monkeypatch):
    """Not a compiler's failure: the same error comes again from the uncompiled model."""
    compile_on_the_cpu(monkeypatch)
    random.seed(0)
    gpt, ds, config = tiny_setup(compile=True)

    def broken_forward(idx, targets=None, **kwargs):
        raise ValueError("the student's bug")

    t = trainer.Trainer(gpt, ds, None, config)
    gpt.forward = broken_forward
    with pytest.raises(ValueError, match="the student's bug"):
        t.train()


@CUDA
@pytest.mark.parametrize('precision', ['fp32', 'bf16', 'fp16'])
def test_cuda_graphs_train_as_the_eager_step(precision):
    """Real graphs: dropout on, the short last batch's graph, fp16's scaler; within
    rounding of the eager CUDA step (some GPU kernels are not deterministic)."""
    if precision == 'bf16' and torch.cuda.get_device_capability() < (8, 0):
        pytest.skip('no native bf16')
    settings = dict(learning_rate=2**-10, lr_decay=False, precision=precision)
    eager, eager_losses, _ = train(False, 'cuda', **settings)
    graphed, graphed_losses, _ = train(True, 'cuda', **settings)
    assert all(c.graph is not None for c in graphed.graphed.captured.values())
    assert len(graphed.graphed.captured) == 2
    tolerance = dict(rtol=1e-4, atol=1e-5) if precision == 'fp32' else dict(rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(graphed_losses, eager_losses, **tolerance)
    for (name, p), q in zip(eager.model.named_parameters(), graphed.model.parameters()):
        torch.testing.assert_close(q, p, **tolerance, msg=name)


def rotate_as_complex_numbers(x, rope_cache):
    """apply_rotary_emb as the 2024 starter invites a student to write it."""
    T = x.shape[-2]
    pairs = torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2))  # (B, nh, T, hs/2)
    turns = torch.view_as_complex(rope_cache[:T].contiguous())  # (T, hs/2)
    return torch.view_as_real(pairs * turns).flatten(-2)  # (B, nh, T, hs)


def train_variant(variant, compile, graphed, precision):
    """The variant's small model trained on the tiny corpus, dropout off (compiled dropout
    draws other masks); returns the trainer and each step's loss."""
    random.seed(0)
    _, ds, config = tiny_setup(
        device='cuda',
        precision=precision,
        compile=compile,
        cuda_graph=graphed,
        learning_rate=2**-10,
        lr_decay=False,
    )
    gpt = make_gpt(variant, ds.vocab_size, n_layer=3, n_head=2, n_embd=32)
    dropout.switched_off(gpt)
    t = trainer.Trainer(gpt, ds, None, config)
    losses, step = [], t.train_step

    def logged_step(x, y):
        loss = step(x, y)
        losses.append(loss.item())
        return loss

    t.train_step = logged_step
    t.train()
    return t, losses


@CUDA
@pytest.mark.parametrize(
    'variant, precision',
    [(v, 'bf16') for v in VARIANTS] + [('vanilla', 'fp16'), ('complex rope', 'bf16')],
)
def test_compiled_cuda_graphs_train_as_the_eager_step(monkeypatch, variant, precision):
    """Compiled by inductor and replayed from CUDA graphs, as pretraining runs on CUDA:
    every variant, fp16 (a T4's) and a student's complex-number RoPE, against the eager
    step, within the precision's rounding."""
    if precision == 'bf16' and torch.cuda.get_device_capability() < (8, 0):
        pytest.skip('no native bf16')
    if variant == 'complex rope':
        monkeypatch.setattr(attention, 'apply_rotary_emb', rotate_as_complex_numbers)
        variant = 'rope'
    torch._dynamo.reset()
    eager, eager_losses = train_variant(variant, False, False, precision)
    compiled, compiled_losses = train_variant(variant, True, True, precision)
    assert compiled.model._compiled_call_impl is not None  # compiled, not fallen back
    assert len(compiled.graphed.captured) == 1  # the short batch padded
    assert all(c.graph is not None for c in compiled.graphed.captured.values())
    torch.testing.assert_close(compiled_losses, eager_losses, rtol=3e-2, atol=3e-2)


def stop_at_a_failed_capture():
    """Trains a model that reads a tensor's value on the host (as a student's may), with
    graphs: its capture fails. Run in a process of its own (the test below)."""
    random.seed(0)
    gpt, ds, config = tiny_setup(cuda_graph=True, device='cuda')
    forward = gpt.forward

    def forward_that_reads(idx, targets=None, **kwargs):
        if int(idx.max().item()) < 0:  # a host sync: not allowed in a capture
            raise AssertionError
        return forward(idx, targets, **kwargs)

    gpt.forward = forward_that_reads
    t = trainer.Trainer(gpt, ds, None, config)
    try:
        t.train()
    except UserError as e:
        print(f"stopped after {len(t.graphed.seen)} shape, {t.graphed.eager_left} left: {e}")


@CUDA
def test_a_step_that_cannot_be_captured_stops_with_one_line():
    """The run stops at its fourth step, naming the error and --eager: a failed capture
    leaves CUDA's random generator unusable in the process (torch 2.11's dropout then
    fails with "Offset increment outside graph capture"), so this runs in a process of
    its own, and does not go on without graphs."""
    script = 'import test_cuda_graphs as t; t.stop_at_a_failed_capture()'
    folders = [str(ROOT / f) for f in ('src', 'research', 'tools', 'tests')]
    env = {**os.environ, 'PYTHONPATH': os.pathsep.join(folders)}
    done = subprocess.run(
        [sys.executable, '-c', script], capture_output=True, text=True, env=env, cwd=ROOT
    )
    assert re.search(
        r'^stopped after 1 shape, 0 left: the training step cannot be replayed from a CUDA '
        r'graph \(.+\); run the command again with --eager$',
        done.stdout,
        re.M,
    ), done.stdout + done.stderr[-2000:]


def replay_two_runs(precision):
    """Two runs (other initial models, dropout off) trained from their graphs replayed one
    after another, again one after another (new runs, new captures), then at once on two
    streams; asserts that replaying at once moves each run's params no further from the
    first set's than the second set moved (the GPU's own run-to-run arithmetic: Adam turns
    a rounding difference in a near-zero gradient into a step of the learning rate), and
    that bench.py times the three ways. A run that wrote another's cuBLAS workspace would
    move by far more, or never end."""
    corpus = dataset.CharCorruptionDataset(tiny_corpus()[0] * 5, 128)  # bench's 128 rows
    seeds = itertools.cycle([0, 1])  # each set's first run from seed 0, its second from 1

    def model_without_dropout(vocab_size, variant, bottleneck_dim):
        torch.manual_seed(next(seeds))
        return dropout.switched_off(run.new_model(variant, vocab_size, bottleneck_dim))

    bench.make_model = model_without_dropout
    params = []
    for at_once in [False, False, True]:
        runs = bench.graphed_runs(corpus, 2, 'vanilla', 32, precision)
        assert runs[0].graphed.stream != runs[1].graphed.stream  # each captured on its own
        graphs = [bench.graph_of(r) for r in runs]
        streams = [torch.cuda.Stream() for _ in runs]
        for _ in range(5):
            if at_once:
                bench.replay_at_once(graphs, streams)
            else:
                for graph in graphs:
                    graph.replay()
        params.append([torch.cat([p.detach().flatten() for p in r.model.parameters()])
                       for r in runs])  # fmt: skip
    first, again, at_once = params
    assert not torch.equal(first[0], first[1])  # the two runs differ
    for k in range(2):
        repeat = (again[k] - first[k]).abs().max().item()
        concurrent = (at_once[k] - first[k]).abs().max().item()
        print(f"run {k} ({precision}): one after another again moved {repeat:.3g}, "
              f"at once {concurrent:.3g}")  # fmt: skip
        assert concurrent <= max(2 * repeat, 1e-6), (repeat, concurrent)
    times = bench.bench_concurrent_replays(corpus, 2, 'vanilla', 32, precision, steps=3)
    assert len(times) == 3 and all(0 < t < 10 for t in times)


@CUDA
@pytest.mark.parametrize('precision', ['fp32', 'bf16'])
def test_several_runs_graphs_replayed_at_once_train_as_one_after_another(precision):
    """bench.py --concurrent: two runs' graphs replayed at once on two streams train the runs
    as replayed one after another (replay_two_runs), and each way is timed. A graph that
    wrote another's cuBLAS workspace would differ, or never end (as on an H200, when every
    graph was captured on one stream): so this runs in a process of its own, which the
    test's time limit ends."""
    if precision == 'bf16' and torch.cuda.get_device_capability() < (8, 0):
        pytest.skip('no native bf16')
    script = f'import test_cuda_graphs as t; t.replay_two_runs({precision!r})'
    folders = [str(ROOT / f) for f in ('src', 'research', 'tools', 'tests')]
    env = {**os.environ, 'PYTHONPATH': os.pathsep.join(folders)}
    try:
        done = subprocess.run([sys.executable, '-c', script], capture_output=True, text=True,
                              env=env, cwd=ROOT, timeout=300)  # fmt: skip
    except subprocess.TimeoutExpired:
        pytest.fail('the replays did not end in 300 s')
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    print(done.stdout)  # each run's moves, for docs/gpus-and-macs.md
