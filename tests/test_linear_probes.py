"""linear_probes.py: the hidden states at each question's MASK against the model's layers
run by hand, one question at a time; the probe on data that a line separates and on data
it cannot; the command end to end, and bad input as one line."""

import json
import re

import pytest
import torch

import analyze
import dataset
import linear_probes
import run
from test_analyze import CORPUS


@pytest.mark.parametrize('variant', ['vanilla', 'synthesizer', 'rope', 'perceiver'])
def test_states_equal_the_layers_run_by_hand(variant):
    ds = dataset.CharCorruptionDataset(CORPUS, run.BLOCK_SIZE)
    torch.manual_seed(0)
    gpt = run.new_model(variant, ds.vocab_size, 16).eval()
    questions = ['Where was Ada Lovelace born?', 'Where was Max Born born?', 'Who?']
    states = linear_probes.hidden_states(gpt, questions, ds, batch_size=2)
    names = [name for name, _ in linear_probes.layers(gpt)]
    assert list(states) == names and names[0] == 'embeddings' and names[-1] == 'final norm'
    with torch.no_grad():
        for i, question in enumerate(questions):
            idx = torch.tensor([[ds.stoi[c] for c in question] + [ds.stoi[ds.MASK_CHAR]]])
            x = gpt.tok_emb(idx) + (0 if variant == 'rope' else gpt.pos_emb[:, : idx.size(1)])
            by_hand = {'embeddings': x}
            if variant == 'perceiver':
                x = gpt.up_block(gpt.blocks(gpt.down_block(x)), x)
                by_hand['up block'] = x
            else:
                for k, block in enumerate(gpt.blocks):
                    x = block(x)
                    by_hand[f"block {k + 1}"] = x
            by_hand['final norm'] = gpt.ln_f(x)
            for name, value in by_hand.items():
                torch.testing.assert_close(states[name][i], value[0, -1], rtol=1e-5, atol=1e-5)


def test_the_probe_finds_a_line_and_nothing_where_there_is_none():
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(400, 8, generator=generator)
    labels = (x[:, 3] - 0.5 * x[:, 5] > 0).tolist()
    train, test = slice(0, 200), slice(200, 400)
    score = linear_probes.fit_probe(x[train], torch.tensor(labels[train]))
    assert analyze.auroc(score(x[test]).tolist(), labels[test]) > 0.99
    noise = torch.rand(400, generator=generator).lt(0.5).tolist()
    score = linear_probes.fit_probe(x[train], torch.tensor(noise[train]))
    assert 0.35 < analyze.auroc(score(x[test]).tolist(), noise[test]) < 0.65


@pytest.mark.slow
def test_the_command_writes_both_splits(params, capsys):
    rows = [r for path in ('train.tsv', 'dev.tsv') for r in analyze.read_questions(params / path)]
    exposure = [{'name': p, 'place': place, 'fraction_seen': 0.5 * (i % 2)}
                for i, (_, p, place) in enumerate(rows)]  # fmt: skip
    (params / 'exposure.json').write_text(json.dumps(exposure))
    args = [str(params / 'vanilla.params'), '--finetune_corpus_path', str(params / 'train.tsv'),
            '--eval_corpus_path', str(params / 'dev.tsv'), '--pretrain_corpus_path',
            str(params / 'wiki.txt'), '--device', 'cpu']  # fmt: skip
    linear_probes.main([*args, '--exposure', str(params / 'exposure.json'),
                        '--json', str(params / 'probes.json')])  # fmt: skip
    report = json.loads((params / 'probes.json').read_text())
    real, seen = report['splits']['real or invented'], report['splits']['seen or never']
    assert real['train'][0] == 12 and real['train'][1] > 12  # 12 people, then invented ones
    assert seen['test'] == [sum(i % 2 for i in range(12, len(rows))), len(rows) - 12]
    layers = ['embeddings', 'block 1', 'block 2', 'block 3', 'block 4', 'final norm']
    assert list(real['probe auroc']) == layers
    # the params are an untrained model of seed 0 (run.py's default, the params having no
    # card): the floor is the very same measurement
    assert report['untrained'] == {'seed': 0, 'splits': report['splits']}
    out = capsys.readouterr().out
    assert re.search(
        r"probe after final norm +(\S+)  \(untrained \1, shuffled labels \S+\)", out
    ), out
    (params / 'short.json').write_text(json.dumps(exposure[:-1]))
    # every dev person seen: the seen-or-never probe has nothing to tell apart, said before
    # any work instead of failing at the report
    all_seen = [dict(e, fraction_seen=0.5) if i >= 12 else e for i, e in enumerate(exposure)]
    (params / 'all_seen.json').write_text(json.dumps(all_seen))
    for path, error in [
        ('short.json', f"has no entry for {rows[-1][1]}"),
        ('all_seen.json', f"the people of {params / 'dev.tsv'} are all seen or all never shown"),
    ]:
        with pytest.raises(SystemExit) as stop:
            linear_probes.main([*args, '--exposure', str(params / path)])
        err = capsys.readouterr().err
        assert stop.value.code == 2 and error in err and len(err.splitlines()) == 1


def test_the_shuffled_labels_control_is_at_chance_where_the_probe_is_not(monkeypatch):
    """States that hold the label in one coordinate: the probe finds it, and the same probe
    trained on the labels shuffled does not (its mean test AUROC near 0.5)."""
    generator = torch.Generator().manual_seed(0)
    people = {s: [('q', f'p{s}{i}', 'X') for i in range(200)] for s in ('train', 'dev')}
    seen = {
        (p, place): float(i % 2) for rows in people.values() for i, (_, p, place) in enumerate(rows)
    }
    questions = {s: [q for q, _, _ in rows] + ['invented'] * 100 for s, rows in people.items()}

    def states(gpt, asked, pretrain_dataset):
        split = 'train' if asked is questions['train'] else 'dev'
        real = torch.tensor([1.0] * 200 + [0.0] * 100)
        shown = torch.tensor([seen[p, place] for _, p, place in people[split]] + [0.0] * 100)
        noise = torch.randn(300, 6, generator=generator)
        return {'block 1': torch.cat([real[:, None] + 0.3 * noise[:, :1], shown[:, None]
                                      + 0.3 * noise[:, 1:2], noise[:, 2:]], 1)}  # fmt: skip

    monkeypatch.setattr(linear_probes, 'hidden_states', states)
    monkeypatch.setattr(linear_probes.decoding, 'answer_questions', lambda gpt, asked, *a: asked)
    monkeypatch.setattr(
        linear_probes.analyze, 'confidences', lambda gpt, asked, *a: [0.5] * len(asked)
    )
    result = linear_probes.splits(None, None, questions, people, seen, seed=0)
    for split in result.values():
        assert split['probe auroc']['block 1'] > 0.95
        # far nearer chance: a shuffle's probe weighs the label's coordinate by the labels'
        # chance correlation, either way, so each is off 0.5 and their mean less
        assert abs(split['shuffled labels']['block 1'] - 0.5) < 0.25
