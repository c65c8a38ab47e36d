"""exposure.py: the ledger replays the span draws of a pretraining without the model, and
rebuilds exactly the examples a real run trained on."""

import json

import numpy as np
import pytest

import dataset
import exposure
import run
import trainer
from conftest import main


@pytest.mark.parametrize('edition', ['2021', '2024'])
def test_the_ledger_rebuilds_every_example_a_run_trained_on(tiny, monkeypatch, edition):
    """A real pretraining of 2 epochs, its batches recorded, against the ledger's replay
    for the same edition (2024 pads to block_size + 1) and seed."""
    trained = []
    batch = trainer.Trainer.batch

    def recording(self, data, step):
        x, y = batch(self, data, step)
        trained.extend(
            dataset.decode(row_x, data.itos) + dataset.decode(row_y[-1:], data.itos)
            for row_x, row_y in zip(x, y)
        )
        return x, y

    monkeypatch.setattr(trainer.Trainer, 'batch', recording)
    argv = ['pretrain', 'vanilla', 'wiki.txt', '--writing_params_path', 'v.params']
    assert (
        main(
            *argv,
            '--max_epochs',
            2,
            '--batch_size',
            16,
            '--seed',
            3,
            '--edition',
            edition,
            cwd=tiny,
        )
        == 0
    )
    text = (tiny / 'wiki.txt').read_text(encoding='utf-8')
    window, start, length = exposure.replay(text, edition, seed=3, epochs=2)
    documents = text.split('\n')
    padded = run.EDITIONS[edition]['pretrain_padded_length']
    rebuilt = [
        exposure.example(documents[d], window[e, d], start[e, d], length[e, d], padded)
        for e in range(2)
        for d in range(len(documents))
    ]
    assert rebuilt == trained and len(set(rebuilt)) > len(documents)  # the epochs differ


def test_each_person_is_shown_masked_or_not_as_the_ledger_says(tiny, monkeypatch):
    """A person's place is in the text when the window holds it outside the masked span,
    in the masked span when the two overlap, and not shown when the window ends before
    the place does; the counts add up to the epochs. The letter of each epoch is read off
    the training example itself, its place's characters marked."""
    text = (tiny / 'wiki.txt').read_text(encoding='utf-8')
    window, start, length = exposure.replay(text, '2021', seed=0, epochs=30)
    rows = [(line.split(' was born in ')[0], line.split(' was born in ')[1].split('.')[0])
            for line in text.split('\n') if ' was born in ' in line]  # fmt: skip
    report = exposure.people_exposure(
        text, rows + [('Nobody Here', 'Paris')], window, start, length
    )
    for entry in report[:-1]:
        d, begin, end = entry['document'], entry['place_start'], entry['place_end']
        assert text.split('\n')[d][begin:end] == entry['place']
        seen = [e for e in range(30) if window[e, d] >= end]
        masked = [e for e in seen if start[e, d] < end and start[e, d] + length[e, d] > begin]
        assert (entry['shown'], entry['masked']) == (len(seen) - len(masked), len(masked))
        assert entry['shown'] + entry['masked'] + entry['not_shown'] == 30
        assert entry['last_epoch_seen'] == (seen[-1] + 1 if seen else None)
        marked = text.split('\n')[d][:begin] + '\x01' * (end - begin) + text.split('\n')[d][end:]
        letters = ''
        for e in range(30):
            built = exposure.example(marked, window[e, d], start[e, d], length[e, d], 128)
            before, after, masked = built.split(dataset.MASK_CHAR)
            counts = [part.count('\x01') for part in (before, after, masked)]
            if sum(counts) < end - begin:
                letters += '-'
            else:
                letters += 'm' if counts[2] else 'b' if counts[0] else 'a'
        assert entry['by_epoch'] == letters
    letters = ''.join(e['by_epoch'] for e in report[:-1])
    assert all(letters.count(c) for c in 'bam-'), letters  # every case is tried
    assert sum(e['masked'] for e in report) > 0 and sum(e['not_shown'] for e in report) > 0
    assert report[-1]['document'] is None and report[-1]['fraction_seen'] == 0.0
    assert report[-1]['by_epoch'] == '-' * 30
    json.dumps(report)  # plain values only


def test_two_people_of_one_name_each_have_their_own_document():
    text = 'George Stone. Born in Fulham, he studied in London .\nGeorge Stone. Born in London .\n'
    window, start, length = exposure.replay(text, '2021', seed=0, epochs=3)
    rows = [('George Stone', 'Fulham'), ('George Stone', 'London')]
    report = exposure.people_exposure(text, rows, window, start, length)
    assert [(r['document'], r['place_start']) for r in report] == [(0, 22), (1, 22)]
    # dev's George Stone alone, with the finetuning file's before him
    [dev] = exposure.people_exposure(text, rows[1:], window, start, length, before=['George Stone'])
    assert dev == report[1]


def test_the_command_line_writes_the_ledger_and_the_people(tiny, monkeypatch, capsys):
    monkeypatch.chdir(tiny)
    (tiny / 'people.tsv').write_text('Where was Ada Lovelace born?\tx\n', encoding='utf-8')
    with pytest.raises(SystemExit) as stop:
        exposure.main(['--max_epochs', '2'])
    assert stop.value.code == 2
    assert capsys.readouterr().err == (
        "error: nothing to write: give --ledger, --json or --subsets\n"
    )
    # into a folder that does not exist yet: it is made
    argv = ['--max_epochs', '2', '--ledger', 'out/l.npz', '--json', 'out/p.json']
    # a finetuning file of its own, whose person has no document: the real data not needed
    (tiny / 'others.tsv').write_text('Where was Nobody Known born?\tx\n', encoding='utf-8')
    exposure.main(argv + ['--people', 'people.tsv', '--finetune_corpus_path', 'others.tsv'])
    ledger = np.load(tiny / 'out' / 'l.npz')
    assert ledger['window'].shape == (2, len((tiny / 'wiki.txt').read_text().split('\n')))
    assert json.loads((tiny / 'out' / 'p.json').read_text())[0]['name'] == 'Ada Lovelace'
    capsys.readouterr()
    exposure.main(['--max_epochs', '2', '--subsets', 'sub', '--finetune_corpus_path', 'train.tsv',
                   '--json', 'train.json', '--people', 'train.tsv'])  # fmt: skip
    out = capsys.readouterr().out
    train = (tiny / 'train.tsv').read_text(encoding='utf-8').splitlines()
    report = json.loads((tiny / 'train.json').read_text())
    subsets = {}
    for name in ('seen', 'seen.control', 'often', 'often.control'):
        lines = subsets[name] = (
            (tiny / 'sub' / f"{name}.tsv").read_text(encoding='utf-8').splitlines()
        )
        assert set(lines) <= set(train)
        assert f"sub/{name}.tsv: {len(lines)} of the {len(train)} lines of train.tsv" in out
    # each line goes by its own person's exposure, as --json reports it
    assert subsets['seen'] == [t for t, r in zip(train, report) if r['fraction_seen'] > 0]
    assert subsets['often'] == [t for t, r in zip(train, report) if r['fraction_seen'] >= 0.25]
    # the finetuning file listed after another: its documents come first, so it must too
    (tiny / 'one.tsv').write_text((tiny / 'dev.tsv').read_text(encoding='utf-8'), encoding='utf-8')
    with pytest.raises(SystemExit) as stop:
        exposure.main(['--json', 'p.json', '--people', 'one.tsv', 'train.tsv',
                       '--finetune_corpus_path', 'train.tsv'])  # fmt: skip
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err == (
        "error: --people: list train.tsv first: wiki.txt holds its people's documents before "
        "the others'\n"
    )
    # a file where the folder should be: one line, before the replay
    with pytest.raises(SystemExit) as stop:
        exposure.main(['--subsets', 'train.tsv', '--finetune_corpus_path', 'train.tsv'])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.startswith('error: --subsets train.tsv: cannot make it')
    assert len(err.splitlines()) == 1


def test_shown_late_counts_the_people_last_shown_in_the_final_epochs():
    report = [{'last_epoch_seen': e} for e in (None, 48, 600, 601, 650)]  # epochs count from 1
    assert exposure.shown_late(report, 650, 50) == 2
    assert exposure.shown_late(report, 650, 51) == 3
    assert exposure.shown_late(report, 650, 650) == 4


def test_where_shown_shares_the_epochs_that_showed_a_place():
    report = [{'by_epoch': 'bm-a'}, {'by_epoch': 'aam-'}, {'by_epoch': '----'}]
    assert exposure.where_shown(report) == {'b': 1 / 6, 'a': 3 / 6, 'm': 2 / 6}
    assert exposure.where_shown(report[2:]) == {'b': 0.0, 'a': 0.0, 'm': 0.0}


def test_finetuning_subsets_by_hand():
    # lines 1 and 4 are two people of one name, born in different places: each line goes by
    # its own person's exposure
    people = ['P0', 'P1', 'P2', 'P3', 'P1', 'P5']
    lines = [f"Where was {p} born?\tX{i}" for i, p in enumerate(people)]
    seen = [0.0, 0.1, 0.25, 0.0, 0.9, 0.3]
    report = [{'name': p, 'fraction_seen': f} for p, f in zip(people, seen)]
    subsets = exposure.finetuning_subsets(lines, report, seed=3)
    assert subsets['seen.tsv'] == [lines[i] for i in (1, 2, 4, 5)]
    assert subsets['often.tsv'] == [lines[i] for i in (2, 4, 5)]
    for name in ('seen', 'often'):
        control = subsets[f"{name}.control.tsv"]
        assert len(control) == len(subsets[f"{name}.tsv"]) and len(set(control)) == len(control)
        assert control == sorted(control, key=lines.index)  # in file order
    assert subsets == exposure.finetuning_subsets(lines, report, seed=3)
