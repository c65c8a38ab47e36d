"""The command line end to end, as a student runs it, on a tiny corpus; bad input; the
scripts around it (london_baseline.py, collect_submission.sh, dataset.py's views)."""

import os
import re
import shutil
import signal
import subprocess
import sys
import time
import zipfile

import numpy as np
import pytest
import torch

import devices
import files
import run
import trainer
import utils
from conftest import ROOT

PYTHON = sys.executable
CORRECT_LINE = re.compile(r'^Correct: (\d+\.0) out of (\d+\.0): ([\d.e-]+)%$', re.M)


def on_cpu(args):
    """args with --device cpu unless they name a device: the suite's exact comparisons are
    the CPU's (tests/test_accelerators.py checks CUDA and MPS against it)."""
    args = [str(a) for a in args]
    return args if '--device' in args else args + ['--device', 'cpu']


def cli(*args, cwd, check=True, env=None):
    """python src/run.py ARGS from `cwd`, as a student runs it (on the CPU)."""
    result = subprocess.run(
        [PYTHON, str(ROOT / 'src' / 'run.py'), *on_cpu(args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        env=env,
    )
    if check:
        assert result.returncode == 0, result.stderr
    assert 'Traceback' not in result.stderr
    return result


def main(*args, cwd):
    """run.main in this process (faster, on the CPU); returns the exit code, 0 when it returned."""
    old = os.getcwd()
    os.chdir(cwd)
    try:
        run.main(on_cpu(args))
        return 0
    except SystemExit as e:
        return e.code
    finally:
        os.chdir(old)


@pytest.mark.parametrize('variant', ['vanilla', 'synthesizer'])
def test_pipeline_end_to_end(tiny, variant):
    quick = ['--max_epochs', 1]
    cli(
        'pretrain',
        variant,
        'wiki.txt',
        '--writing_params_path',
        f'{variant}.pretrain.params',
        *quick,
        cwd=tiny,
    )
    out = cli(
        'finetune',
        variant,
        'wiki.txt',
        '--reading_params_path',
        f'{variant}.pretrain.params',
        '--writing_params_path',
        f'{variant}.finetune.params',
        '--finetune_corpus_path',
        'train.tsv',
        *quick,
        cwd=tiny,
    ).stdout
    assert 'finetune from pretrained: 1 epochs, batch 256, lr 0.0006, ' in out
    state = torch.load(tiny / f'{variant}.finetune.params', weights_only=True)
    assert isinstance(state, dict) and ('blocks.0.attn.w2' in state) == (variant == 'synthesizer')

    out = cli(
        'evaluate',
        variant,
        'wiki.txt',
        '--reading_params_path',
        f'{variant}.finetune.params',
        '--eval_corpus_path',
        'dev.tsv',
        '--outputs_path',
        'dev.predictions',
        cwd=tiny,
    ).stdout
    correct, total, percent = CORRECT_LINE.search(out).groups()
    assert float(total) == 4.0 and float(percent) == float(correct) / float(total) * 100
    predictions = (tiny / 'dev.predictions').read_text(encoding='utf-8').split('\n')
    assert len(predictions) == 5 and predictions[-1] == ''

    out = cli(
        'evaluate',
        variant,
        'wiki.txt',
        '--reading_params_path',
        f'{variant}.finetune.params',
        '--eval_corpus_path',
        'test.tsv',
        '--outputs_path',
        'test.predictions',
        cwd=tiny,
    ).stdout
    assert 'No gold birth places provided; returning (0,0)' in out
    assert 'Predictions written to test.predictions; no targets provided' in out
    assert len((tiny / 'test.predictions').read_text(encoding='utf-8').splitlines()) == 4


def test_finetune_without_pretraining_and_defaults(tiny):
    out = cli(
        'finetune',
        'vanilla',
        'wiki.txt',
        '--writing_params_path',
        'v.params',
        '--finetune_corpus_path',
        'train.tsv',
        '--max_epochs',
        1,
        cwd=tiny,
    ).stdout
    assert 'finetune: 1 epochs, batch 256, lr 0.0006' in out
    assert re.search(
        r'finetune done: 1 steps in .*final loss [\d.]+; params written to v.params', out
    )
    assert (tiny / 'v.params.metrics.csv').read_text().count('\n') == 2
    # the handout's settings are the defaults
    assert run.PHASE_SETTINGS == {
        'pretrain': dict(max_epochs=650, batch_size=128),
        'finetune': dict(max_epochs=75, batch_size=256),
        'finetune from pretrained': dict(max_epochs=10, batch_size=256),
    }


class ConfigCaptured(Exception):
    """Raised instead of training, carrying the TrainerConfig run.py built."""


@pytest.fixture
def captured_configs(monkeypatch):
    """run.py's phases build the Trainer but never train: each config lands in the list."""
    configs = []

    class CapturingTrainer:
        def __init__(self, model, train_dataset, test_dataset, config):
            configs.append((config, len(train_dataset)))

        def train(self):
            raise ConfigCaptured

    monkeypatch.setattr(run.trainer, 'Trainer', CapturingTrainer)
    return configs


def test_each_phase_trains_with_the_handouts_schedule(real_data, tmp_path, captured_configs):
    """The values a course autograder checks, pinned for the real wiki.txt (2938 pieces):
    warm-up 512*20 tokens, final_tokens 200*2938*128 = 75,212,800 in every phase, and each
    phase's epochs, batch size and learning rate."""
    params = tmp_path / 'scratch.params'
    scratch = run.parse_args(['pretrain', 'vanilla', 'wiki.txt'])
    torch.save(run.build_model(scratch, run.load_pretrain_dataset(scratch)).state_dict(), params)
    out = str(tmp_path / 'out.params')
    commands = {
        'pretrain': ['pretrain', 'vanilla', 'wiki.txt', '--writing_params_path', out],
        'finetune': [
            'finetune',
            'vanilla',
            'wiki.txt',
            '--writing_params_path',
            out,
            '--finetune_corpus_path',
            'birth_places_train.tsv',
        ],
        'finetune from pretrained': [
            'finetune',
            'vanilla',
            'wiki.txt',
            '--reading_params_path',
            str(params),
            '--writing_params_path',
            out,
            '--finetune_corpus_path',
            'birth_places_train.tsv',
        ],
    }
    expected = {  # (max_epochs, batch_size, learning_rate, examples per epoch)
        'pretrain': (650, 128, 6e-3, 2938),
        'finetune': (75, 256, 6e-4, 2000),
        'finetune from pretrained': (10, 256, 6e-4, 2000),
    }
    for phase, argv in commands.items():
        args = run.parse_args(argv)
        run.check_args(args)
        with pytest.raises(ConfigCaptured):
            getattr(run, args.function)(args)
        config, examples = captured_configs.pop()
        assert (config.max_epochs, config.batch_size, config.learning_rate, examples) == expected[
            phase
        ], phase
        assert config.lr_decay is True, phase
        assert config.warmup_tokens == 10_240, phase
        assert config.final_tokens == 75_212_800, phase
        assert (config.betas, config.grad_norm_clip, config.weight_decay) == (
            (0.9, 0.95),
            1.0,
            0.1,
        ), phase


def test_same_seed_same_params_other_seed_other_params(tiny):
    def params(seed, name):
        assert (
            main(
                'pretrain',
                'synthesizer',
                'wiki.txt',
                '--writing_params_path',
                name,
                '--max_epochs',
                2,
                '--batch_size',
                16,
                '--seed',
                seed,
                cwd=tiny,
            )
            == 0
        )
        return torch.load(tiny / name, weights_only=True)

    a, b, c = params(7, 'a.params'), params(7, 'b.params'), params(8, 'c.params')
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a['head.weight'], c['head.weight'])


@pytest.mark.parametrize('precision', ['fp32', 'bf16'])
def test_the_same_command_in_separate_processes_gives_the_same_params(tiny, precision):
    """Each process lays out its memory differently; MKL's fp32 products (set up by
    cpu_libraries) and everything else must give the same bits all the same."""
    args = [
        'pretrain',
        'vanilla',
        'wiki.txt',
        '--max_epochs',
        6,
        '--batch_size',
        8,
        '--precision',
        precision,
    ]
    runs = []
    for i in range(3):
        cli(*args, '--writing_params_path', f'{i}.params', cwd=tiny)
        runs.append(torch.load(tiny / f'{i}.params', weights_only=True))
    for other in runs[1:]:
        assert all(torch.equal(runs[0][k], other[k]) for k in runs[0])


def test_params_are_written_before_the_state_is_removed(tiny, monkeypatch, capsys):
    """Ctrl-C while the finished run writes its params: the resumable state is still there,
    the message says so, and --resume ends with the params of an uninterrupted run."""
    args = [
        'pretrain',
        'vanilla',
        'wiki.txt',
        '--max_epochs',
        3,
        '--batch_size',
        8,
        '--precision',
        'fp32',
    ]
    assert main(*args, '--writing_params_path', 'straight.params', cwd=tiny) == 0
    monkeypatch.setattr(trainer.TrainerConfig, 'save_every_s', 0)  # a state after every epoch
    real_save = files.atomic_save

    def interrupted_writing_params(obj, path):
        if str(path).endswith('.params'):
            raise KeyboardInterrupt
        real_save(obj, path)

    monkeypatch.setattr(files, 'atomic_save', interrupted_writing_params)
    capsys.readouterr()
    assert main(*args, '--writing_params_path', 'resumed.params', cwd=tiny) == 130
    err = capsys.readouterr().err
    assert re.search(
        r'^interrupted; resumed.params.resume keeps the state saved at \d\d:\d\d:\d\d\. To continue '
        r'from it: python src/run.py pretrain .* --resume$',
        err.strip().splitlines()[-1],
    ), err
    monkeypatch.setattr(files, 'atomic_save', real_save)
    assert main(*args, '--writing_params_path', 'resumed.params', '--resume', cwd=tiny) == 0
    straight = torch.load(tiny / 'straight.params', weights_only=True)
    resumed = torch.load(tiny / 'resumed.params', weights_only=True)
    assert all(torch.equal(straight[k], resumed[k]) for k in straight)
    assert not (tiny / 'resumed.params.resume').exists()


def test_the_cpu_kernel_cache_cap_changes_no_result(tiny):
    """utils caps oneDNN's kernel cache to save memory: no cache at all (every bf16 matmul
    compiles its kernel again) and oneDNN's default give the same params."""

    def params(capacity):
        name = f'cache{capacity}.params'
        cli(
            'pretrain',
            'synthesizer',
            'wiki.txt',
            '--writing_params_path',
            name,
            '--max_epochs',
            2,
            '--batch_size',
            16,
            '--precision',
            'bf16',
            '--device',
            'cpu',
            cwd=tiny,
            env={**os.environ, 'ONEDNN_PRIMITIVE_CACHE_CAPACITY': str(capacity)},
        )
        return torch.load(tiny / name, weights_only=True)

    uncached, default = params(0), params(1024)
    assert all(torch.equal(uncached[k], default[k]) for k in default)


@pytest.mark.parametrize('signum', [signal.SIGINT, signal.SIGTERM])
def test_interrupted_cli_run_resumes_to_identical_params(tiny, signum):
    args = [
        'pretrain',
        'vanilla',
        'wiki.txt',
        '--max_epochs',
        12,
        '--batch_size',
        8,
        '--precision',
        'fp32',
    ]
    cli(*args, '--writing_params_path', 'straight.params', cwd=tiny)

    process = subprocess.Popen(
        [
            PYTHON,
            str(ROOT / 'src' / 'run.py'),
            *on_cpu(args),
            '--writing_params_path',
            'resumed.params',
        ],
        cwd=tiny,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    metrics = tiny / 'resumed.params.metrics.csv'
    deadline = time.time() + 60
    while (
        not (metrics.exists() and metrics.read_text().count('\n') >= 3) and time.time() < deadline
    ):
        time.sleep(0.05)
    process.send_signal(signum)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 130 and 'Traceback' not in err
    assert re.search(
        r'interrupted at epoch \d+, step \d+; state saved to resumed.params.resume. '
        r'To continue: python src/run.py pretrain .* --resume$',
        err.strip(),
    )
    assert not (tiny / 'resumed.params').exists() and (tiny / 'resumed.params.resume').exists()

    out = cli(*args, '--writing_params_path', 'resumed.params', '--resume', cwd=tiny).stdout
    assert 'resuming from resumed.params.resume' in out
    straight = torch.load(tiny / 'straight.params', weights_only=True)
    resumed = torch.load(tiny / 'resumed.params', weights_only=True)
    assert all(torch.equal(straight[k], resumed[k]) for k in straight)
    assert not (tiny / 'resumed.params.resume').exists()


def test_non_finite_loss_stops_and_keeps_last_good_state(tiny, monkeypatch, capsys):
    import model

    real = model.GPT.packed_loss
    calls = {'n': 0}

    def exploding(self, x, y, *rest):
        calls['n'] += 1
        loss = real(self, x, y, *rest)
        return loss * float('nan') if calls['n'] > 12 else loss

    monkeypatch.setattr(model.GPT, 'packed_loss', exploding)
    monkeypatch.setattr(run.trainer.TrainerConfig, 'save_every_s', 0)
    code = main(
        'pretrain',
        'vanilla',
        'wiki.txt',
        '--writing_params_path',
        'p.params',
        '--max_epochs',
        5,
        '--batch_size',
        4,
        cwd=tiny,
    )
    err = capsys.readouterr().err
    assert code == 3
    assert re.search(
        r'error: the loss became nan at epoch 2, step 13; stopped, the last good state '
        r'is kept in p.params.resume',
        err,
    )
    assert not (tiny / 'p.params').exists()
    state = torch.load(tiny / 'p.params.resume', weights_only=False)
    assert state['epoch'] == 1 and state['step'] == 0
    assert all(torch.isfinite(v).all() for v in state['model'].values())


def write(path, text, encoding='utf-8'):
    path.write_bytes(text.encode(encoding) if isinstance(text, str) else text)
    return path.name


BAD_INPUT = [
    # (what, argv after the phase+variant, files to write, expected message)
    (
        'missing corpus',
        ['nope.txt', '--writing_params_path', 'x.params'],
        {},
        r'^error: nope.txt: no such file',
    ),
    (
        'empty corpus',
        ['empty.txt', '--writing_params_path', 'x.params'],
        {'empty.txt': '\n'},
        r'^error: empty.txt: file is empty$',
    ),
    (
        'not UTF-8',
        ['latin.txt', '--writing_params_path', 'x.params'],
        {'latin.txt': b'ok\nbad \xe9\n'},
        r'^error: latin.txt, line 2: not valid UTF-8',
    ),
    (
        'reserved char',
        ['mask.txt', '--writing_params_path', 'x.params'],
        {'mask.txt': 'a\nb\u2047\n'},
        r'^error: mask.txt, line 2: contains',
    ),
    ('no writing path', ['wiki.txt'], {}, r'^error: pretrain needs --writing_params_path$'),
    (
        'output dir missing',
        ['wiki.txt', '--writing_params_path', 'no/such/dir/x.params'],
        {},
        r'^error: --writing_params_path no/such/dir/x.params: directory .* does not exist$',
    ),
    (
        'resume without state',
        ['wiki.txt', '--writing_params_path', 'x.params', '--resume'],
        {},
        r'^error: --resume: no saved state at x.params.resume',
    ),
]
FINETUNE_BAD = [
    (
        'no corpus flag',
        ['wiki.txt', '--writing_params_path', 'x.params'],
        {},
        r'^error: finetune needs --finetune_corpus_path$',
    ),
    (
        'line without tab',
        ['wiki.txt', '--writing_params_path', 'x.params', '--finetune_corpus_path', 'f.tsv'],
        {'f.tsv': 'Where was Ada born?\tLondon\nWhere was Max born? Oslo\n'},
        r'^error: .*f.tsv, line 2: expected .question<TAB>place. \(exactly one tab\), found 0 tabs$',
    ),
    (
        'two tabs',
        ['wiki.txt', '--writing_params_path', 'x.params', '--finetune_corpus_path', 'f.tsv'],
        {'f.tsv': 'Where was Ada born?\tLondon\tUK\n'},
        r'^error: .*f.tsv, line 1: .*found 2 tabs$',
    ),
    (
        'char outside vocabulary',
        ['wiki.txt', '--writing_params_path', 'x.params', '--finetune_corpus_path', 'f.tsv'],
        {'f.tsv': 'Where was Ada born?\tLondon\nWhere was Zed born?\tQuito\n'},
        r"^error: .*f.tsv, line 2: character 'Q' does not occur in the pretraining corpus$",
    ),
    (
        'too long',
        ['wiki.txt', '--writing_params_path', 'x.params', '--finetune_corpus_path', 'f.tsv'],
        {'f.tsv': 'Where was Ada born?\t' + 'London ' * 20 + '\n'},
        r'^error: .*f.tsv, line 1: .* fit in the block$',
    ),
]
EVALUATE_BAD = [
    (
        'no outputs flag',
        ['wiki.txt', '--reading_params_path', 'v.params', '--eval_corpus_path', 'dev.tsv'],
        {},
        r'^error: evaluate needs --outputs_path$',
    ),
    (
        'mixed eval file',
        [
            'wiki.txt',
            '--reading_params_path',
            'v.params',
            '--eval_corpus_path',
            'e.tsv',
            '--outputs_path',
            'o',
        ],
        {'e.tsv': 'Where was Ada born?\tLondon\nWhere was Max born?\n'},
        r'^error: .*e.tsv, line 2: expected question<TAB>place like line 1, found 0 tabs$',
    ),
    (
        'params missing',
        [
            'wiki.txt',
            '--reading_params_path',
            'gone.params',
            '--eval_corpus_path',
            'dev.tsv',
            '--outputs_path',
            'o',
        ],
        {},
        r'^error: --reading_params_path gone.params: no such file$',
    ),
    (
        'garbage params',
        [
            'wiki.txt',
            '--reading_params_path',
            'junk.params',
            '--eval_corpus_path',
            'dev.tsv',
            '--outputs_path',
            'o',
        ],
        {'junk.params': 'not a checkpoint'},
        r'^error: --reading_params_path junk.params: not a .params file',
    ),
    (
        'empty params',
        [
            'wiki.txt',
            '--reading_params_path',
            'empty.params',
            '--eval_corpus_path',
            'dev.tsv',
            '--outputs_path',
            'o',
        ],
        {'empty.params': b''},
        r'^error: --reading_params_path empty.params: not a .params file \(the file is empty or cut short\)$',
    ),
    (
        'synthesizer params to vanilla',
        [
            'wiki.txt',
            '--reading_params_path',
            's.params',
            '--eval_corpus_path',
            'dev.tsv',
            '--outputs_path',
            'o',
        ],
        {},
        r'^error: --reading_params_path s.params: holds a synthesizer model, but the variant is vanilla$',
    ),
    (
        'other vocabulary',
        [
            'other.txt',
            '--reading_params_path',
            'v.params',
            '--eval_corpus_path',
            'dev.tsv',
            '--outputs_path',
            'o',
        ],
        {'other.txt': 'abc Where was born?\n'},
        r'^error: --reading_params_path v.params: made for a vocabulary of \d+ symbols, but other.txt gives 16$',
    ),
]


@pytest.fixture
def params(tiny):
    """v.params and s.params: untrained models of each variant for the tiny corpus."""
    import dataset
    import model

    ds = dataset.CharCorruptionDataset((tiny / 'wiki.txt').read_text(encoding='utf-8'), 128)
    for name, synthesizer in (('v.params', False), ('s.params', True)):
        torch.manual_seed(0)
        gpt = model.GPT(
            model.GPTConfig(ds.vocab_size, 128, synthesizer=synthesizer, **run.MODEL_SIZE)
        )
        torch.save(gpt.state_dict(), tiny / name)
    return tiny


@pytest.mark.parametrize(
    'function, case',
    [('pretrain', c) for c in BAD_INPUT]
    + [('finetune', c) for c in FINETUNE_BAD]
    + [('evaluate', c) for c in EVALUATE_BAD],
    ids=lambda c: c[0] if isinstance(c, tuple) else c,
)
def test_bad_input_is_one_clear_line(params, capsys, function, case):
    _, argv, files, message = case
    for name, content in files.items():
        write(params / name, content)
    code = main(function, 'vanilla', *argv, cwd=params)
    err = capsys.readouterr().err
    assert code == 2
    assert len(err.strip().splitlines()) == 1, err
    assert re.search(message, err.strip()), err
    assert not (params / 'x.params').exists()


class CreatesFile:
    """Unpickling this runs code: here it creates a file; a crafted params file could do anything."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return exec, (f"open({self.path!r}, 'w').close()",)


@pytest.mark.parametrize('legacy_format', [False, True], ids=['zip', 'legacy'])
@pytest.mark.parametrize('how', ['evaluate', 'finetune', 'resume'])
def test_a_crafted_file_never_runs_code(tiny, capsys, how, legacy_format):
    marker = tiny / 'created-by-the-payload'
    crafted = tiny / ('x.params.resume' if how == 'resume' else 'crafted.params')
    torch.save(
        {'tok_emb.weight': torch.zeros(2, 2), 'payload': CreatesFile(marker)},
        crafted,
        _use_new_zipfile_serialization=not legacy_format,
    )
    argv = {
        'evaluate': [
            'evaluate',
            'vanilla',
            'wiki.txt',
            '--reading_params_path',
            'crafted.params',
            '--eval_corpus_path',
            'dev.tsv',
            '--outputs_path',
            'o',
        ],
        'finetune': [
            'finetune',
            'vanilla',
            'wiki.txt',
            '--reading_params_path',
            'crafted.params',
            '--writing_params_path',
            'x.params',
            '--finetune_corpus_path',
            'train.tsv',
        ],
        'resume': [
            'pretrain',
            'vanilla',
            'wiki.txt',
            '--writing_params_path',
            'x.params',
            '--resume',
        ],
    }[how]
    code = main(*argv, '--max_epochs', 1, cwd=tiny) if how != 'evaluate' else main(*argv, cwd=tiny)
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    flag = '--resume:' if how == 'resume' else '--reading_params_path'
    assert re.search(
        rf'^error: {flag} \S*{crafted.name}: refused: it holds code or objects \(exec\), .*'
        r'If you trust the file\b.* with: python -c ',
        err,
    ), err
    assert not marker.exists()
    assert not (tiny / 'x.params').exists() and not (tiny / 'o').exists()
    torch.load(crafted, weights_only=False)  # what the code did before: the payload runs
    assert marker.exists()


def tensors_to_list(state):
    return {**state, 'head.weight': state['head.weight'].tolist()}


def with_value(name, index, value):
    def change(state):
        changed = state[name].clone()
        changed.view(-1)[index] = value
        return {**state, name: changed}

    return change


MALFORMED_PARAMS = [
    # (what, state_dict -> what the file holds, expected message after "--reading_params_path F: ")
    (
        'a tensor',
        lambda s: s['head.weight'],
        r'holds a Tensor, not a state_dict \(a dict of named tensors\)$',
    ),
    ('a list', lambda s: list(s.values()), r'holds a list, not a state_dict'),
    ('empty', lambda s: {}, r'the state_dict is empty$'),
    ('a value not a tensor', tensors_to_list, r"'head.weight' is a list, not a tensor$"),
    (
        '1-D embedding',
        lambda s: {**s, 'tok_emb.weight': s['tok_emb.weight'][0]},
        r"does not fit a vanilla model with .* \('tok_emb.weight' has shape \(256,\), expected \(\d+, 256\)\)$",
    ),
    (
        '0-D embedding',
        lambda s: {**s, 'tok_emb.weight': torch.tensor(1.0)},
        r"does not fit .* \('tok_emb.weight' has shape \(\), expected \(\d+, 256\)\)$",
    ),
    (
        '3-D weight',
        lambda s: {**s, 'head.weight': s['head.weight'][None]},
        r"does not fit .* \('head.weight' has shape \(1, \d+, 256\), expected \(\d+, 256\)\)$",
    ),
    (
        'missing weight',
        lambda s: {k: v for k, v in s.items() if k != 'ln_f.bias'},
        r"does not fit .* \(no 'ln_f.bias'\)$",
    ),
    (
        'extra weight',
        lambda s: {**s, 'extra': torch.zeros(1)},
        r"does not fit .* \(unexpected 'extra'\)$",
    ),
    (
        'nan',
        with_value('head.weight', 5, float('nan')),
        r"'head.weight' has 1 non-finite value\(s\) \(inf or nan\), which turn every output they reach into nan$",
    ),
    (
        'inf',
        with_value('blocks.2.attn.proj.bias', 0, float('inf')),
        r"'blocks.2.attn.proj.bias' has 1 non-finite",
    ),
    (
        'an ndarray',
        lambda s: {**s, 'extra': np.zeros(2)},
        r'refused: it holds code or objects \(numpy\.\S+\), which are never loaded because loading them can '
        r'run code; only tensors and plain values are\. If you trust the file, keep only its tensors',
    ),
]


@pytest.mark.parametrize('function', ['evaluate', 'finetune'])
@pytest.mark.parametrize(
    'what, malform, message', MALFORMED_PARAMS, ids=[c[0] for c in MALFORMED_PARAMS]
)
def test_malformed_params_are_one_clear_line(params, capsys, function, what, malform, message):
    torch.save(malform(torch.load(params / 'v.params', weights_only=True)), params / 'bad.params')
    argv = (
        ['--eval_corpus_path', 'dev.tsv', '--outputs_path', 'o']
        if function == 'evaluate'
        else ['--writing_params_path', 'x.params', '--finetune_corpus_path', 'train.tsv']
    )
    code = main(
        function, 'vanilla', 'wiki.txt', '--reading_params_path', 'bad.params', *argv, cwd=params
    )
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert re.search(r'^error: --reading_params_path bad.params: ' + message, err.strip()), err
    assert not (params / 'o').exists() and not (params / 'x.params').exists()


def test_a_trusted_file_converts_with_the_printed_command(params, capsys):
    state = torch.load(params / 'v.params', weights_only=True)
    torch.save({**state, 'note': np.array([1.5])}, params / 'theirs.params')
    argv = [
        'evaluate',
        'vanilla',
        'wiki.txt',
        '--eval_corpus_path',
        'dev.tsv',
        '--outputs_path',
        'o',
    ]
    assert main(*argv, '--reading_params_path', 'theirs.params', cwd=params) == 2
    command = capsys.readouterr().err.strip().split(' with: ')[1]
    assert command.startswith('python -c ')
    subprocess.run(PYTHON + command[len('python') :], shell=True, cwd=params, check=True)
    assert main(*argv, '--reading_params_path', 'theirs.params.tensors', cwd=params) == 0
    assert 'Correct: ' in capsys.readouterr().out
    converted = torch.load(params / 'theirs.params.tensors', weights_only=True)
    assert converted.keys() == state.keys() and all(
        torch.equal(converted[k], state[k]) for k in state
    )


def test_loading_params_leaves_the_seeded_random_state_alone(params):
    """finetune seeds, builds the model, then loads the params: the check must not draw."""
    import dataset

    vocab_size = dataset.CharCorruptionDataset(
        (params / 'wiki.txt').read_text(encoding='utf-8'), 128
    ).vocab_size
    torch.manual_seed(0)
    before = torch.get_rng_state()
    state = run.load_params(str(params / 's.params'), 'synthesizer', vocab_size, 'wiki.txt')
    assert torch.equal(before, torch.get_rng_state())
    assert all(
        torch.equal(state[k], v)
        for k, v in torch.load(params / 's.params', weights_only=True).items()
    )


def test_bad_input_from_the_shell_has_no_traceback(tiny):
    result = cli(
        'evaluate',
        'vanilla',
        'wiki.txt',
        '--reading_params_path',
        'x',
        '--eval_corpus_path',
        'dev.tsv',
        cwd=tiny,
        check=False,
    )
    assert result.returncode == 2 and result.stderr == 'error: evaluate needs --outputs_path\n'
    result = cli(
        'pretrain',
        'vanilla',
        'wiki.txt',
        '--writing_params_path',
        'x',
        '--max_epochs',
        '0',
        cwd=tiny,
        check=False,
    )
    assert (
        result.returncode == 2 and 'argument --max_epochs: must be positive, not 0' in result.stderr
    )


def test_evaluate_handles_unknown_characters_and_long_questions(params, capsys):
    long_question = 'Where was ' + 'Ada ' * 40 + 'born?'
    write(
        params / 'odd.tsv',
        f'Where was \u00c5da born?\tLondon\n{long_question}\tParis\nWhere was Max born?\tRome\n',
    )
    assert (
        main(
            'evaluate',
            'vanilla',
            'wiki.txt',
            '--reading_params_path',
            'v.params',
            '--eval_corpus_path',
            'odd.tsv',
            '--outputs_path',
            'odd.out',
            cwd=params,
        )
        == 0
    )
    captured = capsys.readouterr()
    assert '1 question(s) contain characters outside the vocabulary' in captured.err
    assert '1 question(s) are too long for the context' in captured.err
    assert 'Correct: ' in captured.out and 'out of 3.0' in captured.out
    assert len((params / 'odd.out').read_text(encoding='utf-8').split('\n')) == 4


def test_evaluate_predictions_equal_plain_greedy_decoding(params):
    """The batched, cached decoding against the original loop: one question at a time,
    re-running the prefix for every character, prediction = text between the MASKs."""
    import dataset
    import model

    ds = dataset.CharCorruptionDataset((params / 'wiki.txt').read_text(encoding='utf-8'), 128)
    # a model trained for a few steps, so that it does produce MASKs
    assert (
        main(
            'finetune',
            'vanilla',
            'wiki.txt',
            '--writing_params_path',
            'f.params',
            '--finetune_corpus_path',
            'train.tsv',
            '--max_epochs',
            30,
            '--batch_size',
            4,
            '--finetune_lr',
            3e-3,
            cwd=params,
        )
        == 0
    )
    assert (
        main(
            'evaluate',
            'vanilla',
            'wiki.txt',
            '--reading_params_path',
            'f.params',
            '--eval_corpus_path',
            'train.tsv',
            '--outputs_path',
            'fast.out',
            cwd=params,
        )
        == 0
    )
    gpt = model.GPT(model.GPTConfig(ds.vocab_size, 128, **run.MODEL_SIZE))
    gpt.load_state_dict(torch.load(params / 'f.params', weights_only=True))
    expected = []
    for line in (params / 'train.tsv').read_text(encoding='utf-8').splitlines():
        x = line.split('\t')[0] + '\u2047'
        x = torch.tensor([ds.stoi[s] for s in x], dtype=torch.long)[None, ...]
        pred = utils.sample(gpt, x, 32, sample=False)[0]
        completion = ''.join([ds.itos[int(i)] for i in pred])
        expected.append(completion.split('\u2047')[1])
    assert (params / 'fast.out').read_text(encoding='utf-8').splitlines() == expected
    assert sum(p != '' for p in expected) >= 6  # the model does answer


def test_handout_commands_find_bare_names_in_data(real_data, tmp_path):
    out = cli(
        'finetune',
        'vanilla',
        'wiki.txt',
        '--writing_params_path',
        tmp_path / 'v.params',
        '--finetune_corpus_path',
        'birth_places_train.tsv',
        '--max_epochs',
        1,
        cwd=ROOT,
    ).stdout
    assert 'data has 418352 characters, 256 unique.' in out
    out = cli(
        'evaluate',
        'vanilla',
        'wiki.txt',
        '--reading_params_path',
        tmp_path / 'v.params',
        '--eval_corpus_path',
        'birth_dev.tsv',
        '--outputs_path',
        tmp_path / 'dev.predictions',
        cwd=ROOT,
    ).stdout
    assert CORRECT_LINE.search(out).group(2) == '500.0'
    assert len((tmp_path / 'dev.predictions').read_text(encoding='utf-8').splitlines()) == 500


def test_london_baseline(real_data):
    result = subprocess.run(
        [PYTHON, 'london_baseline.py'], cwd=ROOT, capture_output=True, text=True
    )
    assert result.returncode == 0
    assert result.stdout == 'Correct: 25.0 out of 500.0: 5.0%\n'


def test_london_baseline_counts_londons(tiny):
    sys.path.insert(0, str(ROOT))
    from london_baseline import london_baseline

    expected = sum(
        line.endswith('\tLondon') for line in (tiny / 'dev.tsv').read_text().splitlines()
    )
    assert london_baseline(str(tiny / 'dev.tsv')) == (4.0, float(expected))


def test_dataset_views(real_data):
    for view, marker in (('namedata', 'Where was'), ('charcorruption', '\u2047')):
        result = subprocess.run(
            [PYTHON, 'src/dataset.py', view],
            cwd=ROOT,
            capture_output=True,
            text=True,
            encoding='utf-8',
        )
        assert result.returncode == 0, result.stderr
        lines = result.stdout.splitlines()
        assert (
            sum(line.startswith('x: ') for line in lines) == 4
            and sum(line.startswith('y: ') for line in lines) == 4
        )
        assert all(marker in line for line in lines if line.startswith('x: '))


NINE = [
    'vanilla.model.params',
    'vanilla.nopretrain.dev.predictions',
    'vanilla.nopretrain.test.predictions',
    'vanilla.finetune.params',
    'vanilla.pretrain.dev.predictions',
    'vanilla.pretrain.test.predictions',
    'synthesizer.finetune.params',
    'synthesizer.pretrain.dev.predictions',
    'synthesizer.pretrain.test.predictions',
]


def test_collect_submission(tmp_path):
    shutil.copytree(ROOT / 'src', tmp_path / 'src', ignore=shutil.ignore_patterns('__pycache__'))
    shutil.copy(ROOT / 'collect_submission.sh', tmp_path)
    for name in NINE[:-1]:
        (tmp_path / name).write_text('x')
    result = subprocess.run(
        ['bash', 'collect_submission.sh'], cwd=tmp_path, capture_output=True, text=True
    )
    assert result.returncode != 0
    assert 'synthesizer.pretrain.test.predictions is missing' in result.stderr
    assert not (tmp_path / 'assignment5.zip').exists()

    (tmp_path / NINE[-1]).write_text('x')
    result = subprocess.run(
        ['bash', 'collect_submission.sh'], cwd=tmp_path, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    names = set(zipfile.ZipFile(tmp_path / 'assignment5.zip').namelist())
    assert set(NINE) <= names
    assert {
        'src/run.py',
        'src/model.py',
        'src/attention.py',
        'src/dataset.py',
        'src/trainer.py',
        'src/utils.py',
    } <= names


def test_environment_yml_agrees_with_requirements():
    requirements = (ROOT / 'requirements.txt').read_text().split()
    pip_section = (ROOT / 'environment.yml').read_text().split('- pip:')[1]
    assert re.findall(r'^\s+- (\S+)$', pip_section, re.M) == requirements
    assert 'torch==2.13.0' in requirements


def test_crlf_files_train_and_answer_as_lf_files(tiny, capsys):
    """Windows checkouts: CRLF files give the vocabulary, model and answers of LF files."""
    for name in ('wiki.txt', 'train.tsv', 'dev.tsv'):
        (tiny / f'crlf.{name}').write_bytes((tiny / name).read_bytes().replace(b'\n', b'\r\n'))
    outputs = []
    for prefix in ('', 'crlf.'):
        assert (
            main(
                'finetune',
                'vanilla',
                f'{prefix}wiki.txt',
                '--writing_params_path',
                f'{prefix}f.params',
                '--finetune_corpus_path',
                f'{prefix}train.tsv',
                '--max_epochs',
                1,
                '--precision',
                'fp32',
                cwd=tiny,
            )
            == 0
        )
        assert (
            main(
                'evaluate',
                'vanilla',
                f'{prefix}wiki.txt',
                '--reading_params_path',
                f'{prefix}f.params',
                '--eval_corpus_path',
                f'{prefix}dev.tsv',
                '--outputs_path',
                f'{prefix}dev.out',
                cwd=tiny,
            )
            == 0
        )
        outputs.append(capsys.readouterr().out)
    lf, crlf = (
        torch.load(tiny / 'f.params', weights_only=True),
        torch.load(tiny / 'crlf.f.params', weights_only=True),
    )
    assert all(torch.equal(lf[k], crlf[k]) for k in lf)
    assert (tiny / 'dev.out').read_bytes() == (tiny / 'crlf.dev.out').read_bytes()
    vocab = [re.search(r'data has \d+ characters, \d+ unique', out).group() for out in outputs]
    assert (
        vocab[0] == vocab[1]
        and CORRECT_LINE.search(outputs[0]).group() == CORRECT_LINE.search(outputs[1]).group()
    )


def test_dataset_view_runs_without_sigpipe(tiny, monkeypatch, capsys):
    """Windows has no signal.SIGPIPE; `python src/dataset.py namedata` must not need it."""
    import runpy

    import files

    shutil.copy(tiny / 'train.tsv', tiny / 'birth_places_train.tsv')
    monkeypatch.setattr(files, 'DATA_DIR', tiny)
    monkeypatch.delattr(signal, 'SIGPIPE')
    monkeypatch.setattr(sys, 'argv', ['dataset.py', 'namedata'])
    runpy.run_path(str(ROOT / 'src' / 'dataset.py'), run_name='__main__')
    lines = capsys.readouterr().out.splitlines()
    assert sum(line.startswith('x: Where was') for line in lines) == 4


@pytest.mark.parametrize(
    'capability, expected',
    [((6, 0), 'fp32'), ((7, 0), 'fp32'), ((7, 5), 'fp32'), ((8, 0), 'bf16'), ((9, 0), 'bf16')],
)
def test_auto_precision_is_bf16_only_where_native(monkeypatch, capability, expected):
    """P100, V100 and T4 emulate bf16, and torch.cuda.is_bf16_supported() says True there."""
    monkeypatch.setattr(torch.cuda, 'is_bf16_supported', lambda *a, **k: True)
    monkeypatch.setattr(torch.cuda, 'get_device_capability', lambda *a, **k: capability)
    assert devices.training_precision('auto', 'cuda') == expected
    assert (
        devices.training_precision('fp16', 'cuda') == 'fp16'
        and devices.training_precision('fp32', 'cuda') == 'fp32'
    )
    assert devices.training_precision('auto', 'mps') == 'fp32'
    for native in (True, False):
        monkeypatch.setattr(devices, 'cpu_has_native_bf16', lambda native=native: native)
        assert devices.training_precision('auto', 'cpu') == ('bf16' if native else 'fp32')


def test_missing_device_is_one_clear_line(tiny, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)
    monkeypatch.setattr(torch.backends.mps, 'is_available', lambda: False)
    for device in ('cuda', 'mps'):
        code = main(
            'pretrain',
            'vanilla',
            'wiki.txt',
            '--writing_params_path',
            'x.params',
            '--device',
            device,
            cwd=tiny,
        )
        assert code == 2 and capsys.readouterr().err.startswith(
            f'error: --device {device}: not available'
        )


def test_params_from_wrapped_or_gpu_models_load_as_plain_ones(params, monkeypatch):
    """DataParallel/DDP ('module.'), torch.compile ('_orig_mod.') and both; and a file
    whose tensors were saved from a GPU (their storage says cuda:0)."""
    plain = torch.load(params / 'v.params', weights_only=True)
    for name, prefix in (
        ('dp', 'module.'),
        ('compiled', '_orig_mod.'),
        ('both', 'module._orig_mod.'),
    ):
        torch.save({prefix + k: v for k, v in plain.items()}, params / f'{name}.params')
    with monkeypatch.context() as m:
        m.setattr(torch.serialization, 'location_tag', lambda storage: 'cuda:0')
        torch.save(plain, params / 'gpu.params')
    if not torch.cuda.is_available():  # the file does hold CUDA storages
        with pytest.raises(RuntimeError, match='CUDA'):
            torch.load(params / 'gpu.params', weights_only=True)
    for name in ('dp', 'compiled', 'both', 'gpu'):
        loaded = run.load_params(
            str(params / f'{name}.params'), 'vanilla', len(plain['tok_emb.weight']), 'wiki.txt'
        )
        assert loaded.keys() == plain.keys() and all(
            torch.equal(loaded[k], plain[k]) for k in plain
        )
    assert (
        main(
            'finetune',
            'vanilla',
            'wiki.txt',
            '--reading_params_path',
            'both.params',
            '--writing_params_path',
            'f.params',
            '--finetune_corpus_path',
            'train.tsv',
            '--max_epochs',
            1,
            '--precision',
            'fp32',
            cwd=params,
        )
        == 0
    )
