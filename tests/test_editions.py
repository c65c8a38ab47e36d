"""The later editions from the command line: the perceiver (2023) and rope (2024/25)
commands as their handouts print them, each edition's settings, TensorBoard logs, the
submission packing of each edition (their bad input is in test_checks.py)."""

import subprocess
import zipfile

import pytest
import torch

import reproduce
import run
import trainer
from machinery import params_files
from test_metrics import tensorboard_scalars
from test_run import CORRECT_LINE, main, submission_folder

QUICK = ['--max_epochs', 1, '--batch_size', 16]


@pytest.mark.parametrize(
    'variant, flags, folder',
    [
        pytest.param(
            'perceiver',
            ['--bottleneck_dim', 64],
            'run_perceiver_64_pt_lr_0.006000_ft_lr_0.000600',
            marks=pytest.mark.slow,
        ),
        ('rope', [], 'run_rope_pt_lr_0.006000_ft_lr_0.000600'),
    ],
)
def test_handout_pipeline_with_tensorboard(tiny, capsys, variant, flags, folder):
    assert (
        main(
            'pretrain',
            variant,
            'wiki.txt',
            '--writing_params_path',
            f'{variant}.pretrain.params',
            '--pretrain_lr',
            6e-3,
            *flags,
            *QUICK,
            cwd=tiny,
        )
        == 0
    )
    assert (
        main(
            'finetune',
            variant,
            'wiki.txt',
            '--reading_params_path',
            f'{variant}.pretrain.params',
            '--writing_params_path',
            f'{variant}.finetune.params',
            '--finetune_corpus_path',
            'train.tsv',
            *flags,
            *QUICK,
            cwd=tiny,
        )
        == 0
    )
    assert (
        main(
            'evaluate',
            variant,
            'wiki.txt',
            '--reading_params_path',
            f'{variant}.finetune.params',
            '--eval_corpus_path',
            'dev.tsv',
            '--outputs_path',
            'dev.predictions',
            *flags,
            cwd=tiny,
        )
        == 0
    )
    out = capsys.readouterr().out
    assert CORRECT_LINE.search(out).group(2) == '4.0'
    edition = {'perceiver': '2023', 'rope': '2024'}[variant]
    assert (
        f'finetune from pretrained: 1 epochs, batch 16, lr 0.0006, {edition} edition settings'
        in out
    )
    state = torch.load(tiny / f'{variant}.finetune.params', weights_only=True)
    assert params_files.params_variant(state) == variant
    steps = {'pretrain': 3, 'finetune': 1}  # 36 lines of wiki.txt, 12 of train.tsv, batch 16
    for function, n in steps.items():
        scalars = tensorboard_scalars(tiny / 'expt' / function / folder)
        assert [s for s, _ in scalars['train/loss']] == list(range(1, n + 1))
        assert [s for s, _ in scalars['train/lr']] == list(range(1, n + 1))
        csv = (tiny / f'{variant}.{function}.params.metrics.csv').read_text().splitlines()[1:]
        # the same losses: TensorBoard keeps float32 (6e-8 relative), the CSV 6 decimals
        csv_losses = [float(r.split(',')[2]) for r in csv]
        assert [v for _, v in scalars['train/loss']] == pytest.approx(csv_losses, rel=0, abs=1e-6)


class Captured(Exception):
    pass


def training_settings(tiny, monkeypatch, *argv):
    """(TrainerConfig, length of the training examples) that `run.py argv` would train with."""

    def capture(self):
        raise Captured(self.config, len(self.train_dataset[0][0]), len(self.train_dataset))

    monkeypatch.setattr(trainer.Trainer, 'train', capture)
    monkeypatch.chdir(tiny)
    args = run.parse_args([str(a) for a in argv])
    run.check_args(args)
    with pytest.raises(Captured) as caught:
        {'pretrain': run.pretrain, 'finetune': run.finetune}[args.function](args)
    config, length, n = caught.value.args
    return config, length, n


@pytest.mark.parametrize(
    'variant, edition, schedule_epochs, length',
    [
        ('vanilla', None, 200, 127),
        ('synthesizer', None, 200, 127),
        ('perceiver', None, 200, 127),
        ('rope', None, 650, 128),
        ('vanilla', '2024', 650, 128),
        ('vanilla', '2025', 650, 128),
        ('rope', '2021', 200, 127),
        ('perceiver', '2024', 650, 128),
    ],
)
def test_each_edition_settings(tiny, monkeypatch, variant, edition, schedule_epochs, length):
    argv = ['pretrain', variant, 'wiki.txt', '--writing_params_path', 'p.params'] + (
        ['--edition', edition] if edition else []
    )
    config, x_length, n = training_settings(tiny, monkeypatch, *argv)
    assert x_length == length
    assert config.final_tokens == schedule_epochs * n * 128
    assert (config.max_epochs, config.batch_size, config.learning_rate) == (650, 128, 6e-3)
    assert config.warmup_tokens == 512 * 20
    # finetuning is the same in every edition: 200 epochs' tokens of the pretraining corpus
    argv = [
        'finetune',
        variant,
        'wiki.txt',
        '--writing_params_path',
        'f.params',
        '--finetune_corpus_path',
        'train.tsv',
        '--finetune_lr',
        1e-3,
    ] + (['--edition', edition] if edition else [])
    config, x_length, _ = training_settings(tiny, monkeypatch, *argv)
    assert x_length == 127 and config.learning_rate == 1e-3 and config.max_epochs == 75
    assert config.final_tokens == 200 * n * 128


def test_reproduce_runs_each_editions_commands(tmp_path):
    def commands(edition):
        return [
            ' '.join(argv[:2])
            + (
                ' ' + ' '.join(argv[argv.index('--bottleneck_dim') :][:2])
                if '--bottleneck_dim' in argv
                else ''
            )
            for _, argv, _ in reproduce.phases(str(tmp_path), edition)
        ]

    assert commands('2021') == ['finetune vanilla', 'evaluate vanilla', 'evaluate vanilla'] + [
        'pretrain vanilla',
        'finetune vanilla',
        'evaluate vanilla',
        'evaluate vanilla',
    ] + [
        'pretrain synthesizer',
        'finetune synthesizer',
        'evaluate synthesizer',
        'evaluate synthesizer',
    ]
    assert commands('2023')[-4:] == [
        'pretrain perceiver --bottleneck_dim 64',
        'finetune perceiver --bottleneck_dim 64',
        'evaluate perceiver --bottleneck_dim 64',
        'evaluate perceiver --bottleneck_dim 64',
    ]
    assert commands('2024')[-4:] == [
        'pretrain rope',
        'finetune rope',
        'evaluate rope',
        'evaluate rope',
    ]
    assert all(
        argv[argv.index('--edition') + 1] == '2024'
        for _, argv, _ in reproduce.phases(str(tmp_path), '2024')
    )


ROPE_SUBMISSION = [
    'vanilla.model.params',
    'vanilla.nopretrain.dev.predictions',
    'vanilla.nopretrain.test.predictions',
    'vanilla.finetune.params',
    'vanilla.pretrain.dev.predictions',
    'vanilla.pretrain.test.predictions',
    'rope.finetune.params',
    'rope.pretrain.dev.predictions',
    'rope.pretrain.test.predictions',
    'london_baseline_accuracy.txt',
]


def test_collect_submission_2024(tmp_path, real_data):
    submission_folder(tmp_path, ROPE_SUBMISSION[:-1])
    result = subprocess.run(
        ['bash', 'collect_submission.sh', '2024'], cwd=tmp_path, capture_output=True, text=True
    )
    assert result.returncode != 0 and 'london_baseline_accuracy.txt is missing' in result.stderr
    result = subprocess.run(
        [run.sys.executable, 'london_baseline.py', str(real_data / 'birth_dev.tsv')],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert (
        result.returncode == 0
        and (tmp_path / 'london_baseline_accuracy.txt').read_text() == '5.0\n'
    )
    result = subprocess.run(
        ['bash', 'collect_submission.sh', '2024'], cwd=tmp_path, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    names = set(zipfile.ZipFile(tmp_path / 'assignment4_submission.zip').namelist())
    assert set(ROPE_SUBMISSION) <= names and 'src/attention.py' in names
    assert not any('synthesizer' in n for n in names)


def test_2024_span_corruption_examples_are_one_longer():
    import random

    import dataset
    from conftest import tiny_corpus

    text = tiny_corpus()[0]
    ours, later = (
        dataset.CharCorruptionDataset(text, 128),
        dataset.CharCorruptionDataset(text, 128, 129),
    )
    for i in range(len(ours)):
        random.seed(i)
        x, y = ours[i]
        random.seed(i)
        x_later, y_later = later[i]
        assert len(x) == len(y) == 127 and len(x_later) == len(y_later) == 128
        # the same string, one PAD longer
        assert torch.equal(x_later[:127], x) and torch.equal(y_later[:127], y) and y_later[127] == 0
