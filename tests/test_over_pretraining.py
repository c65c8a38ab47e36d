"""over_pretraining.py: each row's figures against a count by hand, and the command on
cloze.py's own reports of two checkpoints, with bad input as one line."""

import json
import shutil

import pytest

import analyze
import cloze
import over_pretraining
from conftest import write
from test_plot import write_metrics


def record(seen, finetuned, document, name, question):
    r = {'person': 'P', 'place': 'X', 'fraction seen': seen, 'finetuned right': finetuned,
         'name': {'right': name}, 'question': {'right': question}}  # fmt: skip
    if document is not None:
        r['document'] = {'right': document}
    return r


def test_a_row_by_hand(tmp_path):
    records = [
        record(0.5, True, True, False, False),
        record(0.3, False, None, True, False),  # its document lacks the place
        record(0.1, True, False, False, True),
        record(0.0, False, None, False, False),
    ]
    # 4 steps an epoch; epoch 2's losses 5, 6, 7, 8 and its last rate 1e-3 / 8
    rows = [((s - 1) // 4 + 1, s, s - 0.0) for s in range(1, 13)]
    write_metrics(tmp_path / 'm.csv', rows)
    metrics = over_pretraining.plot.read_metrics(tmp_path / 'm.csv')
    row = over_pretraining.checkpoint_row(2, records, metrics)
    assert row['epoch'] == 2 and row['people'] == 4 and row['often people'] == 2
    assert row['loss'] == 6.5 and row['lr'] == pytest.approx(1e-3 / 8)
    assert row['finetuned'] == 0.5 and row['finetuned, often'] == 0.5
    assert row['document'] == 0.5  # 1 of the 2 whose document has the place
    assert row['document, often'] == 1.0  # the often one without it is not asked
    assert row['name'] == 0.25 and row['question'] == 0.25
    assert 'lr' not in over_pretraining.checkpoint_row(2, records, None)


def test_the_command_on_cloze_reports_of_two_checkpoints(params, capsys):
    people = analyze.read_questions(params / 'dev.tsv')
    write(params / 'exposure.json', json.dumps(
        [{'name': p, 'place': place, 'fraction_seen': 0.5 if i % 2 else 0.1}
         for i, (_, p, place) in enumerate(people)]
    ))  # fmt: skip
    reports = []
    for epoch, right in [(20, 1), (10, 0)]:  # given out of order
        ckpt = params / f'vanilla.pretrain.epoch{epoch:03d}.params'
        shutil.copy(params / 'vanilla.params', ckpt)
        answers = [place if i < right else 'Nowhere' for i, (_, _, place) in enumerate(people)]
        write(params / f'{epoch}.predictions', ''.join(a + '\n' for a in answers))
        reports.append(params / f'{epoch}.json')
        cloze.main([str(ckpt), '--eval_corpus_path', str(params / 'dev.tsv'),
                    '--finetune_corpus_path', str(params / 'train.tsv'),
                    '--pretrain_corpus_path', str(params / 'wiki.txt'), '--device', 'cpu',
                    '--exposure', str(params / 'exposure.json'),
                    '--finetuned', str(params / f'{epoch}.predictions'),
                    '--json', str(reports[-1])])  # fmt: skip
    capsys.readouterr()
    over_pretraining.main([*map(str, reports), '--json', str(params / 'rows.json')])
    out = capsys.readouterr().out
    rows = json.loads((params / 'rows.json').read_text())
    assert [row['epoch'] for row in rows] == [10, 20]
    assert [row['finetuned'] for row in rows] == [0, 1 / len(people)]
    assert rows[0]['often people'] == len(people) // 2
    # the same params at both epochs: the same probes
    for key in ['document', 'document, often', 'name', 'question']:
        assert rows[0][key] == rows[1][key]
    records = json.loads(reports[1].read_text())['records']  # epoch 10
    asked = [r['document']['right'] for r in records if 'document' in r]
    assert rows[0]['document'] == pytest.approx(sum(asked) / len(asked))
    assert out.splitlines()[3].split()[0] == '10' and out.splitlines()[4].split()[0] == '20'

    plain = json.loads(reports[0].read_text())
    write(params / 'no_epoch.json', json.dumps({**plain, 'params': 'vanilla.pretrain.params'}))
    for r in plain['records']:
        del r['finetuned right']
    write(params / 'plain.json', json.dumps(plain))
    for inputs, error in [
        (['no_epoch.json'], 'name no epoch'),
        (['plain.json'], 'made without cloze.py'),
        (['exposure.json'], 'not the --json of cloze.py'),
        (['10.json', '10.json'], 'two of the cloze reports are of the same epoch'),
    ]:
        with pytest.raises(SystemExit) as stop:
            over_pretraining.main([str(params / i) for i in inputs])
        err = capsys.readouterr().err
        assert stop.value.code == 2 and error in err and len(err.splitlines()) == 1, err


def test_the_picture(params, tmp_path):
    pytest.importorskip('matplotlib', reason='the picture needs matplotlib, an optional install')
    rows = [((s - 1) // 4 + 1, s, 1.0) for s in range(1, 9)]
    write_metrics(tmp_path / 'm.csv', rows)
    metrics = over_pretraining.plot.read_metrics(tmp_path / 'm.csv')
    table = [
        over_pretraining.checkpoint_row(e, [record(0.5, True, None, False, False)], metrics)
        for e in (1, 2)
    ]
    over_pretraining.plot_rows(table, metrics, tmp_path / 'k.png')
    assert (tmp_path / 'k.png').read_bytes().startswith(b'\x89PNG')
