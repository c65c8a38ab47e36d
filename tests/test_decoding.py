"""decoding.py against the plain minGPT decoder (utils.sample): the batched, cached greedy
answers equal one-question-at-a-time decoding, for every variant, and evaluation's
handling of unknown characters and long questions."""

import pytest
import torch

import run
import utils
from conftest import main, write
from machinery import decoding
from test_model import SMALL, VARIANTS, make_gpt


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
            'vanilla.params',
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
    assert '3/3 [' in captured.err  # the bar over the questions, at its end
    assert captured.out.endswith('Correct: 0.0 out of 3.0: 0.0%\n')
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
            10,
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


@pytest.mark.parametrize('variant', VARIANTS)
def test_greedy_complete_equals_plain_sampling(variant):
    """Batched by length, cached, stopping early: the plain one-at-a-time completions."""
    gpt = make_gpt(variant, **dict(SMALL, vocab=12), sharp=True).eval()
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(2, 12, (n,), generator=g) for n in [5, 9, 5, 17, 9, 9, 40, 1]]
    plains = [utils.sample(gpt, p[None], 32)[0, len(p) :].tolist() for p in prompts]
    assert len({tuple(c) for c in plains}) > 4  # the completions do differ
    # a stop token that ends some of the completions early and not others
    stop = min(range(12), key=lambda t: abs(sum(t in c for c in plains) - len(plains) / 2))
    assert 0 < sum(stop in c for c in plains) < len(plains)
    answered = []
    completions = decoding.greedy_complete(gpt, prompts, 32, stop, 2, answered.append)
    assert completions == [c[: c.index(stop) + 1] if stop in c else c for c in plains]
    assert sum(answered) == len(prompts)  # each prompt counted once, as it is complete
