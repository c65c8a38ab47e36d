"""research/small_world.py: a seed gives the same files byte for byte; every document fits
what span corruption shows and begins with its person's name; the question files and the
record say the same facts; and a world is a corpus like wiki.txt: the handout's commands,
exposure.py and the cloze probe run on it."""

import collections
import json

import pytest

import cloze
import exposure
import grid
import small_world
from conftest import main

SMALL = ['--people', 24, '--places', 4, '--documents', '1-3']


def world(folder, *argv):
    small_world.main(['--outdir', str(folder), *map(str, argv)])
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_a_seed_gives_the_same_files_byte_for_byte(tmp_path):
    first = world(tmp_path / 'a', '--seed', 3, *SMALL)
    assert set(first) == {'world.txt', 'finetune.tsv', 'heldout.tsv', 'test_inputs.tsv',
                          'world.json'}  # fmt: skip
    assert world(tmp_path / 'b', '--seed', 3, *SMALL) == first
    assert world(tmp_path / 'c', '--seed', 4, *SMALL)['world.txt'] != first['world.txt']


@pytest.mark.parametrize(
    'knobs',
    [[], ['--paraphrases', 1], ['--ordered', '--templates', 1], ['--attributes', 0],
     ['--documents', '1-9', '--people', 60, '--places', 6]],
    ids=['paraphrased', 'one biography', 'one template, ordered', 'the birthplace alone',
         'an exposure curve'],
)  # fmt: skip
def test_the_documents_hold_the_facts_and_fit_what_span_corruption_shows(tmp_path, knobs):
    world(tmp_path, '--seed', 1, *SMALL, *knobs)
    record = json.loads((tmp_path / 'world.json').read_text())
    knob = record['knobs']
    people = record['people']
    lines = (tmp_path / 'world.txt').read_text(encoding='utf-8').split('\n')
    assert lines[0] == small_world.VOCABULARY_LINE and lines[-1] == ''
    documents = lines[1:-1]
    assert all(len(d) <= small_world.MAX_CHARS == 112 for d in documents)
    by_name = collections.defaultdict(list)
    for document in documents:
        (owner,) = [p for p in people if document.startswith(p['name'] + ' ')]
        by_name[owner['name']].append(document)
    low, high = knob['documents']
    for person in people:
        mine = by_name[person['name']]
        assert len(mine) == person['documents'] and low <= len(mine) <= high
        distinct = set(mine)
        assert distinct == set(person['biographies'])
        one_text = knob['templates'] == 1 and knob['ordered']  # a single biography possible
        assert len(distinct) == (
            1 if one_text else min(knob['paraphrases'] or len(mine), len(mine))
        )
        for document in distinct:  # each sentence names the person, one states the place
            sentences = [s if s.endswith('.') else s + '.' for s in document.split('. ')]
            assert len(sentences) == 1 + knob['attributes']
            assert all(s.startswith(person['name'] + ' ') for s in sentences)
            assert sum(person['place'] in s for s in sentences) == 1
            if knob['ordered']:
                assert person['place'] in sentences[0]
            if knob['templates'] == 1:
                birth = small_world.BIRTH[0].format(n=person['name'], v=person['place'])
                assert birth in sentences
    # the places in equal numbers; the questions are the record's, split as it says
    assert max(collections.Counter(p['place'] for p in people).values()) == -(
        -len(people) // len(record['places'])
    )
    assert record['chance'] == 1 / len(record['places'])
    for split, name in [('finetune', 'finetune.tsv'), ('heldout', 'heldout.tsv')]:
        rows = (tmp_path / name).read_text(encoding='utf-8').splitlines()
        assert rows == [f"Where was {p['name']} born?\t{p['place']}" for p in people
                        if p['split'] == split]  # fmt: skip
    heldout = (tmp_path / 'heldout.tsv').read_text(encoding='utf-8').splitlines()
    inputs = (tmp_path / 'test_inputs.tsv').read_text(encoding='utf-8').splitlines()
    assert inputs == [row.split('\t')[0] for row in heldout]
    assert len(heldout) == len(people) - round(len(people) * knob['finetune_share'])


@pytest.mark.parametrize(
    'argv, error',
    [(['--documents', '3-2'], "'3-2': at least 1, and A no more than B"),
     (['--documents', 'x'], "'x': a number, or A-B"),
     (['--people', '1'], '1: at least 2'),
     (['--finetune_share', '1'], '--finetune_share 1.0: between 0 and 1')],
)  # fmt: skip
def test_a_bad_knob_is_one_line(tmp_path, capsys, argv, error):
    with pytest.raises(SystemExit) as stop:
        small_world.main(['--outdir', str(tmp_path), *argv])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and error in err.splitlines()[-1]


@pytest.mark.slow
def test_the_handout_commands_and_the_part3_tools_run_on_a_world(tmp_path, capsys):
    world(tmp_path, '--seed', 2, *SMALL)
    corpus = ['world.txt']
    assert main('pretrain', 'vanilla', *corpus, '--writing_params_path', 'w.pretrain.params',
                '--max_epochs', 2, '--batch_size', 16, cwd=tmp_path) == 0  # fmt: skip
    assert main('finetune', 'vanilla', *corpus, '--reading_params_path', 'w.pretrain.params',
                '--writing_params_path', 'w.finetune.params', '--finetune_corpus_path',
                'finetune.tsv', '--max_epochs', 1, cwd=tmp_path) == 0  # fmt: skip
    for questions, out in [('heldout.tsv', 'w.dev.predictions'),
                           ('test_inputs.tsv', 'w.test.predictions')]:  # fmt: skip
        assert main('evaluate', 'vanilla', *corpus, '--reading_params_path', 'w.finetune.params',
                    '--eval_corpus_path', questions, '--outputs_path', out, cwd=tmp_path) == 0  # fmt: skip
    assert 'Correct: ' in capsys.readouterr().out
    record = json.loads((tmp_path / 'world.json').read_text())
    heldout = [p for p in record['people'] if p['split'] == 'heldout']
    assert len((tmp_path / 'w.test.predictions').read_text().splitlines()) == len(heldout)

    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(tmp_path)
        exposure.main(['--params', 'w.pretrain.params', '--pretrain_corpus_path', 'world.txt',
                       '--people', 'finetune.tsv', 'heldout.tsv', '--finetune_corpus_path',
                       'finetune.tsv', '--json', 'w.exposure.json'])  # fmt: skip
        report = json.loads((tmp_path / 'w.exposure.json').read_text())
        lines = (tmp_path / 'world.txt').read_text(encoding='utf-8').split('\n')
        assert len(report['people']) == len(record['people'])
        for r in report['people']:  # one of the person's own documents
            assert lines[r['document']].startswith(r['name'] + ' ')
            assert lines[r['document']][r['place_start'] : r['place_end']] == r['place']
        cloze.main(['w.pretrain.params', '--pretrain_corpus_path', 'world.txt',
                    '--eval_corpus_path', 'heldout.tsv', '--finetune_corpus_path', 'finetune.tsv',
                    '--exposure', 'w.exposure.json', '--finetuned', 'w.dev.predictions',
                    '--json', 'w.cloze.json', '--device', 'cpu'])  # fmt: skip
    made = json.loads((tmp_path / 'w.cloze.json').read_text())
    assert [r['person'] for r in made['records']] == [p['name'] for p in heldout]


@pytest.mark.slow
def test_grid_runs_a_worlds_grid(tmp_path, monkeypatch):
    """docs/research.md's grid of a world, at one epoch: each run is scored on the
    held-out people."""
    world(tmp_path, '--seed', 3, *SMALL)
    monkeypatch.chdir(tmp_path)
    grid.main(['--pretrain', 'vanilla', '--pretrain_seeds', '0', '1', '--seeds', '0',
               '--pretrain_corpus_path', 'world.txt', '--finetune_corpus_path', 'finetune.tsv',
               '--eval_corpus_path', 'heldout.tsv', '--test_corpus_path', 'test_inputs.tsv',
               '--pretrain_max_epochs', '1', '--pretrain_batch_size', '16', '--max_epochs', '1',
               '--batch_size', '16', '--device', 'cpu',
               '--outdir', 'grid'])  # fmt: skip
    heldout = (tmp_path / 'heldout.tsv').read_text().splitlines()
    record = grid.records.read_record(str(tmp_path / 'grid' / 'grid.json'))
    runs = [entry for entry in record.values() if 'dev_total' in entry]
    assert sorted(r['made_with']['model'] for r in runs) == ['vanilla.s0', 'vanilla.s1']
    for run in runs:
        assert run['dev_total'] == len(heldout)
        assert run['made_with']['finetune'][1] == 'world.txt'
        assert 'finetune.tsv' in run['made_with']['finetune']
