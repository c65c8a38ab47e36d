"""Shared fixtures and helpers: src/ on the path, a tiny corpus the tests build
themselves, untrained params of every variant for it, the real data (copied from
../shared/data into data/ when it is there; tests that need it skip, saying so, when it
is not), and run.py's command line, in this process or from the shell."""

import random
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / folder) for folder in ('src', 'research', 'tools')]
import machinery.cpu_libraries  # noqa: E402,F401 (before torch loads, as the scripts do)

import contextlib  # noqa: E402
import os  # noqa: E402
import re  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402

import run  # noqa: E402
from slurm_cluster import slurm  # noqa: E402,F401 (the one-node Slurm's fixture)

DATA_FILES = ['wiki.txt', 'birth_places_train.tsv', 'birth_dev.tsv', 'birth_test_inputs.tsv']
SHARED_DATA = ROOT.parent / 'shared' / 'data'
NO_DATA = (
    "needs the assignment's data in data/: python tools/get_data.py fetches it (data/README.md)"
)

NAMES = [
    'Ada Lovelace',
    'Alan Turing',
    'Grace Hopper',
    'Claude Shannon',
    'John von Neumann',
    'Emmy Noether',
    'Kurt Godel',
    'Ida Rhodes',
    'Niels Bohr',
    'Lise Meitner',
    'Max Born',
    'Marie Curie',
    'Paul Dirac',
    'Hedy Lamarr',
    'Carl Gauss',
    'Sofia Kovalevskaya',
]
PLACES = ['London', 'Paris', 'Vienna', 'Berlin', 'Rome', 'Oslo', 'Prague', 'Madrid']


# the tests never reach the course's addresses: a missing data file fails at once, or is
# fetched from a source a test gives (tests/test_course_data.py)
os.environ['COURSE_DATA_SOURCES'] = ''


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
stops = []  # the stop signals the suite received


def stop_the_suite(signum, frame):
    """Ctrl-C or SIGTERM: the running test is interrupted, and pytest ends with its
    interrupted summary. A test that turns the KeyboardInterrupt into something else (run.py
    exits with 130) still stops the suite after it (pytest_runtest_protocol); a training's
    Stopper saves its state, then passes the stop on here."""
    stops.append(signum)
    raise KeyboardInterrupt


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    yield
    if stops:
        item.session.shouldstop = f"stopped by {signal.Signals(stops[0]).name}"


@pytest.fixture(autouse=True)
def stop_signals_restored():
    """No test leaves a signal handler of its own (a run's Stopper) in pytest's process."""
    yield
    left = {s: signal.getsignal(s) for s in STOP_SIGNALS if signal.getsignal(s) != stop_the_suite}
    for signum in left:
        signal.signal(signum, stop_the_suite)
    assert not left, f"the test left its own handlers installed: {left}"


@contextlib.contextmanager
def run_signal_handlers():
    """Python's own handlers of Ctrl-C and SIGTERM, as a run's process has them, for a test
    that signals its own process to stop a training in it."""
    for signum in STOP_SIGNALS:
        signal.signal(
            signum, signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL
        )
    try:
        yield
    finally:
        for signum in STOP_SIGNALS:
            signal.signal(signum, stop_the_suite)


def pytest_configure(config):
    for signum in STOP_SIGNALS:
        signal.signal(signum, stop_the_suite)
    for name in DATA_FILES:
        target = ROOT / 'data' / name
        if not target.exists() and (SHARED_DATA / name).exists():
            shutil.copy(SHARED_DATA / name, target)


@pytest.fixture
def real_data():
    """Path of data/, or a skip when the assignment's files are not there."""
    missing = [n for n in DATA_FILES if not (ROOT / 'data' / n).exists()]
    if missing:
        pytest.skip(f"{NO_DATA}; missing: {', '.join(missing)}")
    return ROOT / 'data'


def tiny_corpus():
    """(wiki text, {name: place}): two short lines about each person, and a few others."""
    rng = random.Random(0)
    people = {name: rng.choice(PLACES) for name in NAMES}
    lines = []
    for name, place in people.items():
        lines.append(f"{name} was born in {place}. {name.split()[0]} studied there.")
        lines.append(
            f"{name} (born {rng.randint(1800, 1950)}) worked on {rng.choice(['maths', 'physics', 'codes'])}."
        )
    lines += [
        'Short.',
        'ab',
        'London is a city. Paris is a city. Vienna, Berlin and Rome too.',
        'Where was each of them born? Read on.',
    ]
    return '\n'.join(lines) + '\n', people


@pytest.fixture
def tiny(tmp_path):
    """A directory with wiki.txt, train.tsv, dev.tsv and test.tsv built from tiny_corpus()."""
    text, people = tiny_corpus()
    (tmp_path / 'wiki.txt').write_text(text, encoding='utf-8')
    rows = [f"Where was {n} born?\t{p}" for n, p in people.items()]
    (tmp_path / 'train.tsv').write_text('\n'.join(rows[:12]) + '\n', encoding='utf-8')
    (tmp_path / 'dev.tsv').write_text('\n'.join(rows[12:]) + '\n', encoding='utf-8')
    (tmp_path / 'test.tsv').write_text(
        '\n'.join(r.split('\t')[0] for r in rows[12:]) + '\n', encoding='utf-8'
    )
    return tmp_path


PYTHON = sys.executable


CORRECT_LINE = re.compile(r'^Correct: (\d+\.0) out of (\d+\.0): ([\d.e-]+)%$', re.M)


def on_cpu(args):
    """args with --device cpu unless they name a device: the suite's exact comparisons are
    the CPU's (tests/test_accelerators.py checks CUDA and MPS against it)."""
    args = [str(a) for a in args]
    return args if '--device' in args else args + ['--device', 'cpu']


def cli(*args, cwd, check=True, env=None):
    """python src/run.py ARGS from `cwd`, as a student runs it (on the CPU)."""
    result = subprocess.run(
        [PYTHON, str(ROOT / 'src' / 'run.py'), *on_cpu(args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        env=env,
    )
    if check:
        assert result.returncode == 0, result.stderr
    assert 'Traceback' not in result.stderr
    return result


def main(*args, cwd):
    """run.main in this process (faster, on the CPU); returns the exit code, 0 when it returned."""
    old = os.getcwd()
    os.chdir(cwd)
    try:
        run.main(on_cpu(args))
        return 0
    except SystemExit as e:
        return e.code
    finally:
        os.chdir(old)


def write(path, text, encoding='utf-8'):
    path.write_bytes(text.encode(encoding) if isinstance(text, str) else text)
    return path.name


@pytest.fixture(scope='session')
def untrained_params(tmp_path_factory):
    """{variant}.params of an untrained model of each variant for tiny's corpus (the
    perceiver's with --bottleneck_dim 64), made once: a hundred tests copy them."""
    import dataset
    import run

    folder = tmp_path_factory.mktemp('untrained')
    ds = dataset.CharCorruptionDataset(tiny_corpus()[0], 128)
    for variant in ('vanilla', 'synthesizer', 'rope', 'perceiver'):
        torch.manual_seed(0)
        gpt = run.new_model(variant, ds.vocab_size, 64)
        torch.save(gpt.state_dict(), folder / f'{variant}.params')
    return folder


@pytest.fixture
def params(tiny, untrained_params):
    """tiny, with {variant}.params: an untrained model of each variant for its corpus."""
    for path in untrained_params.iterdir():
        shutil.copy(path, tiny / path.name)
    return tiny


def packed_loss(gpt, idx, targets, packing=None):
    """The loss the trainer computes: GPT.forward on only the positions that can change it."""
    from machinery.packing import Packing, target_lengths

    if packing is None:
        packing = Packing(target_lengths(targets), device=targets.device)
    return gpt(idx, targets, packing=packing)[1]


def stopped_at_call(call, function, training):
    """`function` (a training's step or forward) wrapped so that its call-th call asks the
    training (a Trainer or SharedRuns) to stop, as Ctrl-C does: it stops after that step,
    its state saved. call None: never."""
    calls = []

    def counted(*args, **kwargs):
        calls.append(1)
        if len(calls) == call:
            training.stopper.signal = 2
        return function(*args, **kwargs)

    return counted


def wait_for(path, process, seconds=120):
    """Until `path` exists; a process that ends first is a failure, with its error."""
    deadline = time.time() + seconds
    while not path.exists():
        if process.poll() is not None or time.time() > deadline:
            process.kill()
            pytest.fail(f"{path.name} never appeared: {process.communicate()[1][-2000:]}")
        time.sleep(0.02)


def held_grid(step):
    """grid.py as its command line runs it (`python -c` this), each pretraining process held
    after `step` (tests/hold_at_step.py, marker held.RANK) until it is told to stop; Ctrl-C
    raises KeyboardInterrupt in it as in a terminal, also where the suite runs as a
    background job (whose commands inherit SIGINT ignored, and Python then leaves it
    ignored)."""
    return f"""
import signal
import sys
signal.signal(signal.SIGINT, signal.default_int_handler)
sys.path.insert(0, {str(ROOT / 'research')!r})
import grid
command_of = grid.group_command
def held(group):
    command, log = command_of(group)
    return [command[0], {str(ROOT / 'tests' / 'hold_at_step.py')!r}, '{step}', 'held', *command[1:]], log
grid.group_command = held
grid.main(sys.argv[1:])
"""


@pytest.fixture(scope='session')
def grader_python():
    """A Python for Gradescope's run_autograder (its VENV) that the sandbox's user can read,
    as setup.sh's virtual environment of the system's python3 is: where the root grader
    hands the students' code to that user (grading/sandbox.py), one under /root (pyenv's
    here) cannot run it. A virtual environment of a Python of this version that every user
    reads, with this one's packages (linked where every user reads them, else copied);
    this one's own where the grader is not root, or where every user reads it already."""
    import sysconfig

    sys.path.insert(0, str(ROOT / 'grading'))
    import sandbox

    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    packages = sysconfig.get_paths()['purelib']
    if os.geteuid() != 0 or not any(
        sandbox.closed_to_others(sysconfig.get_paths()[key]) for key in ('stdlib', 'purelib')
    ):
        yield Path(sys.prefix)
        return
    bases = [Path(sys.base_prefix) / 'bin' / version, Path('/usr/bin') / version,
             Path('/usr/local/bin') / version]  # fmt: skip
    readable = [b for b in bases if b.exists() and not sandbox.closed_to_others(b.resolve())]
    if not readable:
        pytest.skip(f"no {version} here that every user reads, for the sandbox's user")
    folder = Path(tempfile.mkdtemp(prefix='grader-python-'))
    folder.chmod(0o755)
    venv = folder / 'venv'
    subprocess.run([str(readable[0]), '-m', 'venv', '--without-pip', str(venv)], check=True)
    (venv_packages,) = venv.glob('lib/python*/site-packages')
    if sandbox.closed_to_others(packages):
        shutil.copytree(packages, venv_packages, copy_function=link_or_copy, dirs_exist_ok=True)
    else:
        (venv_packages / 'graders_packages.pth').write_text(f"{packages}\n")
    yield venv
    shutil.rmtree(folder)


def link_or_copy(source, target):
    try:
        os.link(source, target)
    except OSError:  # another file system
        shutil.copy2(source, target)
