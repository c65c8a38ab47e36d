"""reached_by_documents.py: its bands, and its rows against a count by hand on a small
made-up world's two pretrainings with a floor; bad input as one line."""

import json

import pytest

import reached_by_documents
from conftest import write
from test_reached_over_minutes import pretraining

# name, place, documents
PEOPLE = [('Ana Bo', 'Kode', 1), ('Ib Ru', 'Fika', 2), ('Ol Ta', 'Kode', 3), ('Um Pe', 'Fika', 4)]


@pytest.fixture
def world(tmp_path):
    (tmp_path / 'w').mkdir()
    questions = ''.join(f"Where was {n} born?\t{p}\n" for n, p, _ in PEOPLE)
    write(tmp_path / 'w' / 'heldout.tsv', questions)
    people = [{'name': n, 'place': p, 'documents': d} for n, p, d in PEOPLE]
    record = {'knobs': {'documents': [1, 4], 'places': 4}, 'chance': 0.25, 'people': people}
    write(tmp_path / 'w' / 'world.json', json.dumps(record))
    return tmp_path / 'w'


def test_the_bands_cover_the_range_in_near_equal_widths():
    assert reached_by_documents.bands_of(4, 28, 4) == [(4, 9), (10, 15), (16, 21), (22, 28)]
    assert reached_by_documents.bands_of(1, 4, 2) == [(1, 2), (3, 4)]
    assert reached_by_documents.bands_of(16, 16, 1) == [(16, 16)]
    for low, high, count in [(1, 10, 3), (4, 28, 5), (2, 30, 7)]:
        bands = reached_by_documents.bands_of(low, high, count)
        covered = [n for a, b in bands for n in range(a, b + 1)]
        assert covered == list(range(low, high + 1))
        widths = [b - a + 1 for a, b in bands]
        assert max(widths) - min(widths) <= 1 and widths == sorted(widths)


def test_the_rows_by_hand(world, capsys):
    first = pretraining(
        world, 'rope',
        {('rope.pretrain.epoch2', 0): ['Kode', 'Kode', 'Kode', 'Fika'],  # people 1, 3, 4
         ('rope.pretrain.epoch2', 1): ['x'] * 4,  # another finetuning seed: not counted
         ('rope.pretrain.epoch1', 0): ['x'] * 4,  # an earlier checkpoint
         ('rope.untrained', 0): ['Fika', 'Fika', 'x', 'x']},  # the floor: person 2
        {1: 60.0, 2: 120.0},
    )  # fmt: skip
    second = pretraining(
        world, 'rope_seed1',
        {('rope.pretrain.epoch2', 0): ['x', 'Fika', 'x', 'x'],  # person 2
         ('rope.pretrain.epoch3', 0): ['x'] * 4},  # only this pretraining has epoch 3
        {2: 30.0, 3: 45.0},
    )  # fmt: skip
    bands = [(1, 2), (3, 4)]
    documents, _, _ = reached_by_documents.read_world(world)
    reached, floor, epoch = reached_by_documents.reached_by_band(
        [first, second], 'grid', None, 0, bands, documents
    )
    assert epoch == 2  # the last epoch both have
    assert reached == {first: [(1, 2), (2, 2)], second: [(1, 2), (0, 2)]}
    assert floor == [[(1, 2), (0, 2)]]
    reached_by_documents.main([str(first), str(second), '--grid', 'grid', '--bands', '2'])
    out = capsys.readouterr().out
    assert '1-2 documents,   2 people: 1, 1 right (50 ± 0%); floor 1' in out
    assert '3-4 documents,   2 people: 2, 0 right (50 ± 71%); floor 0' in out
    assert 'chance: 25.0%' in out


def test_it_draws(world, tmp_path):
    pytest.importorskip('matplotlib', reason='the picture needs matplotlib, an optional install')
    folder = pretraining(
        world, 'rope',
        {('rope.pretrain.epoch2', 0): ['Kode'] * 4, ('rope.untrained', 0): ['Fika'] * 4},
        {2: 60.0},
    )  # fmt: skip
    out = tmp_path / 'by_documents.png'
    reached_by_documents.main([str(folder), '--grid', 'grid', '--bands', '4', '--plot', str(out)])
    assert out.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'


@pytest.mark.parametrize(
    'broken, error',
    [
        ('bands', '--bands 5: from 1 to 4 (1-4 documents)'),
        ('empty', '--bands 4: no held-out person has 2 documents; ask for fewer bands'),
        ('epoch', 'rope/grid: no checkpoint of epoch 7 with seed 0'),
        ('predictions', 'rope.pretrain.epoch2.full.s0.dev.predictions: cannot read'),
        ('short', 'rope/grid: 3 predictions for 4 held-out people'),
        ('stranger', 'rope/grid: Zo Xi is not a person of the world'),
        ('world', 'w/world.json: not a world of small_world.py'),
        ('worlds', 'pretrainings of 2 worlds'),
    ],
)
def test_bad_input_is_one_line(world, tmp_path, capsys, broken, error):
    answers = ['Kode'] * (3 if broken == 'short' else 4)
    folder = pretraining(world, 'rope', {('rope.pretrain.epoch2', 0): answers}, {2: 60})
    argv = ['--grid', 'grid', str(folder)]
    if broken == 'bands':
        argv += ['--bands', '5']
    elif broken == 'empty':
        write(world / 'heldout.tsv', 'Where was Ana Bo born?\tKode\n' * 4)
        argv += ['--bands', '4']
    elif broken == 'epoch':
        argv += ['--epoch', '7']
    elif broken == 'predictions':
        (folder / 'grid' / 'rope.pretrain.epoch2.full.s0.dev.predictions').unlink()
    elif broken == 'stranger':
        write(
            world / 'heldout.tsv',
            'Where was Ana Bo born?\tKode\n' * 3 + 'Where was Zo Xi born?\tKode\n',
        )
    elif broken == 'world':
        write(world / 'world.json', json.dumps({'knobs': {}}))
    elif broken == 'worlds':
        (tmp_path / 'other').mkdir()
        argv.append(str(pretraining(tmp_path / 'other', 'rope', {}, {2: 60})))
    with pytest.raises(SystemExit) as stop:
        reached_by_documents.main(argv)
    assert stop.value.code != 0
    err = capsys.readouterr().err.strip()
    assert error in err and len(err.splitlines()) == 1
