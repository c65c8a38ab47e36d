"""params_files.py: a params file is loaded only if it holds tensors and plain values
(nothing in it runs), fits the model, and is finite; wrapped models' names load as plain
ones; every problem is one line."""

import re
import subprocess

import numpy as np
import pytest
import torch

import run
from conftest import PYTHON, main
from machinery import files, finetune_methods, params_files


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
    torch.save(
        malform(torch.load(params / 'vanilla.params', weights_only=True)), params / 'bad.params'
    )
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
    state = torch.load(params / 'vanilla.params', weights_only=True)
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


def test_params_load_in_one_call_into_the_model_they_are_checked_against(params):
    """One call reads the file, checks it against the model's state_dict and loads it; the
    adapters a file holds are added to the model first."""
    plain = torch.load(params / 'vanilla.params', weights_only=True)
    gpt = run.new_model('vanilla', len(plain['tok_emb.weight']))
    state = params_files.load_params(
        str(params / 'vanilla.params'), gpt, 'wiki.txt', run.model_name('vanilla')
    )
    assert all(torch.equal(state[k], plain[k]) and torch.equal(gpt.state_dict()[k], plain[k])
               for k in plain)  # fmt: skip
    finetune_methods.add_adapters(gpt, 4)
    torch.save(gpt.state_dict(), params / 'adapters.params')
    fresh = run.new_model('vanilla', len(plain['tok_emb.weight']))
    params_files.load_params(
        str(params / 'adapters.params'), fresh, 'wiki.txt', run.model_name('vanilla')
    )
    assert finetune_methods.adapter_size(fresh.state_dict()) == 4


def test_checking_params_leaves_the_seeded_random_state_alone(params, monkeypatch):
    """check_args loads the params (here with adapters) into a model built for the check:
    building it must not draw from a seeded random state. The phase gets what it read."""
    state = torch.load(params / 'synthesizer.params', weights_only=True)
    gpt = run.new_model('synthesizer', len(state['tok_emb.weight']))
    finetune_methods.add_adapters(gpt, 4)
    torch.save(gpt.state_dict(), params / 'adapters.params')
    monkeypatch.chdir(params)
    args = run.parse_args(
        ['evaluate', 'synthesizer', 'wiki.txt', '--reading_params_path', 'adapters.params',
         '--eval_corpus_path', 'dev.tsv', '--outputs_path', 'o', '--device', 'cpu']
    )  # fmt: skip
    torch.manual_seed(0)
    before = torch.get_rng_state()
    run.check_args(args)
    assert torch.equal(before, torch.get_rng_state())
    assert all(torch.equal(args.reading_state[k], v) for k, v in gpt.state_dict().items())


def test_params_from_wrapped_or_gpu_models_load_as_plain_ones(params, monkeypatch):
    """DataParallel/DDP ('module.'), torch.compile ('_orig_mod.') and both; and a file
    whose tensors were saved from a GPU (their storage says cuda:0)."""
    plain = torch.load(params / 'vanilla.params', weights_only=True)
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
        gpt = run.new_model('vanilla', len(plain['tok_emb.weight']))
        loaded = params_files.load_params(
            str(params / f'{name}.params'), gpt, 'wiki.txt', run.model_name('vanilla')
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


def test_check_state_dict_finds_every_non_finite_value_and_only_those():
    expected = {'w': torch.Size([4])}
    params_files.check_state_dict(
        {'w': torch.tensor([3e38, 3e38, -1.0, 0.0])}, expected, 'f', 'm'
    )  # sum overflows
    params_files.check_state_dict(
        {'w': torch.tensor([1, 2, 3, 4])}, expected, 'f', 'm'
    )  # integers are always finite
    for values, bad in (
        ([float('inf'), float('-inf'), 0, 0], 2),
        ([0, float('nan'), 0, 0], 1),
        ([3e38, 3e38, float('nan'), 0], 1),
    ):
        with pytest.raises(files.UserError, match=rf"^f: 'w' has {bad} non-finite value"):
            params_files.check_state_dict({'w': torch.tensor(values)}, expected, 'f', 'm')


def test_the_variant_and_bottleneck_are_told_from_the_file(params):
    for variant in ('vanilla', 'synthesizer', 'rope', 'perceiver'):
        told = params_files.variant_and_bottleneck(str(params / f'{variant}.params'))
        assert told == (variant, 64 if variant == 'perceiver' else 32)
    # those given are kept, for load_params to check against the file
    path = str(params / 'perceiver.params')
    assert params_files.variant_and_bottleneck(path, 'rope', 16) == ('rope', 16)
    assert params_files.variant_and_bottleneck(path, bottleneck_dim=16) == ('perceiver', 16)
