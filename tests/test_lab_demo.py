"""research/lab_demo.py at a tiny size: two worlds of the same people differing only in their
biographies, and a table whose three accuracies are those of the held-out predictions it
made; run again, it makes nothing twice and prints the same table; stopped by Ctrl-C, its
pretraining saves its state and the same command goes on from it."""

import os
import re
import signal
import subprocess

import pytest

import lab_demo
import utils
from conftest import PYTHON, ROOT, held_grid, wait_for

TINY = ['--people', 8, '--pretrain_max_epochs', 1, '--device', 'cpu', '--precision', 'fp32']


def demo(tmp_path, capfd, *argv):
    lab_demo.main(['--outdir', str(tmp_path / 'lab'), *map(str, TINY), *map(str, argv)])
    out = capfd.readouterr().out
    head, _, table = out.rpartition('\nThe 2 held-out people answered by rope after finetuning')
    return head, table.splitlines()[2:]


def right(world, model):
    """RIGHT/TOTAL of a run's held-out predictions, counted here from its files."""
    predictions = (world / 'grid' / f"{model}.full.s0.dev.predictions").read_text().splitlines()
    total, correct = utils.evaluate_places(str(world / 'heldout.tsv'), predictions)
    return f"{int(correct)}/{int(total)}"


def test_the_demo_prints_what_its_predictions_say(tmp_path, capfd):
    head, rows = demo(tmp_path, capfd, '--pretrain_seeds', 1)
    one, paraphrased = tmp_path / 'lab' / 'one', tmp_path / 'lab' / 'paraphrased'
    for name in ('finetune.tsv', 'heldout.tsv'):  # the same people, split and places
        assert (one / name).read_bytes() == (paraphrased / name).read_bytes()
    assert (one / 'world.txt').read_bytes() != (paraphrased / 'world.txt').read_bytes()
    pretrainings = re.findall(r'^== rope\.s1 pretrain: .*run\.py pretrain rope (.*)$', head, re.M)
    assert len(pretrainings) == 2  # one per world, by grid.py, on the 2021 schedule
    assert all('--batch_size 32 --edition 2021' in argv for argv in pretrainings), pretrainings
    assert [row.split() for row in rows] == [
        [str(seed), right(paraphrased, f'rope.s{seed}.untrained'), right(one, f'rope.s{seed}'),
         right(paraphrased, f'rope.s{seed}')]
        for seed in [1]
    ]  # fmt: skip

    again_head, again = demo(tmp_path, capfd, '--pretrain_seeds', 1)
    assert again == rows
    assert 'run.py pretrain' not in again_head and 'research/untrained.py' not in again_head
    assert again_head.count('== rope.s1 pretrain: ') == 2  # grid.py: 'exists, skipped'


@pytest.mark.parametrize(
    'argv, error',
    [(['--people', '2'], "--people 2: too few to hold a quarter out"),
     (['--variant', 'gpt5'], "--variant: invalid choice: 'gpt5'")],
)  # fmt: skip
def test_a_bad_flag_is_one_line(tmp_path, capsys, argv, error):
    with pytest.raises(SystemExit) as stop:
        lab_demo.main(['--outdir', str(tmp_path), *argv])
    assert stop.value.code != 0
    assert error in capsys.readouterr().err


# lab_demo.py as its command line runs it, the pretraining of each of its grid.py commands
# held after step 2 (tests/hold_at_step.py) until it is told to stop; Ctrl-C raises
# KeyboardInterrupt in the demo and in grid.py as in a terminal, also where the suite runs
# as a background job
HELD_GRID = held_grid(2)
HELD_DEMO = f"""
import signal
import subprocess
import sys
signal.signal(signal.SIGINT, signal.default_int_handler)
sys.path.insert(0, {str(ROOT / 'research')!r})
import lab_demo
popen = subprocess.Popen
def held(command, *args, **kwargs):
    if command[1].endswith('grid.py'):
        command = [command[0], '-c', {HELD_GRID!r}, *command[2:]]
    return popen(command, *args, **kwargs)
lab_demo.subprocess.Popen = held
lab_demo.main(sys.argv[1:])
"""


@pytest.mark.skipif(os.name == 'nt', reason="process groups are POSIX's")
@pytest.mark.slow
def test_a_ctrl_c_keeps_the_pretrainings_state_and_the_same_command_goes_on(tmp_path, capfd):
    argv = ['--outdir', str(tmp_path / 'lab'), *map(str, TINY)]
    process = subprocess.Popen([PYTHON, '-c', HELD_DEMO, *argv], cwd=tmp_path, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               start_new_session=True)  # fmt: skip
    wait_for(tmp_path / 'held.0', process)
    os.killpg(process.pid, signal.SIGINT)  # a terminal's Ctrl-C: the demo and its grid.py
    _, err = process.communicate(timeout=120)
    assert process.returncode != 0 and 'Traceback' not in err, err
    assert err.endswith("stopped: run the same command again to go on where it stopped\n")
    state = tmp_path / 'lab' / 'one' / 'grid' / 'rope.s0.pretrain.params.resume'
    assert state.exists() and not state.with_suffix('').exists()

    head, rows = demo(tmp_path, capfd)
    assert re.search(r'^== rope\.s0 pretrain: .* --resume$', head, re.M), head
    assert not state.exists() and len(rows) == 1
