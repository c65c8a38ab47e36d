"""Ctrl-C and SIGTERM stop the test suite within seconds, with pytest's interrupted summary:
whether the test running is a training in pytest's own process (whose Stopper saves its
state after the step under way, then passes the stop on) or any other test. A stop waits
for at most one step, so the time allowed grows with the longest step measured: a slow
or busy machine's steps are long, and its stop comes as late."""

import os
import re
import signal
import subprocess
import sys
import time

import pytest

from conftest import ROOT

# tests of their own, run by a pytest of their own with this suite's conftest as a plugin;
# each waits (holds) where a user's Ctrl-C would find it
HELD = '''
import time
from pathlib import Path

import pytest
import conftest
import trainer

MARKER = Path(__file__).with_name('held')


def test_first():
    pass


def test_held_in_a_training(tiny):
    """run.main trains in this process: its Stopper holds the signal handlers."""
    update = trainer.Trainer.update

    def marked_update(self, loss):
        start = time.perf_counter()
        update(self, loss)
        with open(MARKER, 'a') as f:  # each step's seconds
            f.write(f"{time.perf_counter() - start}\\n")
        time.sleep(0.05)

    trainer.Trainer.update = marked_update
    code = conftest.main('pretrain', 'vanilla', 'wiki.txt', '--writing_params_path', 'v.params',
                         '--max_epochs', '10000', cwd=tiny)
    assert code == 0


def test_held_asleep():
    MARKER.write_text("0\\n")  # no step to wait for
    time.sleep(300)


def test_after():
    pass
'''


@pytest.mark.parametrize('signum', [signal.SIGINT, signal.SIGTERM])
@pytest.mark.parametrize(
    'held',
    [pytest.param('test_held_in_a_training', marks=pytest.mark.slow), 'test_held_asleep'],
)  # a training's first step takes seconds
def test_a_stop_signal_ends_the_suite_within_seconds(tmp_path, held, signum):
    (tmp_path / 'test_held.py').write_text(HELD)
    command = [
        sys.executable,
        '-m',
        'pytest',
        '-p',
        'conftest',
        '-p',
        'no:cacheprovider',
        '-o',
        'addopts=',
        '-q',
        'test_held.py',
        '-k',
        f'test_first or {held} or test_after',
    ]
    env_path = f"{ROOT / 'tests'}"
    process = subprocess.Popen(
        command,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, 'PYTHONPATH': env_path},
    )
    marker, deadline = tmp_path / 'held', time.time() + 300
    while not (marker.exists() and marker.read_text().count('\n') >= 1):
        assert process.poll() is None and time.time() < deadline, process.communicate()[0]
        time.sleep(0.05)
    process.send_signal(signum)
    start = time.time()
    try:
        output, _ = process.communicate(timeout=600)
    except subprocess.TimeoutExpired:
        process.kill()
        pytest.fail(f"pytest still ran 600 s after {signum.name}: {process.communicate()[0]}")
    seconds = time.time() - start
    longest_step = max(float(line) for line in marker.read_text().split())
    # the step under way, the state saved, and pytest's summary
    allowed = 10 + 3 * longest_step
    assert seconds < allowed, (seconds, longest_step, output)
    assert process.returncode == 2, output  # pytest's code for an interrupted run
    banner = re.search(r'^!+ (KeyboardInterrupt|Interrupted: stopped by SIG\w+) !+$', output, re.M)
    assert banner and banner.group(1) in (
        'KeyboardInterrupt',
        f'Interrupted: stopped by {signum.name}',
    )
    last = output.strip().splitlines()[-1]
    assert re.fullmatch(r'(1 failed, )?1 passed, \d+ deselected in [\d.]+s', last), output
