"""Bad input, caught before any work (checks.py, with params_files.py and devices.py):
each case is one clear line on stderr naming the flag, file or line, and exit code 2."""

import importlib
import random
import re

import pytest
import torch

from conftest import cli, main, write

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
        ['wiki.txt', '--reading_params_path', 'vanilla.params', '--eval_corpus_path', 'dev.tsv'],
        {},
        r'^error: evaluate needs --outputs_path$',
    ),
    (
        'mixed eval file',
        [
            'wiki.txt',
            '--reading_params_path',
            'vanilla.params',
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
            'synthesizer.params',
            '--eval_corpus_path',
            'dev.tsv',
            '--outputs_path',
            'o',
        ],
        {},
        r'^error: --reading_params_path synthesizer.params: holds a synthesizer model, but the variant is vanilla$',
    ),
    (
        'other vocabulary',
        [
            'other.txt',
            '--reading_params_path',
            'vanilla.params',
            '--eval_corpus_path',
            'dev.tsv',
            '--outputs_path',
            'o',
        ],
        {'other.txt': 'abc Where was born?\n'},
        r'^error: --reading_params_path vanilla.params: made for a vocabulary of \d+ symbols, but other.txt gives 16$',
    ),
]


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


EVALUATE = ['--eval_corpus_path', 'dev.tsv', '--outputs_path', 'o']
LATER_EDITIONS_BAD = [
    # (the whole argv, expected message): the perceiver's and rope's flags and params
    (
        [
            'pretrain',
            'perceiver',
            'wiki.txt',
            '--writing_params_path',
            'x.params',
            '--bottleneck_dim',
            0,
        ],
        r'^error: --bottleneck_dim 0: must be between 1 and the block size, 128$',
    ),
    (
        [
            'pretrain',
            'perceiver',
            'wiki.txt',
            '--writing_params_path',
            'x.params',
            '--bottleneck_dim',
            -3,
        ],
        r'^error: --bottleneck_dim -3: must be between 1 and the block size, 128$',
    ),
    (
        [
            'pretrain',
            'perceiver',
            'wiki.txt',
            '--writing_params_path',
            'x.params',
            '--bottleneck_dim',
            129,
        ],
        r'^error: --bottleneck_dim 129: must be between 1 and the block size, 128$',
    ),
    (
        [
            'pretrain',
            'synthesizer',
            'wiki.txt',
            '--writing_params_path',
            'x.params',
            '--edition',
            '2024',
        ],
        r"^error: --edition 2024: its 128-long pretraining examples do not fit the synthesizer's 127 positions$",
    ),
    (
        ['evaluate', 'vanilla', 'wiki.txt', '--reading_params_path', 'rope.params', *EVALUATE],
        r'^error: --reading_params_path rope.params: holds a rope model, but the variant is vanilla$',
    ),
    (
        ['evaluate', 'rope', 'wiki.txt', '--reading_params_path', 'vanilla.params', *EVALUATE],
        r'^error: --reading_params_path vanilla.params: holds a vanilla model, but the variant is rope$',
    ),
    (
        [
            'evaluate',
            'rope',
            'wiki.txt',
            '--reading_params_path',
            'perceiver.params',
            *EVALUATE,
        ],
        r'^error: --reading_params_path perceiver.params: holds a perceiver model, but the variant is rope$',
    ),
    (
        [
            'evaluate',
            'perceiver',
            'wiki.txt',
            '--reading_params_path',
            'perceiver.params',
            *EVALUATE,
        ],
        r'^error: --reading_params_path perceiver.params: made with --bottleneck_dim 64, but the flag is 32$',
    ),
    (
        [
            'finetune',
            'perceiver',
            'wiki.txt',
            '--reading_params_path',
            'perceiver.params',
            '--writing_params_path',
            'x.params',
            '--finetune_corpus_path',
            'train.tsv',
            '--bottleneck_dim',
            16,
        ],
        r'^error: --reading_params_path perceiver.params: made with --bottleneck_dim 64, but the flag is 16$',
    ),
]


# (the whole argv, expected message): --finetune_method and its flags
FINETUNE_FROM = (
    'finetune vanilla wiki.txt --writing_params_path x.params --finetune_corpus_path train.tsv'
)
FINETUNE_METHOD_BAD = [
    (
        f'{FINETUNE_FROM} --finetune_method lora',
        r'^error: --finetune_method lora trains a few new weights on a frozen pretrained '
        r'model: it needs --reading_params_path$',
    ),
    (
        f'{FINETUNE_FROM} --reading_params_path vanilla.params --lora_rank 4',
        r'^error: --lora_rank applies to --finetune_method lora only$',
    ),
    (
        f'{FINETUNE_FROM} --reading_params_path vanilla.params --finetune_method lora --adapter_size 8',
        r'^error: --adapter_size applies to --finetune_method adapter only$',
    ),
    (
        'evaluate vanilla wiki.txt --reading_params_path vanilla.params --eval_corpus_path dev.tsv '
        '--outputs_path o --finetune_method adapter',
        r'^error: --finetune_method adapter applies to finetune only$',
    ),
    (
        'pretrain vanilla wiki.txt --writing_params_path x.params --finetune_method lora',
        r'^error: --finetune_method lora applies to finetune only$',
    ),
]


def bad_input_cases():
    for function, cases in (
        ('pretrain', BAD_INPUT),
        ('finetune', FINETUNE_BAD),
        ('evaluate', EVALUATE_BAD),
    ):
        for what, argv, inputs, message in cases:
            yield pytest.param(
                [function, 'vanilla', *argv], inputs, message, id=f'{function}: {what}'
            )
    for command, message in FINETUNE_METHOD_BAD:
        argv = command.split()
        yield pytest.param(argv, {}, message, id=' '.join(argv[:2] + argv[-2:]))
    for argv, message in LATER_EDITIONS_BAD:
        yield pytest.param(argv, {}, message, id=' '.join(map(str, argv[:2] + argv[-1:])))


@pytest.mark.parametrize('argv, inputs, message', list(bad_input_cases()))
def test_bad_input_is_one_clear_line(params, capsys, argv, inputs, message):
    """Nothing runs: one line names the flag, file or line at fault, and the exit code is 2."""
    for name, content in inputs.items():
        write(params / name, content)
    code = main(*argv, cwd=params)
    err = capsys.readouterr().err
    assert code == 2
    assert len(err.strip().splitlines()) == 1, err
    assert re.search(message, err.strip()), err
    assert not (params / 'x.params').exists()


# Each research tool with inputs that do not exist: where it writes is checked first.
REPORT_TOOLS = [
    ('analyze', ['none.predictions', '--json']),
    ('analyze', ['a.json', 'b.json', '--exposure_plot']),
    ('cloze', ['none.params', '--json']),
    ('exposure', ['--json']),
    ('exposure', ['--ledger']),
    ('linear_probes', ['none.params', '--exposure', 'none.json', '--json']),
    ('known_unknown', ['no-grid', '--json']),
    ('over_pretraining', ['none.json', '--plot']),
    ('grid', ['--pretrained', 'none.params', '--plot']),
]


@pytest.mark.parametrize('tool, argv', REPORT_TOOLS, ids=[f'{t} {a[-1]}' for t, a in REPORT_TOOLS])
def test_research_tools_check_where_they_write_before_any_work(tmp_path, capsys, tool, argv):
    """An output that cannot be written (here a directory) is one line naming its flag,
    before the inputs are read: no analysis dies at its end for want of its report's path."""
    with pytest.raises(SystemExit) as stop:
        importlib.import_module(tool).main([*argv, str(tmp_path)])
    err = capsys.readouterr().err
    assert stop.value.code == 2
    assert err == f"error: {argv[-1]} {tmp_path}: is a directory\n"


class EmptyLineFails:
    """A span corruption that cannot take an empty line, as some students' cannot."""

    def __init__(self, lines):
        self.data = lines

    def __len__(self):
        return len(self.data)

    def __getitem__(self, idx):
        return random.randrange(0, len(self.data[idx]))  # ValueError for ''


def test_an_example_the_dataset_cannot_build_stops_the_run_before_training():
    """checks.check_examples builds each example once, as an epoch will, and puts the
    random states back: the run draws what it would have drawn."""
    from machinery import checks, files

    random.seed(1)
    expected = [random.random() for _ in range(3)]
    random.seed(1)
    checks.check_examples(EmptyLineFails(['a line', 'another']))
    assert [random.random() for _ in range(3)] == expected
    with pytest.raises(files.UserError) as caught:
        checks.check_examples(EmptyLineFails(['a line', 'another', '']))
    message = str(caught.value)
    assert message.startswith("EmptyLineFails[2] (the line '') raised ValueError: empty range")
    assert re.search(
        r'\(tests/test_checks\.py:\d+\); each epoch builds an example of every line$', message
    )


def test_the_trainer_checks_every_example_before_its_first_step():
    import trainer
    from machinery import files
    from test_trainer import tiny_setup

    gpt, _, config = tiny_setup()
    before = {n: p.clone() for n, p in gpt.state_dict().items()}
    run = trainer.Trainer(gpt, EmptyLineFails(['a line', '']), None, config)
    with pytest.raises(files.UserError, match=r"^EmptyLineFails\[1\] \(the line ''\) raised"):
        run.train()
    assert run.steps_run == 0
    assert all(torch.equal(p, before[n]) for n, p in gpt.state_dict().items())
