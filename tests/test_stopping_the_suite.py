"""Ctrl-C and SIGTERM stop the test suite within seconds, with pytest's interrupted summary:
whether the test running is a training in pytest's own process (whose Stopper saves its
state, then passes the stop on) or any other test."""

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
        update(self, loss)
        MARKER.touch()
        time.sleep(0.05)

    trainer.Trainer.update = marked_update
    code = conftest.main('pretrain', 'vanilla', 'wiki.txt', '--writing_params_path', 'v.params',
                         '--max_epochs', '10000', cwd=tiny)
    assert code == 0


def test_held_asleep():
    MARKER.touch()
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
    deadline = time.time() + 120
    while not (tmp_path / 'held').exists():
        assert process.poll() is None and time.time() < deadline, process.communicate()[0]
        time.sleep(0.05)
    process.send_signal(signum)
    start = time.time()
    try:
        output, _ = process.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        pytest.fail(f"pytest still ran 30 s after {signum.name}: {process.communicate()[0]}")
    assert time.time() - start < 10, output
    assert process.returncode == 2, output  # pytest's code for an interrupted run
    banner = re.search(r'^!+ (KeyboardInterrupt|Interrupted: stopped by SIG\w+) !+$', output, re.M)
    assert banner and banner.group(1) in (
        'KeyboardInterrupt',
        f'Interrupted: stopped by {signum.name}',
    )
    last = output.strip().splitlines()[-1]
    assert re.fullmatch(r'(1 failed, )?1 passed, \d+ deselected in [\d.]+s', last), output
