"""reached_by_variant.py: its rows against a count by hand on a small made-up world's
pretrainings of two variants, one with a floor; bad input as one line."""

import pytest

import reached_by_variant
from machinery import files
from test_reached_over_minutes import pretraining, world  # noqa: F401 (a fixture)


def pretrainings(world):  # noqa: F811 (the fixture)
    """Two RoPE seeds (seed 0 with its floor and an 80-epoch checkpoint the other lacks)
    and one vanilla seed. The world's three held-out people were born in Kode, Fika, Kode."""
    return [
        pretraining(
            world, 'rope',
            {('rope.pretrain.epoch40', 0): ['Kode', 'Fika', 'Kode'],  # 3 right
             ('rope.pretrain.epoch40', 1): ['x'] * 3,  # another finetuning seed: not counted
             ('rope.pretrain.epoch20', 0): ['x', 'Fika', 'x'],  # 1
             ('rope.pretrain.epoch80', 0): ['Kode'] * 3,  # only seed 0 has epoch 80
             ('rope.untrained', 0): ['Kode', 'x', 'x'],  # the floor: 1
             ('rope.untrained', 1): ['x'] * 3},  # 0
            {20: 60.0, 40: 120.0, 80: 240.0},
        ),
        pretraining(
            world, 'rope_seed3',
            {('rope.pretrain.epoch40', 0): ['Kode', 'x', 'x'],  # 1
             ('rope.pretrain.epoch20', 0): ['x'] * 3},  # 0
            {20: 50.0, 40: 100.0},
        ),
        pretraining(
            world, 'vanilla',
            {('vanilla.pretrain.epoch40', 0): ['x', 'x', 'Kode'],  # 1
             ('vanilla.pretrain.epoch20', 0): ['x'] * 3},  # 0
            {20: 40.0, 40: 80.0},
        ),
    ]  # fmt: skip


def test_the_rows_by_hand(world, capsys):  # noqa: F811 (the fixture)
    folders = pretrainings(world)
    reached, floor, total = reached_by_variant.reached_by_variant(folders, 'grid', 0)
    assert reached == {
        'rope': {20: [(0, 1), (3, 0)], 40: [(0, 3), (3, 1)]},  # epoch 80: not every one's
        'vanilla': {20: [(0, 0)], 40: [(0, 1)]},
    }
    assert floor == {'rope': [1, 0], 'vanilla': []} and total == 3
    with pytest.raises(files.UserError, match='no epoch that every pretraining'):
        reached_by_variant.reached_by_variant(folders, 'grid', 1)  # finetuning seed 1: rope's only
    reached_by_variant.main([*map(str, folders), '--grid', 'grid'])
    out = capsys.readouterr().out
    assert 'rope epoch  40, seeds 0, 3: 3, 1 (2.0 ± 1.4, 1-3); floor 1, 0' in out
    assert 'vanilla epoch  20, seeds 0: 0 (0.0, 0-0); floor -' in out
    assert 'chance: 25.0%' in out


def test_it_draws(world, tmp_path):  # noqa: F811 (the fixture)
    pytest.importorskip('matplotlib', reason='the picture needs matplotlib, an optional install')
    out = tmp_path / 'by_variant.png'
    reached_by_variant.main([*map(str, pretrainings(world)), '--grid', 'grid', '--plot', str(out)])
    assert out.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'


@pytest.mark.parametrize(
    'broken, error',
    [
        ('name', 'rope_batch16: not a pretraining named VARIANT or VARIANT_seedN'),
        ('missing', 'perceiver_seed?: no such folder'),  # a shell's glob that matched none
        ('twice', 'rope: pretraining seed given twice ([0, 0])'),  # rope and rope_seed0
        ('epochs', 'no epoch that every pretraining'),
        ('worlds', 'pretrainings of 2 worlds'),
    ],
)
def test_bad_input_is_one_line(world, tmp_path, capsys, broken, error):  # noqa: F811
    folder = pretraining(world, 'rope', {('rope.pretrain.epoch2', 0): ['Kode'] * 3}, {2: 60})
    argv = ['--grid', 'grid', str(folder)]
    if broken == 'name':
        argv.append(str(pretraining(world, 'rope_batch16', {}, {})))
    elif broken == 'missing':
        argv.append(str(world / 'perceiver_seed?'))
    elif broken == 'twice':
        argv.append(
            str(pretraining(world, 'rope_seed0', {('rope.pretrain.epoch2', 0): ['x'] * 3}, {2: 60}))
        )
    elif broken == 'epochs':
        argv.append(
            str(pretraining(world, 'rope_seed1', {('rope.pretrain.epoch3', 0): ['x'] * 3}, {3: 60}))
        )
    elif broken == 'worlds':
        (tmp_path / 'other').mkdir()
        argv.append(str(pretraining(tmp_path / 'other', 'rope', {}, {2: 60})))
    with pytest.raises(SystemExit) as stop:
        reached_by_variant.main(argv)
    assert stop.value.code != 0
    err = capsys.readouterr().err.strip()
    assert error in err and len(err.splitlines()) == 1
