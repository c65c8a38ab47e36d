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
        ('full', 2, 130, report(8, 2, 0.4, [0.1, 0.2, 0.3, 0.4])),
        ('lora:1', 0, 200, None),
        ('lora:1', 1, 210, None),
    ])  # fmt: skip
    make_grid(tmp_path / 'grid-seen.control', tmp_path / 'seen.control.tsv', [
        ('full', 0, 100, report(8, 2, 0.3, [0.1, 0.2, 0.3])),
        ('full', 1, 100, report(8, 2, 0.3, [0.1, 0.6, 0.7])),
        ('lora:1', 0, 180, None),
        ('lora:1', 1, 190, None),
    ])  # fmt: skip
    known_unknown.main(['grid-all', 'grid-seen', 'grid-seen.control', '--json', 'rows.json'])
    out = capsys.readouterr().out
    written = json.loads((tmp_path / 'rows.json').read_text())
    rows = written['rows']
    assert [(r['method'], r['finetuning file']) for r in rows] == [
        (method, file)
        for method in ('full', 'lora:1')
        for file in ('all.tsv', 'seen.tsv', 'seen.control.tsv')
    ]
    full_all, full_seen, _, lora_all, _, _ = rows
    assert full_all['examples'] == 5 and full_seen['examples'] == 3
    assert full_all['dev accuracy'] == [20.0, 22.0] and full_all['analyzed'] == 2
    assert full_all['often'] == [50.0, 75.0] and full_all['never'] == [0.0, 50.0]
    assert full_all['dev confidence'] == [0.4, 0.5]
    assert full_all['invented confidence'] == [0.6, 0.3]
    assert full_all['invented above 0.5'] == pytest.approx([200 / 3, 100 / 3])
    assert full_seen['often'] == [100.0] * 3 and full_seen['invented above 0.5'] == [25, 50, 0]
    assert lora_all['analyzed'] == 0 and lora_all['often'] == []

    # Accuracy: full 21 (var 2) on all, 26 (var 4, 3 runs) on seen, 20 (var 0) on its
    # control; LoRA 31, 41 and 37 (var 2 each). A standard error is sqrt(var1/n1 + var2/n2).
    expected = {
        ('full', 'seen.tsv', 'seen.control.tsv'): (6, (4 / 3 + 0 / 2) ** 0.5),
        ('lora:1', 'seen.tsv', 'seen.control.tsv'): (4, (2 / 2 + 2 / 2) ** 0.5),
        ('full', 'seen.tsv', 'all.tsv'): (5, (4 / 3 + 2 / 2) ** 0.5),
        ('full', 'seen.control.tsv', 'all.tsv'): (-1, (0 / 2 + 2 / 2) ** 0.5),
        ('lora:1', 'seen.tsv', 'all.tsv'): (10, (2 / 2 + 2 / 2) ** 0.5),
        ('lora:1', 'seen.control.tsv', 'all.tsv'): (6, (2 / 2 + 2 / 2) ** 0.5),
        ('lora:1', 'all.tsv', 'full'): (10, (2 / 2 + 2 / 2) ** 0.5),
        ('lora:1', 'seen.tsv', 'full'): (15, (2 / 2 + 4 / 3) ** 0.5),
        ('lora:1', 'seen.control.tsv', 'full'): (17, (2 / 2 + 0 / 2) ** 0.5),
    }
    compared = written['differences']
    assert [(d['method'], d['finetuning file'], d['against']) for d in compared] == list(expected)
    for d in compared:
        key = (d['method'], d['finetuning file'], d['against'])
        assert d['dev accuracy'] == pytest.approx(expected[key]), key
    seen = compared[0]
    # dev confidence 0.3, 0.5, 0.4 against 0.3, 0.3; invented medians 0.3, 0.7, 0.3 against
    # 0.2, 0.6; the invented share 25, 50, 0 against 0, 66.7
    assert seen['dev confidence'] == pytest.approx([0.1, (0.01 / 3) ** 0.5])
    assert seen['invented confidence'] == pytest.approx([0.1 / 3, (0.16 / 3 / 3 + 0.08 / 2) ** 0.5])
    assert seen['invented above 0.5'] == pytest.approx(
        [25 - 100 / 3, (625 / 3 + 20000 / 9 / 2) ** 0.5]
    )
    assert compared[-1]['dev confidence'] is None  # no reports for LoRA

    lines = out.splitlines()
    table = lines[lines.index(known_unknown.HEADER) :][: 2 + 6]
    assert all(line.count('|') == table[0].count('|') for line in table)
    assert '| 21.0 ± 1.4 | 62.5 | 25.0 | 0.450 ± 0.071 | 0.450 ± 0.212 | 50.0 ± 23.6 |' in table[2]
    assert '| 2 (0 analyzed) | 31.0 ± 1.4 | - | - | - | - | - |' in table[5]
    differences = lines[lines.index(known_unknown.DIFFERENCES) :]
    assert len(differences) == 2 + 9
    assert all(line.count('|') == differences[0].count('|') for line in differences)
    assert differences[2] == (
        '| vanilla | full | seen.tsv | seen.control.tsv | +6.0 ± 1.2 | +0.100 ± 0.058 '
        '| +0.033 ± 0.240 | -8.3 ± 36.3 |'
    )
    assert (
        differences[-1]
        == '| vanilla | lora:1 | seen.control.tsv | full | +17.0 ± 1.0 | - | - | - |'
    )

    write(tmp_path / 'grid-seen' / 'vanilla.full.s0.analysis.json', json.dumps({'name': 'm'}))
    # two grid.py commands into one --outdir: other seeds of another file, or of other params
    make_grid(tmp_path / 'mixed', tmp_path / 'all.tsv', [('full', 0, 100, None)])
    record = json.loads((tmp_path / 'mixed' / 'grid.json').read_text())
    seed1 = json.loads(json.dumps(record['vanilla full s0']))
    seed1['made_with'].update(
        seed=1, finetune=['vanilla', 'wiki.txt', '--finetune_corpus_path', 'seen.tsv']
    )
    write(tmp_path / 'mixed' / 'grid.json', json.dumps({**record, 'vanilla full s1': seed1}))
    make_grid(
        tmp_path / 'other-params',
        tmp_path / 'all.tsv',
        [('full', 0, 100, None), ('full', 1, 90, None)],
    )
    record = json.loads((tmp_path / 'other-params' / 'grid.json').read_text())
    record['vanilla full s0']['made_with']['pretrained_md5'] = 'aaa'
    record['vanilla full s1']['made_with']['pretrained_md5'] = 'bbb'
    write(tmp_path / 'other-params' / 'grid.json', json.dumps(record))
    for args, error in [
        (
            ['grid-all', 'grid-all'],
            'grid-all and grid-all: both finetune vanilla (full) on a file named all.tsv',
        ),
        (['grid-seen'], 'vanilla.full.s0.analysis.json: not a report of analyze.py'),
        (['nowhere'], 'nowhere: no grid.json'),
        (['mixed'], 'mixed: the vanilla (full) runs have different finetuning files'),
        (
            ['other-params'],
            'other-params: the vanilla (full) runs have different pretrained params',
        ),
    ]:
        with pytest.raises(SystemExit) as stop:
            known_unknown.main(args)
        err = capsys.readouterr().err
        assert stop.value.code == 2 and error in err and len(err.splitlines()) == 1, err
