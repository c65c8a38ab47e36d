"""run.py end to end, as a student runs it, on a tiny corpus: the handout's settings,
seeds, interruptions and resuming from the shell, non-finite losses; and the scripts
around it (london_baseline.py, collect_submission.sh, dataset.py's views)."""

import re
import shutil
import signal
import subprocess
import sys
import zipfile

import pytest
import torch

import run
import trainer
from conftest import CORRECT_LINE, PYTHON, ROOT, cli, main
from machinery import files


@pytest.mark.parametrize('variant', ['vanilla', 'synthesizer'])
@pytest.mark.slow
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
        'vanilla.params',
        '--finetune_corpus_path',
        'train.tsv',
        '--max_epochs',
        1,
        cwd=tiny,
    ).stdout
    assert 'finetune: 1 epochs, batch 256, lr 0.0006' in out
    assert re.search(
        r'finetune done: 1 steps in .*final loss [\d.]+; params written to vanilla.params', out
    )
    assert (tiny / 'vanilla.params.metrics.csv').read_text().count('\n') == 2


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


def test_a_finetune_lr_given_overrides_the_rate_the_phase_writes(tmp_path):
    """--finetune_lr, when given, is the rate finetuning trains at even where the phase's
    code writes the handout's 6e-4 (as the 2021 handout has it); not given, the phase's
    own rate stands, whatever it is."""
    common = ['finetune', 'vanilla', 'wiki.txt', '--writing_params_path', 'x.params']
    for argv, expected in (([], 5e-4), (['--finetune_lr', '3e-3'], 3e-3)):
        config = trainer.TrainerConfig(learning_rate=5e-4)
        run.add_settings(config, run.parse_args(common + argv), 'cpu')
        assert config.learning_rate == expected, argv
    config = trainer.TrainerConfig(learning_rate=6e-3)
    pretrain = ['pretrain', *common[1:], '--finetune_lr', '3e-3']
    run.add_settings(config, run.parse_args(pretrain), 'cpu')
    assert config.learning_rate == 6e-3


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
                1,
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


def test_params_are_written_before_the_state_is_removed(tiny, monkeypatch, capsys):
    """Ctrl-C while the finished run writes its params: the resumable state is still there,
    the message says so, and --resume ends with the params of an uninterrupted run."""
    args = [
        'pretrain',
        'vanilla',
        'wiki.txt',
        '--max_epochs',
        2,
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


@pytest.mark.slow
def test_save_every_writes_the_params_a_shorter_run_ends_with(tiny, monkeypatch):
    """--save_every 2 of a 4-epoch run writes after epochs 2 and 4; the schedule does not
    depend on max_epochs, so epoch 2's file equals a 2-epoch run's params, and epoch 4's
    the run's own. A run interrupted after epoch 3 and resumed writes the same epoch 4."""
    args = ['pretrain', 'vanilla', 'wiki.txt', '--batch_size', 8, '--precision', 'fp32']
    assert main(*args, '--max_epochs', 2, '--writing_params_path', 'two.params', cwd=tiny) == 0
    assert main(*args, '--max_epochs', 4, '--save_every', 2, '--writing_params_path',
                'four.params', cwd=tiny) == 0  # fmt: skip
    load = lambda name: torch.load(tiny / name, weights_only=True)
    written = sorted(p.name for p in tiny.glob('four.*params'))
    assert written == ['four.epoch2.params', 'four.epoch4.params', 'four.params']
    for checkpoint, params in (('four.epoch2.params', 'two.params'), ('four.epoch4.params',
                               'four.params')):  # fmt: skip
        a, b = load(checkpoint), load(params)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), checkpoint

    monkeypatch.setattr(trainer.TrainerConfig, 'save_every_s', 0)  # a state after every epoch
    real_save_state = trainer.Trainer.save_state

    def stop_after_epoch_3(self):
        real_save_state(self)
        if self.epoch == 3:
            raise KeyboardInterrupt

    monkeypatch.setattr(trainer.Trainer, 'save_state', stop_after_epoch_3)
    resumed = [*args, '--max_epochs', 4, '--save_every', 2, '--writing_params_path', 'r.params']
    assert main(*resumed, cwd=tiny) == 130
    assert sorted(p.name for p in tiny.glob('r.*params')) == ['r.epoch2.params']
    monkeypatch.setattr(trainer.Trainer, 'save_state', real_save_state)
    assert main(*resumed, '--resume', cwd=tiny) == 0
    a, b = load('r.epoch4.params'), load('four.epoch4.params')
    assert all(torch.equal(a[k], b[k]) for k in a)
    evaluate = ['evaluate', 'vanilla', 'wiki.txt', '--reading_params_path', 'four.params',
                '--eval_corpus_path', 'dev.tsv', '--outputs_path', 'dev.predictions']  # fmt: skip
    assert main(*evaluate, cwd=tiny) == 0
    assert main(*evaluate, '--save_every', 2, cwd=tiny) == 2


def test_checkpoint_path_sorts_by_epoch():
    assert run.checkpoint_path('out/v.pretrain.params', 650).format(epoch=50) == (
        'out/v.pretrain.epoch050.params'
    )
    assert run.checkpoint_path('v.model', 10).format(epoch=3) == 'v.model.epoch03'


def test_non_finite_loss_stops_and_keeps_last_good_state(tiny, monkeypatch, capsys):
    import model

    real = model.GPT.forward
    calls = {'n': 0}

    def exploding(self, *args, **kwargs):
        calls['n'] += 1
        logits, loss = real(self, *args, **kwargs)
        return logits, loss * float('nan') if calls['n'] > 12 else loss

    monkeypatch.setattr(model.GPT, 'forward', exploding)
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


@pytest.mark.slow
def test_handout_commands_find_bare_names_in_data(real_data, tmp_path):
    out = cli(
        'finetune',
        'vanilla',
        'wiki.txt',
        '--writing_params_path',
        tmp_path / 'vanilla.params',
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
        tmp_path / 'vanilla.params',
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


def submission_folder(folder, results):
    """A copy of src/, collect_submission.sh and london_baseline.py, and these results."""
    shutil.copytree(ROOT / 'src', folder / 'src', ignore=shutil.ignore_patterns('__pycache__'))
    shutil.copy(ROOT / 'collect_submission.sh', folder)
    shutil.copy(ROOT / 'london_baseline.py', folder)
    for name in results:
        (folder / name).write_text('x')


def test_collect_submission(tmp_path):
    submission_folder(tmp_path, NINE[:-1])
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
        'london_baseline.py',
    } <= names


def test_collect_submission_without_zip_gives_the_python_command(tmp_path):
    """Git Bash on Windows has no zip: one line, whose Python command makes the archive."""
    submission_folder(tmp_path, NINE)
    tools = tmp_path / 'bin'  # a PATH with bash and dirname alone
    tools.mkdir()
    for tool in ('bash', 'dirname'):
        (tools / tool).symlink_to(shutil.which(tool))
    result = subprocess.run(
        [str(tools / 'bash'), 'collect_submission.sh'],
        cwd=tmp_path,
        env={'PATH': str(tools)},
        capture_output=True,
        text=True,
    )
    assert result.returncode == 1
    (line,) = result.stderr.splitlines()
    command = line.split('make the archive with: ')[1].split()
    assert command[:4] == ['python', '-m', 'zipfile', '-c']
    subprocess.run([sys.executable, *command[1:]], cwd=tmp_path, check=True)
    names = set(zipfile.ZipFile(tmp_path / 'assignment5.zip').namelist())
    assert set(NINE) <= names and 'src/run.py' in names and 'london_baseline.py' in names


def test_environment_yml_agrees_with_requirements():
    lines = (ROOT / 'requirements.txt').read_text().splitlines()
    requirements = [line for line in lines if line and not line.startswith('#')]
    environment = (ROOT / 'environment.yml').read_text()
    pip_section = environment.split('- pip:')[1]
    assert re.findall(r'^\s+- (\S+)$', pip_section, re.M) == requirements
    optional = 'optional: submitit, for research/grid.py --cluster slurm'  # named, not installed
    assert f'# {optional} (pip install submitit)' in lines and f'# {optional}\n' in pip_section
    assert 'torch>=2.8,<2.16' in requirements  # a range: pip keeps a torch already in it
    assert (ROOT / '.ci' / 'constraints.txt').read_text().split() == ['torch==2.13.0']


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

    shutil.copy(tiny / 'train.tsv', tiny / 'birth_places_train.tsv')
    monkeypatch.chdir(tiny)  # the files named there are used as they are
    monkeypatch.delattr(signal, 'SIGPIPE')
    monkeypatch.setattr(sys, 'argv', ['dataset.py', 'namedata'])
    runpy.run_path(str(ROOT / 'src' / 'dataset.py'), run_name='__main__')
    lines = capsys.readouterr().out.splitlines()
    assert sum(line.startswith('x: Where was') for line in lines) == 4
