"""docs/research.md's "Your own corpus, your own variant", step by step: a toy corpus whose
documents are in an order of their own, a toy variant registered where the docs say
(run.VARIANT_EDITION and run.new_model), pretrained, finetuned and evaluated with the
handout's commands, then exposure.py and the cloze probe on its params."""

import json
import random

import pytest
import torch

import cloze
import exposure
import model
import run
from conftest import NAMES, PLACES, main


class ToyGPT(model.GPT):
    """The toy variant: vanilla's model with a learned gate on its token embeddings, a
    weight of a name no other variant has (guessed from the names, its params would be
    vanilla's)."""

    def __init__(self, config):
        super().__init__(config)
        self.toy_gate = torch.nn.Parameter(torch.ones(1))
        self.tok_emb.register_forward_hook(lambda module, inputs, out: out * self.toy_gate)


def toy_corpus():
    """(corpus text, [(name, place)]): a document per person that begins with their name
    and names their place, a few other documents, all in a shuffled order; two people
    share a name, told apart by their places."""
    rng = random.Random(1)
    people = [(name, rng.choice(PLACES)) for name in NAMES]
    people.append((NAMES[0], next(p for p in PLACES if p != people[0][1])))  # a namesake
    lines = [
        f"{name}. {name.split()[-1]} was born in {place} and wrote a little."
        for name, place in people
    ]
    # every character of the questions is in the corpus: the vocabulary is its characters
    lines += ['Nobody here. Where was who born?', 'Places: ' + ', '.join(PLACES) + '.']
    rng.shuffle(lines)
    return '\n'.join(lines) + '\n', people


@pytest.fixture
def own(tmp_path, monkeypatch):
    """The toy corpus and question files in tmp_path, the toy variant registered."""
    text, people = toy_corpus()
    (tmp_path / 'corpus.txt').write_text(text, encoding='utf-8')
    rows = [f"Where was {n} born?\t{p}" for n, p in people]
    (tmp_path / 'train.tsv').write_text('\n'.join(rows[:10]) + '\n', encoding='utf-8')
    (tmp_path / 'dev.tsv').write_text('\n'.join(rows[10:]) + '\n', encoding='utf-8')
    # the two edits the docs name: the variant's edition, and its model in new_model
    monkeypatch.setitem(run.VARIANT_EDITION, 'toy', '2021')
    handout_model = run.new_model

    def new_model(variant, vocab_size, bottleneck_dim=32):
        if variant != 'toy':
            return handout_model(variant, vocab_size, bottleneck_dim)
        config = model.GPTConfig(vocab_size, run.BLOCK_SIZE, **run.MODEL_SIZE)
        return ToyGPT(config)

    monkeypatch.setattr(run, 'new_model', new_model)
    monkeypatch.chdir(tmp_path)
    return tmp_path, people


def test_a_toy_variant_on_a_toy_corpus_goes_through_every_step(own, capsys):
    folder, people = own
    corpus = ['corpus.txt']
    assert main('pretrain', 'toy', *corpus, '--writing_params_path', 'toy.pretrain.params',
                '--max_epochs', 2, '--batch_size', 8, '--seed', 5, cwd=folder) == 0  # fmt: skip
    card = json.loads((folder / 'toy.pretrain.params.json').read_text())
    assert (card['variant'], card['seed'], card['epochs'], card['corpus']) == (
        'toy',
        5,
        2,
        'corpus.txt',
    )
    assert 'toy_gate' in torch.load(folder / 'toy.pretrain.params', weights_only=True)
    assert main('finetune', 'toy', *corpus, '--reading_params_path', 'toy.pretrain.params',
                '--writing_params_path', 'toy.finetune.params', '--finetune_corpus_path',
                'train.tsv', '--max_epochs', 1, cwd=folder) == 0  # fmt: skip
    assert main('evaluate', 'toy', *corpus, '--reading_params_path', 'toy.finetune.params',
                '--eval_corpus_path', 'dev.tsv', '--outputs_path', 'toy.dev.predictions',
                cwd=folder) == 0  # fmt: skip
    assert len((folder / 'toy.dev.predictions').read_text().splitlines()) == len(people) - 10
    assert 'Correct: ' in capsys.readouterr().out

    exposure.main(['--params', 'toy.pretrain.params', '--pretrain_corpus_path', 'corpus.txt',
                   '--people', 'train.tsv', 'dev.tsv', '--finetune_corpus_path', 'train.tsv',
                   '--json', 'toy.exposure.json'])  # fmt: skip
    report = json.loads((folder / 'toy.exposure.json').read_text())
    assert report['made_from']['seed'] == 5 and report['made_from']['epochs'] == 2
    lines = (folder / 'corpus.txt').read_text(encoding='utf-8').split('\n')
    assert [(r['name'], r['place']) for r in report['people']] == people
    for r in report['people']:  # each person's own document, wherever the corpus holds it
        document = lines[r['document']]
        assert document.startswith(r['name'] + '.') and f"born in {r['place']} " in document
        assert document[r['place_start'] : r['place_end']] == r['place']
    assert len({r['document'] for r in report['people']}) == len(people)  # the namesakes too

    # the cloze probe builds the toy model from the card (its names alone would say vanilla)
    argv = ['toy.pretrain.params', '--pretrain_corpus_path', 'corpus.txt', '--eval_corpus_path',
            'dev.tsv', '--finetune_corpus_path', 'train.tsv', '--exposure', 'toy.exposure.json',
            '--finetuned', 'toy.dev.predictions', '--json', 'toy.cloze.json', '--device', 'cpu']  # fmt: skip
    cloze.main(argv)
    made = json.loads((folder / 'toy.cloze.json').read_text())
    assert [r['person'] for r in made['records']] == [n for n, _ in people[10:]]
    assert made['untrained']['seed'] == 5
    (folder / 'toy.pretrain.params.json').unlink()
    capsys.readouterr()
    with pytest.raises(SystemExit) as stop:
        cloze.main(argv)
    err = capsys.readouterr().err
    assert stop.value.code == 2 and len(err.splitlines()) == 1 and 'toy_gate' in err
