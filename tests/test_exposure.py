"""exposure.py: the ledger replays the span draws of a pretraining without the model, and
rebuilds exactly the examples a real run trained on."""

import json
import random

import numpy as np
import pytest

import analyze
import cloze
import dataset
import exposure
import run
import trainer
from conftest import main
from machinery import batch_producer, devices, files


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


def test_a_seeded_run_is_rebuilt_from_its_own_batches(tiny, monkeypatch, capsys):
    """A pretraining whose batches are built ahead, each from its own seed, as on CUDA
    (batch_producer.py, here on the CPU with its workers): its card names the path and
    the batch seed, and exposure.py --params rebuilds every example it trained on; the
    flags of a run without a card give the same."""
    trained = []
    taken = batch_producer.BatchProducer.__next__

    def recording(self):
        x, y = taken(self)
        trained.extend(
            dataset.decode(row_x, dataset_of[0].itos)
            + dataset.decode(row_y[-1:], dataset_of[0].itos)
            for row_x, row_y in zip(x, y)
        )
        return x, y

    dataset_of = []
    made = batch_producer.BatchProducer.__init__
    monkeypatch.setattr(batch_producer.BatchProducer, '__init__',
                        lambda self, data, *a, **k: dataset_of.append(data) or made(self, data, *a, **k))  # fmt: skip
    monkeypatch.setattr(batch_producer.BatchProducer, '__next__', recording)
    monkeypatch.setattr(devices, 'builds_batches_ahead', lambda device: True)
    argv = ['pretrain', 'vanilla', 'wiki.txt', '--writing_params_path', 'v.params']
    assert main(*argv, '--max_epochs', 2, '--batch_size', 16, '--seed', 3, cwd=tiny) == 0
    card = json.loads((tiny / 'v.params.json').read_text())
    assert card['batches'] == 'seeded' and card['epochs'] == 2 and card['seed'] == 3
    assert card['batch_seed'] == exposure.run_batch_seed(3)  # the seed a run of --seed 3 takes
    monkeypatch.chdir(tiny)
    exposure.main(['--params', 'v.params', '--ledger', 'seeded.npz'])
    ledger = np.load(tiny / 'seeded.npz')
    assert json.loads(str(ledger['made_from']))['params_md5'] == card['params_md5']
    documents = (tiny / 'wiki.txt').read_text(encoding='utf-8').split('\n')
    window, start, length = ledger['window'], ledger['masked_start'], ledger['masked_length']
    rebuilt = [
        exposure.example(documents[d], window[e, d], start[e, d], length[e, d], 128)
        for e in range(2)
        for d in range(len(documents))
    ]
    assert rebuilt == trained
    stream = exposure.replay('\n'.join(documents), seed=3, epochs=2)
    assert not all(np.array_equal(a, b) for a, b in zip(stream, (window, start, length)))
    exposure.main(['--seed', '3', '--max_epochs', '2', '--batches', 'seeded', '--batch_size', '16',
                   '--ledger', 'flags.npz'])  # fmt: skip
    flags = np.load(tiny / 'flags.npz')
    assert all(
        np.array_equal(flags[k], ledger[k]) for k in ('window', 'masked_start', 'masked_length')
    )
    capsys.readouterr()
    # the card says the run's settings: flags beside --params are refused, as is another corpus
    for extra, line in [
        (['--seed', '1'], "--seed: --params v.params says the run's (its card)"),
        (['--pretrain_corpus_path', 'train.tsv'],
         "--pretrain_corpus_path train.tsv: not the corpus v.params was pretrained on (wiki.txt, "
         f"md5 of its text {card['corpus_md5']})"),
    ]:  # fmt: skip
        with pytest.raises(SystemExit) as stop:
            exposure.main(['--params', 'v.params', '--ledger', 'x.npz', *extra])
        assert stop.value.code == 2 and capsys.readouterr().err == f"error: {line}\n"
    (tiny / 'v.params.json').unlink()
    with pytest.raises(SystemExit):
        exposure.main(['--params', 'v.params', '--ledger', 'x.npz'])
    assert capsys.readouterr().err == (
        "error: --params v.params: no card (v.params.json) says how it was pretrained; give the "
        "run's --seed, --max_epochs and --batches instead\n"
    )


def test_a_report_of_another_run_is_refused_in_one_line(tiny, monkeypatch, capsys):
    """A report of the 2-epoch run's examples goes with its params, and with params
    finetuned from them; one of another seed, of more epochs or of other params is refused
    by every tool that takes a report with params."""
    argv = ['pretrain', 'vanilla', 'wiki.txt', '--writing_params_path', 'v.params']
    assert main(*argv, '--max_epochs', 2, '--batch_size', 16, cwd=tiny) == 0
    finetune = ['finetune', 'vanilla', 'wiki.txt', '--reading_params_path', 'v.params',
                '--writing_params_path', 'f.params', '--finetune_corpus_path', 'train.tsv']  # fmt: skip
    assert main(*finetune, '--max_epochs', 1, cwd=tiny) == 0
    assert json.loads((tiny / 'f.params.json').read_text())['pretrained']['epochs'] == 2
    monkeypatch.chdir(tiny)
    people = ['--people', 'train.tsv', 'dev.tsv', '--finetune_corpus_path', 'train.tsv']
    exposure.main(['--params', 'v.params', '--json', 'own.json', *people])
    exposure.main(['--max_epochs', '2', '--json', 'flags.json', *people])  # the same run
    # another edition pads the examples otherwise, with the same spans: it serves too
    exposure.main(['--max_epochs', '2', '--edition', '2024', '--json', 'padded.json', *people])
    exposure.main(['--max_epochs', '3', '--json', 'longer.json', *people])
    exposure.main(['--max_epochs', '2', '--seed', '1', '--json', 'seed1.json', *people])
    for params in ('v.params', 'f.params'):
        for good in ('own.json', 'flags.json', 'padded.json'):
            assert analyze.read_exposure(good, params)
        for bad, differs in [('longer.json', 'epochs 3 (the params\': 2)'),
                             ('seed1.json', 'seed 1 (the params\': 0)')]:  # fmt: skip
            with pytest.raises(files.UserError) as error:
                analyze.read_exposure(bad, params)
            assert str(error.value) == (
                f"--exposure {bad}: not the report of the pretraining of params {params}: {differs}"
            )
    capsys.readouterr()
    with pytest.raises(SystemExit) as stop:
        cloze.main(['v.params', '--exposure', 'longer.json', '--eval_corpus_path', 'dev.tsv',
                    '--finetune_corpus_path', 'train.tsv'])  # fmt: skip
    err = capsys.readouterr().err
    assert stop.value.code == 2 and len(err.splitlines()) == 1
    assert err.startswith("error: --exposure longer.json: not the report of the pretraining")


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
    [dev] = exposure.people_exposure(
        text, rows[1:], window, start, length, before=[('George Stone', 'Fulham')]
    )
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
    assert json.loads((tiny / 'out' / 'p.json').read_text())['people'][0]['name'] == 'Ada Lovelace'
    capsys.readouterr()
    exposure.main(['--max_epochs', '2', '--subsets', 'sub', '--finetune_corpus_path', 'train.tsv',
                   '--json', 'train.json', '--people', 'train.tsv'])  # fmt: skip
    out = capsys.readouterr().out
    train = (tiny / 'train.tsv').read_text(encoding='utf-8').splitlines()
    report = json.loads((tiny / 'train.json').read_text())['people']
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
    # the finetuning file listed after another: its people are matched first all the same
    (tiny / 'one.tsv').write_text((tiny / 'dev.tsv').read_text(encoding='utf-8'), encoding='utf-8')
    for order, out in [
        (['one.tsv', 'train.tsv'], 'after.json'),
        (['train.tsv', 'one.tsv'], 'first.json'),
    ]:
        exposure.main(['--max_epochs', '2', '--json', out, '--people', *order,
                       '--finetune_corpus_path', 'train.tsv'])  # fmt: skip
    assert (tiny / 'after.json').read_text() == (tiny / 'first.json').read_text()
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


def test_people_are_matched_to_their_documents_in_any_order_of_the_corpus():
    """Documents in any order: each person gets the line that begins with their name and
    holds their place, a longer name's line is never a shorter name's, and only lines that
    cannot be told apart go by the order the people are given in."""
    lines = ['George Bruce Malleson. Born in Delhi .', 'George Stone. Born in London .',
             'Ada Lovelace. Born in London .', 'George Stone. Born in Fulham, he studied in London .',
             'George Bruce. Born in Perth .', 'Twin. Born in Rome .', 'Twin. Born in Rome .']  # fmt: skip
    people = [('George Stone', 'London'), ('George Bruce', 'Perth'), ('George Stone', 'Fulham'),
              ('Twin', 'Rome'), ('George Bruce Malleson', 'Delhi'), ('Nobody', 'Paris'),
              ('Twin', 'Rome'), ('Ada Lovelace', None)]  # fmt: skip
    expected = [1, 4, 3, 5, 0, None, 6, 2]
    assert analyze.document_lines(lines, people) == expected
    for seed in range(5):  # the corpus shuffled, the people given in another order
        order = random.Random(seed).sample(range(len(lines)), len(lines))
        shuffled = [lines[i] for i in order]
        found = analyze.document_lines(shuffled, people)
        texts = [None if i is None else shuffled[i] for i in found]
        assert texts == [None if i is None else lines[i] for i in expected]
        backwards = analyze.document_lines(shuffled, people[::-1])[::-1]
        assert [None if i is None else shuffled[i] for i in backwards] == texts
