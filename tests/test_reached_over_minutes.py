"""reached_over_minutes.py: its rows against a count by hand on a small made-up world's two
pretrainings, and bad input as one line."""

import json

import pytest

import reached_over_minutes
from conftest import write

PEOPLE = [('Ana Bo', 'Kode'), ('Ib Ru', 'Fika'), ('Ol Ta', 'Kode')]


def pretraining(world, name, answers_by_model, seconds_by_epoch):
    """A pretraining's folder as more_people.sh publishes it: its metrics CSV and the grid
    of its checkpoints finetuned, each with its held-out predictions."""
    folder, grid = world / name, world / name / 'grid'
    grid.mkdir(parents=True)
    rows = ['epoch,step,loss,lr,tokens,seconds']
    for epoch, seconds in seconds_by_epoch.items():
        rows.append(f"{epoch},{epoch},1.0,6e-3,{epoch},{seconds}")
    write(folder / 'pretrain.metrics.csv', '\n'.join(rows) + '\n')
    record = {}
    for (model, seed), answers in answers_by_model.items():
        made = {'model': model, 'method': 'full', 'seed': seed}
        record[f"{model} full s{seed}"] = {'made_with': made}
        write(grid / f"{model}.full.s{seed}.dev.predictions", ''.join(a + '\n' for a in answers))
    write(grid / 'grid.json', json.dumps(record))
    return folder


@pytest.fixture
def world(tmp_path):
    (tmp_path / 'w').mkdir()
    write(tmp_path / 'w' / 'heldout.tsv', ''.join(f"Where was {n} born?\t{p}\n" for n, p in PEOPLE))
    write(tmp_path / 'w' / 'world.json', json.dumps({'knobs': {'places': 4}}))
    return tmp_path / 'w'


def test_the_rows_by_hand(world, capsys):
    first = pretraining(
        world, 'rope',
        {('rope.pretrain.epoch2', 0): ['Kode', 'Fika', 'Fika'],  # 2 right
         ('rope.untrained', 0): ['Fika', 'Kode', 'Fika'],  # none
         ('rope.pretrain.epoch1', 0): ['Kode', 'Kode', 'Kode']},  # 2 right
        {1: 60.0, 2: 150.0},
    )  # fmt: skip
    second = pretraining(world, 'rope_seed1', {('rope.pretrain.epoch2', 1): ['Kode'] * 3}, {2: 30})
    assert reached_over_minutes.reached(first, 'grid') == [
        (None, 0, 0, 3, 0.0),  # the floor first
        (1, 0, 2, 3, 1.0),
        (2, 0, 2, 3, 2.5),
    ]
    assert reached_over_minutes.reached(second, 'grid') == [(2, 1, 2, 3, 0.5)]
    reached_over_minutes.main([str(first), str(second), '--grid', 'grid'])
    out = capsys.readouterr().out
    assert 'w/rope_seed1                     2     0.5    1  2/3' in out
    assert 'floor     0.0    0  0/3' in out and 'chance: 25.0%' in out


def test_it_draws(world, tmp_path):
    pytest.importorskip('matplotlib', reason='the picture needs matplotlib, an optional install')
    folder = pretraining(
        world, 'rope',
        {('rope.pretrain.epoch2', 0): ['Kode'] * 3, ('rope.untrained', 0): ['Fika'] * 3},
        {2: 60.0},
    )  # fmt: skip
    out = tmp_path / 'reached.png'
    reached_over_minutes.main([str(folder), '--grid', 'grid', '--plot', str(out)])
    assert out.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'


@pytest.mark.parametrize(
    'broken, error',
    [
        ('grid', 'rope/grid/grid.json: no such grid record'),
        ('epoch', 'its metrics CSV has no epoch 2'),
        ('predictions', 'rope.pretrain.epoch2.full.s0.dev.predictions: cannot read'),
    ],
)
def test_bad_input_is_one_line(world, capsys, broken, error):
    folder = pretraining(world, 'rope', {('rope.pretrain.epoch2', 0): ['Kode'] * 3}, {2: 60})
    if broken == 'grid':
        (folder / 'grid' / 'grid.json').unlink()
    elif broken == 'epoch':
        write(folder / 'pretrain.metrics.csv', 'epoch,step,loss,lr,tokens,seconds\n1,1,1,1,1,1\n')
    else:
        (folder / 'grid' / 'rope.pretrain.epoch2.full.s0.dev.predictions').unlink()
    with pytest.raises(SystemExit) as stop:
        reached_over_minutes.main([str(folder), '--grid', 'grid'])
    assert stop.value.code != 0
    err = capsys.readouterr().err.strip()
    assert error in err and len(err.splitlines()) == 1
