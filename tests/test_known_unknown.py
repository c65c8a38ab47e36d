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


def test_rows_and_differences_by_hand(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write(tmp_path / 'all.tsv', 'Q\tA\n' * 5)
    write(tmp_path / 'seen.tsv', 'Q\tA\n' * 3)
    write(tmp_path / 'seen.control.tsv', 'Q\tA\n' * 3)
    make_grid(tmp_path / 'grid-all', tmp_path / 'all.tsv', [
        ('full', 0, 100, report(4, 0, 0.4, [0.2, 0.6, 0.7])),
        ('full', 1, 110, report(6, 1, 0.5, [0.1, 0.3, 0.9])),
        ('lora:1', 0, 150, None),
        ('lora:1', 1, 160, None),
    ])  # fmt: skip
    make_grid(tmp_path / 'grid-seen', tmp_path / 'seen.tsv', [
        ('full', 0, 120, report(8, 2, 0.3, [0.1, 0.2, 0.3, 0.6])),
        ('full', 1, 140, report(8, 2, 0.5, [0.1, 0.2, 0.7, 0.8])),
    ])  # fmt: skip
    make_grid(tmp_path / 'grid-seen.control', tmp_path / 'seen.control.tsv', [
        ('full', 0, 100, report(8, 2, 0.3, [0.1, 0.2, 0.3])),
        ('full', 1, 100, report(8, 2, 0.3, [0.1, 0.6, 0.7])),
    ])  # fmt: skip
    known_unknown.main(['grid-all', 'grid-seen', 'grid-seen.control', '--json', 'rows.json'])
    out = capsys.readouterr().out
    written = json.loads((tmp_path / 'rows.json').read_text())
    rows = written['rows']
    assert [(r['method'], r['finetuning file']) for r in rows] == [
        ('full', 'all.tsv'),
        ('full', 'seen.tsv'),
        ('full', 'seen.control.tsv'),
        ('lora:1', 'all.tsv'),
    ]
    full_all, full_seen, full_control, lora = rows
    assert full_all['examples'] == 5 and full_seen['examples'] == 3
    assert full_all['dev accuracy'] == [20.0, 22.0] and full_all['analyzed'] == 2
    assert full_all['often'] == [50.0, 75.0] and full_all['never'] == [0.0, 50.0]
    assert full_all['dev confidence'] == [0.4, 0.5]
    assert full_all['invented confidence'] == [0.6, 0.3]
    assert full_all['invented above 0.5'] == pytest.approx([200 / 3, 100 / 3])
    assert full_seen['often'] == [100.0, 100.0] and full_seen['invented above 0.5'] == [25, 50]
    assert lora['analyzed'] == 0 and lora['often'] == []

    # seen against its control: accuracy 26 ± 2.83 against 20 ± 0, so +6.0 ± 2.0;
    # the invented share 25, 50 against 0, 66.7: +4.17 ± sqrt(312.5 / 2 + 2222.2 / 2)
    seen, lora_lead = written['differences']
    assert (seen['finetuning file'], seen['against']) == ('seen.tsv', 'seen.control.tsv')
    assert seen['dev accuracy'] == pytest.approx([6.0, 2.0])
    assert seen['dev confidence'] == pytest.approx([0.1, 0.1])
    assert seen['invented confidence'] == pytest.approx([0.1, 0.08**0.5])  # 0.3, 0.7 and 0.2, 0.6
    assert seen['invented above 0.5'] == pytest.approx([25 / 6, (2534.72 / 2) ** 0.5], abs=1e-3)
    assert (lora_lead['method'], lora_lead['against']) == ('lora:1', 'full')
    assert lora_lead['dev accuracy'] == pytest.approx([10.0, (2 / 2 + 2 / 2) ** 0.5])
    assert lora_lead['dev confidence'] is None  # no reports for LoRA

    lines = out.splitlines()
    table = lines[lines.index(known_unknown.HEADER) :][: 2 + 4]
    assert all(line.count('|') == table[0].count('|') for line in table)
    assert '| 21.0 ± 1.4 | 62.5 | 25.0 | 0.450 ± 0.071 | 0.450 ± 0.212 | 50.0 ± 23.6 |' in table[2]
    assert '| 2 (0 analyzed) | 31.0 ± 1.4 | - | - | - | - | - |' in table[5]
    compared = lines[lines.index(known_unknown.DIFFERENCES) :]
    assert len(compared) == 2 + 2
    assert compared[2] == (
        '| vanilla | full | seen.tsv | seen.control.tsv | +6.0 ± 2.0 | +0.100 ± 0.100 '
        '| +0.100 ± 0.283 | +4.2 ± 35.6 |'
    )
    assert compared[3] == '| vanilla | lora:1 | all.tsv | full | +10.0 ± 1.4 | - | - | - |'

    write(tmp_path / 'grid-seen' / 'vanilla.full.s0.analysis.json', json.dumps({'name': 'm'}))
    for args, error in [
        (['grid-seen'], 'vanilla.full.s0.analysis.json: not a report of analyze.py'),
        (['nowhere'], 'nowhere: no grid.json'),
    ]:
        with pytest.raises(SystemExit) as stop:
            known_unknown.main(args)
        err = capsys.readouterr().err
        assert stop.value.code == 2 and error in err and len(err.splitlines()) == 1, err
