"""grading/gradescope.py: the zip Gradescope takes, and its run_autograder run on
Gradescope's tree (source/ the unpacked zip, submission/, results/) in a temporary root,
with this virtual environment's Python: our submission, the zip collect_submission.sh
makes, gets full marks; a textbook one with a planted mistake, uploaded as loose files,
loses exactly its tests; an upload that cannot be graded gets a score of 0 and one line
saying why. Every results.json is checked against Gradescope's format. All but the teacher's
command's errors are slow checks (the zips take seconds to make); one of them runs
setup.sh's install step into a fresh virtual environment and grades with that."""

import ast
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import pytest

from conftest import NO_DATA, ROOT
from test_grading import MACHINERY, make_submission
from test_textbook import GETITEM, fill

sys.path.insert(0, str(ROOT / 'grading'))
import editions  # noqa: E402
import marking  # noqa: E402
import starter  # noqa: E402

ZIPS = {'2021': 'assignment5.zip', '2024': 'assignment4_submission.zip'}
VISIBILITY = {'hidden', 'after_due_date', 'after_published', 'visible'}
TOP_KEYS = {'score', 'execution_time', 'output', 'output_format', 'visibility',
            'stdout_visibility', 'extra_data', 'tests', 'leaderboard'}  # fmt: skip
TEST_KEYS = {'score', 'max_score', 'status', 'name', 'name_format', 'number', 'output',
             'output_format', 'tags', 'visibility', 'extra_data'}  # fmt: skip


def check_results(results):
    """results.json as Gradescope's specification has it: the keys it knows, each of its
    type; each test with a name, its score out of max_score, an output and a visibility;
    the overall score the tests' sum."""
    assert set(results) <= TOP_KEYS, set(results) - TOP_KEYS
    assert isinstance(results['score'], (int, float))
    assert isinstance(results['execution_time'], int) and results['execution_time'] >= 0
    assert results['stdout_visibility'] in VISIBILITY
    assert isinstance(results['tests'], list)
    for t in results['tests']:
        assert {'name', 'score', 'max_score', 'output', 'visibility'} <= set(t) <= TEST_KEYS, t
        assert isinstance(t['name'], str) and isinstance(t['output'], str) and t['output']
        assert isinstance(t['score'], (int, float)) and isinstance(t['max_score'], (int, float))
        assert 0 <= t['score'] <= t['max_score']
        assert t['status'] == ('passed' if t['score'] == t['max_score'] else 'failed')
        assert t['visibility'] in VISIBILITY
    assert results['score'] == sum(t['score'] for t in results['tests'])


@pytest.fixture(scope='module')
def ours(tmp_path_factory):
    """Our submission's folder, with the zip collect_submission.sh makes for each edition."""
    if not (ROOT / 'data' / 'wiki.txt').exists():
        pytest.skip(NO_DATA)
    folder = make_submission(tmp_path_factory.mktemp('ours'))
    shutil.copy(ROOT / 'collect_submission.sh', folder)
    for edition, name in ZIPS.items():
        subprocess.run(['bash', 'collect_submission.sh', edition], cwd=folder, check=True)
        (folder / name).rename(folder / f"{edition}.zip")
    return folder


@pytest.fixture(scope='module')
def answers(ours, tmp_path_factory):
    """A stand-in for the test answers: the test questions with our vanilla model's
    predictions as their places."""
    questions = editions.read_lines(ROOT / 'data' / 'birth_test_inputs.tsv')
    places = editions.read_lines(ours / 'vanilla.pretrain.test.predictions')
    path = tmp_path_factory.mktemp('answers') / 'birth_test_inputs_with_places.tsv'
    path.write_text(''.join(f"{q}\t{p}\n" for q, p in zip(questions, places)), encoding='utf-8')
    return path


@pytest.fixture(scope='module')
def bundles(ours, answers, tmp_path_factory):
    """The autograder's zips made by the teacher's command: 2021's and 2024's, and 2021's
    with the test answers."""
    folder = tmp_path_factory.mktemp('bundles')
    made = {}
    for key, edition, extra in [
        ('2021', '2021', []), ('2024', '2024', []), ('answers', '2021', ['--answers', answers])
    ]:  # fmt: skip
        made[key] = folder / f"autograder-{key}.zip"
        done = gradescope_command('--edition', edition, '--out', made[key], *extra)
        assert done.returncode == 0 and done.stdout.startswith('wrote '), done.stderr
        printed = re.search(r"(\d+) points\n  \((\d+) for .* the (\d+)-point check", done.stdout)
        made[f"{key} points"] = [int(n) for n in printed.groups()]
    return made


@pytest.mark.slow
def test_the_printed_points_are_what_results_json_totals(ours, bundles, grader_python, tmp_path):
    """The teacher's command prints the total of an upload made from our starter, and of one
    made from the course's own (no src/machinery, so no check of it)."""
    total, course_total, machinery = bundles['2021 points']
    totals = []
    for upload in ('ours', 'the course starter'):
        root = gradescope_tree(tmp_path / upload, bundles['2021'])
        shutil.copytree(ours, root / 'submission' / 'a5', dirs_exist_ok=True)
        if upload == 'the course starter':
            shutil.rmtree(root / 'submission' / 'a5' / 'src' / 'machinery')
        for name in ZIPS:
            (root / 'submission' / 'a5' / f"{name}.zip").unlink()
        results = run_autograder(root, grader_python)
        totals.append(sum(t['max_score'] for t in results['tests']))
    assert totals == [total, course_total] and total - course_total == machinery > 0


def gradescope_command(*argv):
    command = [sys.executable, str(ROOT / 'grading' / 'gradescope.py'), *map(str, argv)]
    return subprocess.run(command, capture_output=True, text=True)


def gradescope_tree(root, bundle):
    """Gradescope's /autograder, laid out in `root`: source/ the zip unpacked, an empty
    submission/ and results/."""
    for name in ('source', 'submission', 'results'):
        (root / name).mkdir(parents=True)
    with zipfile.ZipFile(bundle) as z:
        z.extractall(root / 'source')
    return root


def run_autograder(root, venv):
    """run_autograder as Gradescope runs it, with `venv`'s Python (grader_python's, which
    the sandbox's user can read): its results.json."""
    env = dict(os.environ, AUTOGRADER_ROOT=str(root), VENV=str(venv))
    done = subprocess.run(
        ['bash', str(root / 'source' / 'run_autograder')],
        env=env, cwd=root, capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0 and 'Traceback' not in done.stdout + done.stderr, done
    results = json.loads((root / 'results' / 'results.json').read_text())
    check_results(results)
    return results


def grader_modules(first=('gradescope', 'grade')):
    """The modules of grading/ that gradescope.py and grade.py import, directly or through
    each other (probes.py: the probes' processes import it by name)."""
    names = {p.stem for p in (ROOT / 'grading').glob('*.py')}
    found, waiting = set(), list(first)
    while waiting:
        name = waiting.pop()
        if name in found:
            continue
        found.add(name)
        for node in ast.walk(ast.parse((ROOT / 'grading' / f'{name}.py').read_text('utf-8'))):
            if isinstance(node, ast.Import):
                waiting += [a.name for a in node.names if a.name in names]
            elif isinstance(node, ast.ImportFrom) and node.module in names:
                waiting.append(node.module)
    return found


@pytest.mark.slow
def test_the_zip_holds_what_gradescope_runs_and_the_grader(bundles):
    with zipfile.ZipFile(bundles['answers']) as z:
        names = set(z.namelist())
        modes = {info.filename: info.external_attr >> 16 for info in z.infolist()}
        config = json.loads(z.read('gradescope.json'))
    assert {'setup.sh', 'run_autograder', 'grading/grade.py', 'grading/probes.py'} <= names
    assert {f"grading/{name}.py" for name in grader_modules()} <= names
    assert 'grading/architectures.json' in names and 'grading/starter.py' not in names
    assert {f"data/{name}" for name in editions.DATA_FILES} <= names
    assert 'data/birth_test_answers.tsv' in names and config == {'edition': '2021', 'answers': True}
    assert modes['setup.sh'] & 0o111 and modes['run_autograder'] & 0o111
    assert not any(name.startswith(('src/', 'tests/')) for name in names)


@pytest.mark.slow
def test_our_submission_gets_full_marks(ours, bundles, grader_python, tmp_path):
    root = gradescope_tree(tmp_path / 'autograder', bundles['answers'])
    shutil.copy(ours / '2021.zip', root / 'submission' / ZIPS['2021'])
    results = run_autograder(root, grader_python)
    tests = {t['name']: t for t in results['tests']}
    answered = {n for n, t in marking.tests_for('2021', True) if t.answers}
    assert set(tests) == {n for n, _ in marking.tests_for('2021', True)}
    for name, t in tests.items():
        if name in answered:  # the test-set floors, against the stand-in answers
            assert t['visibility'] == 'after_published'
        else:
            assert (t['score'], t['visibility']) == (t['max_score'], 'visible'), t
    assert tests["(f) vanilla pretrained: test accuracy at least 9%"]['score'] == 8
    assert results['stdout_visibility'] == 'hidden'
    assert not (root / 'source' / 'data' / 'birth_test_answers.tsv').exists()  # read, then gone


@pytest.mark.slow
def test_a_textbook_answer_with_a_mistake_loses_exactly_its_tests(
    ours, bundles, grader_python, tmp_path
):
    """The 2021 starter with the textbook answers and the handout's outputs, uploaded as
    loose files inside one folder, its synthesizer's b2 not cut to T."""
    folder = tmp_path / 'upload' / 'a5'
    starter.write_starter('2021', folder)
    fill(folder, GETITEM)
    attention = folder / 'src' / 'attention.py'
    text = attention.read_text(encoding='utf-8')
    assert text.count('+ self.b2[:T]') == 1
    attention.write_text(text.replace('+ self.b2[:T]', '+ self.b2'), encoding='utf-8')
    for output in [*ours.glob('*.params'), *ours.glob('*.predictions')]:
        shutil.copy(output, folder)
    root = gradescope_tree(tmp_path / 'autograder', bundles['2021'])
    shutil.copytree(folder.parent, root / 'submission', dirs_exist_ok=True)
    results = run_autograder(root, grader_python)
    lost = {t['name'] for t in results['tests'] if t['score'] < t['max_score']}
    assert lost == {
        "(g) SynthesizerAttention: eq. 11 with given weights",
        MACHINERY.format(variant='synthesizer'),
    }
    assert len(results['tests']) == len(marking.tests_for('2021', False))


@pytest.mark.slow
@pytest.mark.parametrize(
    'upload, reason',
    [
        ('nothing', r"^the upload is empty: upload the zip collect_submission\.sh makes"),
        ('the 2021 zip', r"^this upload is of the 2021 edition \(synthesizer\), and this "
         r"assignment is the 2024 edition's \(rope\): upload the zip `bash "
         r"collect_submission\.sh 2024` makes$"),
        ('the 2021 starter', r"^this upload is of the 2021 edition \(synthesizer\), "),
        ('a text file named .zip', r"^assignment4_submission\.zip is not a zip file: "),
        ('no src/', r"^no src/ folder in the upload, nor the handout's files \(run\.py, "
         r"model\.py, \.\.\.\): it holds 1 file \(vanilla\.pretrain\.dev\.predictions\): "),
    ],
)  # fmt: skip
def test_an_upload_that_cannot_be_graded_gets_0_and_a_line(
    ours, bundles, grader_python, tmp_path, upload, reason
):
    root = gradescope_tree(tmp_path / 'autograder', bundles['2024'])
    submission = root / 'submission'
    if upload == 'the 2021 zip':
        shutil.copy(ours / '2021.zip', submission / ZIPS['2021'])
    elif upload == 'the 2021 starter':
        starter.write_starter('2021', submission / 'a5')
    elif upload == 'a text file named .zip':
        (submission / ZIPS['2024']).write_text('not a zip\n')
    elif upload == 'no src/':
        shutil.copy(ours / 'vanilla.pretrain.dev.predictions', submission)
    results = run_autograder(root, grader_python)
    assert results['score'] == 0 and results['tests'] == []
    assert re.search(reason, results['output']) and '\n' not in results['output']


@pytest.mark.slow
def test_a_python_that_cannot_start_still_gives_results(bundles, tmp_path):
    root = gradescope_tree(tmp_path / 'autograder', bundles['2021'])
    results = run_autograder(root, venv=tmp_path / 'no-venv')
    assert results['score'] == 0 and 'could not start Python' in results['output']


def test_the_teachers_command_says_what_is_wrong_in_a_line(real_data, tmp_path):
    short = tmp_path / 'answers.tsv'
    short.write_text("Where was X born?\tParis\n")
    done = gradescope_command('--edition', '2021', '--out', str(tmp_path / 'a.zip'), '--answers',
                              str(short))  # fmt: skip
    assert done.returncode == 2 and 'Traceback' not in done.stderr
    assert re.fullmatch(r"error: --answers .*: 1 lines, but birth_test_inputs\.tsv has \d+\n",
                        done.stderr)  # fmt: skip
    done = gradescope_command('--out', str(tmp_path / 'a.zip'))
    assert done.returncode == 2 and '--edition and --out are needed' in done.stderr
    assert not (tmp_path / 'a.zip').exists()


@pytest.mark.slow
def test_setup_installs_what_grading_needs(ours, bundles, grader_python, tmp_path):
    """setup.sh's install step into a fresh virtual environment (PyPI's torch here, where
    the CPU index is not reached), then our submission graded with it. The environment is
    made of the Python grader_python is made of, in a folder every user may enter, so that
    the sandbox's user can read it as on Gradescope; as root, setup.sh adds that user."""
    root = gradescope_tree(tmp_path / 'autograder', bundles['2021'])
    folder = Path(tempfile.mkdtemp(prefix='setup-venv-'))
    folder.chmod(0o755)
    venv = folder / 'venv'
    base = (grader_python / 'bin' / 'python').resolve()
    env = dict(
        os.environ, AUTOGRADER_ROOT=str(root), VENV=str(venv), BASE_PYTHON=str(base),
        TORCH_INDEX='', SKIP_APT='1',
    )  # fmt: skip
    done = subprocess.run(
        ['bash', str(root / 'source' / 'setup.sh')], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert 'torch 2.13.0' in done.stdout
    shutil.copy(ours / '2021.zip', root / 'submission' / ZIPS['2021'])
    try:
        results = run_autograder(root, venv)
    finally:
        shutil.rmtree(folder)
    failed = [t for t in results['tests'] if t['score'] < t['max_score']]
    assert [t['name'] for t in failed if t['visibility'] == 'visible'] == []
