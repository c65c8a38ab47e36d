"""known_unknown.py: a grid of two subsets, its rows against the figures by hand, and bad
input as one line."""

import json

import pytest

import grid
import known_unknown
from conftest import write

BANDS = ('often (25% or more)', 'never')


def report(correct_often, correct_never, dev_confidence, invented):
    """The parts of an analyze.py --params --exposure --json report the rows read."""
    return {
        'name': 'm', 'questions': 10, 'categories': {}, 'prior places': [], 'auroc': 0.5,
        'accuracy at coverage': {}, 'median confidence': dev_confidence,
        'invented people': {'median confidence': sorted(invented)[len(invented) // 2],
                            'answers': [['Ann Bee', 'Paris', c] for c in invented]},
        'by exposure': {BANDS[0]: {'questions': 8, 'correct': correct_often},
                        BANDS[1]: {'questions': 2, 'correct': correct_never}},
        'records': [{'confidence': 0.5}],
    }  # fmt: skip


def make_grid(directory, corpus, runs):
    """grid.json with a finished run per (method, seed, dev correct, report or None)."""
    directory.mkdir()
    record = {}
    for method, seed, correct, analysis in runs:
        finetune = ['vanilla', 'wiki.txt', '--finetune_corpus_path', str(corpus)]
        made_with = {'model': 'vanilla', 'method': method, 'seed': seed, 'finetune': finetune}
        record[f'vanilla {method} s{seed}'] = {
            'made_with': made_with,
            'dev_total': 500.0,
            'dev_correct': float(correct),
        }
        if analysis:
            prefix = grid.output_prefix(str(directory), 'vanilla', method, seed)
            write(directory.parent / (prefix + '.analysis.json'), json.dumps(analysis))
    write(directory / 'grid.json', json.dumps(record))


def test_rows_of_two_subsets_by_hand(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write(tmp_path / 'all.tsv', 'Q\tA\n' * 5)
    write(tmp_path / 'seen.tsv', 'Q\tA\n' * 3)
    make_grid(tmp_path / 'grid-all', tmp_path / 'all.tsv', [
        ('full', 0, 100, report(4, 0, 0.4, [0.2, 0.6, 0.7])),
        ('full', 1, 110, report(6, 1, 0.5, [0.1, 0.3, 0.9])),
        ('lora:1', 0, 150, None),
    ])  # fmt: skip
    make_grid(tmp_path / 'grid-seen', tmp_path / 'seen.tsv', [
        ('full', 0, 120, report(8, 2, 0.3, [0.1, 0.2, 0.3, 0.6])),
    ])  # fmt: skip
    known_unknown.main(['grid-all', 'grid-seen', '--json', 'rows.json'])
    out = capsys.readouterr().out
    rows = json.loads((tmp_path / 'rows.json').read_text())
    assert [(r['method'], r['finetuning file']) for r in rows] == [
        ('full', 'all.tsv'),
        ('full', 'seen.tsv'),
        ('lora:1', 'all.tsv'),
    ]
    full_all, full_seen, lora = rows
    assert full_all['examples'] == 5 and full_seen['examples'] == 3
    assert full_all['dev accuracy'] == [20.0, 22.0] and full_all['analyzed'] == 2
    assert full_all['often'] == pytest.approx(62.5) and full_all['never'] == 25.0
    assert full_all['dev confidence'] == pytest.approx(0.45)
    assert full_all['invented confidence'] == pytest.approx(0.45)  # medians 0.6 and 0.3
    assert full_all['invented above 0.5'] == pytest.approx(50.0)  # 2 of 3, then 1 of 3
    assert full_seen['often'] == 100.0 and full_seen['invented above 0.5'] == 25.0
    assert lora['analyzed'] == 0 and 'often' not in lora
    lines = out.splitlines()
    table = lines[lines.index(known_unknown.HEADER) :]
    assert len(table) == 2 + 3 and all(line.count('|') == table[0].count('|') for line in table)
    assert '| 21.0 ± 1.4 | 62.5 | 25.0 | 0.450 | 0.450 | 50.0% |' in table[2]
    assert '| 1 (0 analyzed) | 30.0 | - |' in table[4]

    write(tmp_path / 'grid-seen' / 'vanilla.full.s0.analysis.json', json.dumps({'name': 'm'}))
    for args, error in [
        (['grid-seen'], 'vanilla.full.s0.analysis.json: not a report of analyze.py'),
        (['nowhere'], 'nowhere: no grid.json'),
    ]:
        with pytest.raises(SystemExit) as stop:
            known_unknown.main(args)
        err = capsys.readouterr().err
        assert stop.value.code == 2 and error in err and len(err.splitlines()) == 1, err
