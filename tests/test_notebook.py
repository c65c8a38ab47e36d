"""colab.ipynb: the handout's commands in order for Colab, then the grader. Its commands are
README's, and its cells, run headless on the CPU at one epoch on the tiny corpus, make every
output of the submission and grade them, then skip them all when run again (as after a
disconnect). Each starter carries it too, written for its edition and its student's folder
(grading/starter.py): run the same way in a starter filled with the textbook answers, it
trains the starter's own code and grades what that wrote."""

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT

sys.path.insert(0, str(ROOT / 'grading'))
import editions  # noqa: E402
import marking  # noqa: E402
import starter  # noqa: E402

NOTEBOOK = ROOT / 'colab.ipynb'
GRADER = 'python grading/grade.py . --edition {EDITION}'
HANDOUT = re.compile(r"handout\(\s*(f?)'([^']+)'\s*\)")


def code_cells(notebook=NOTEBOOK):
    cells = json.loads(notebook.read_text(encoding='utf-8'))['cells']
    return [c for c in cells if c['cell_type'] == 'code']


def commands(cells, edition):
    """The commands a notebook's cells pass to handout(), written for the edition (the
    second variant's with the V and FLAGS its cells give for it)."""
    settings = {}
    exec(''.join(cells[0]['source']), {}, settings)  # the parameters
    settings['EDITION'] = edition
    found = []
    for cell in cells:
        source = ''.join(cell['source'])
        if source.startswith('V = '):
            exec('\n'.join(source.split('\n')[:2]), {}, settings)
        for prefix, command in HANDOUT.findall(source):
            found.append(command.format(**settings) if prefix else command)
    return found, settings


def readme_commands():
    """The commands of README's section of the handout's commands, a line each."""
    section = (ROOT / 'README.md').read_text().split("## The handout's commands")[1]
    text = section.split('\n## ')[0].replace('\\\n', ' ')
    lines = [re.sub(r'\s+', ' ', line.split('  #')[0]).strip() for line in text.split('\n')]
    return {line for line in lines if line.startswith(('python ', 'bash '))}


def test_the_notebooks_commands_are_readmes():
    """Each command the notebook runs is README's, as printed (the second variant's give
    vanilla's when V is vanilla), and the last is README's grader."""
    said = readme_commands()
    found, _ = commands(code_cells(), '2021')
    found = [
        c.replace('synthesizer', 'vanilla').replace(
            'collect_submission.sh 2021', 'collect_submission.sh'
        )
        for c in found
    ]
    assert found.pop() == GRADER.format(EDITION='2021')
    assert GRADER.format(EDITION='2021') in (ROOT / 'README.md').read_text()
    assert len(found) == 2 + 4 + 4 + 4 + 1
    assert set(found) <= said, set(found) - said
    assert {c for c in said if not c.startswith('python tools/')} <= set(found)


@pytest.mark.parametrize('edition', editions.EDITIONS)
def test_a_starters_notebook_is_ours_fixed_to_its_edition_and_its_students_folder(edition):
    """The starter's notebook runs our notebook's commands for its edition (the second
    variant with its handout's flags), clones nothing unless told, and names no other
    edition's variant."""
    files = starter.starter_files(edition)
    text = files['colab.ipynb']
    cells = [c for c in json.loads(text)['cells'] if c['cell_type'] == 'code']
    theirs, settings = commands(cells, edition)
    assert settings['EDITION'] == edition and settings['REPOSITORY'] == ''
    assert (settings['V'], settings['FLAGS']) == starter.VARIANTS[edition]
    assert theirs == commands(code_cells(), edition)[0]
    assert theirs[-1] == GRADER.format(EDITION=edition) and 'grading/grade.py' in files
    others = {v for v, _ in starter.VARIANTS.values() if v != settings['V']}
    others |= {'bottleneck'} if edition != '2023' else set()
    assert not [w for w in others if re.search(rf'\b{w}', text, re.IGNORECASE)]


def with_the_data(folder, tiny, monkeypatch):
    """The tiny corpus's files in folder/data/, under the handout's names, their sums
    recorded as a class's own data's (COURSE_DATA_MD5)."""
    (folder / 'data').mkdir(exist_ok=True)
    sums = []
    for ours, handout in [
        ('wiki.txt', 'wiki.txt'),
        ('train.tsv', 'birth_places_train.tsv'),
        ('dev.tsv', 'birth_dev.tsv'),
        ('test.tsv', 'birth_test_inputs.tsv'),
    ]:
        shutil.copy(tiny / ours, folder / 'data' / handout)
        sums.append(f"{handout}={hashlib.md5((tiny / ours).read_bytes()).hexdigest()}")
    monkeypatch.setenv('COURSE_DATA_MD5', ' '.join(sums))


def headless(notebook, folder, python, grading=True):
    """Runs the notebook's code cells in `folder` as one program, with `python` (Colab's is
    root's, so the grader's cell grades in the sandbox: conftest's grader_python) and the
    CPU's settings: fp32 (fp16 is for GPUs) and one epoch; without the grader's cell unless
    `grading`. Returns its output."""
    cells = [''.join(c['source']) for c in code_cells(notebook)]
    assert 'parameters' in code_cells(notebook)[0]['metadata']['tags']
    # the first cell's values, then the CPU's
    cells.insert(1, "PRECISION = 'fp32'\nQUICK = ['--max_epochs', '1', '--device', 'cpu']")
    if shutil.which('zip') is None:  # collect_submission.sh needs it (it says so and stops)
        cells = [c for c in cells if 'collect_submission' not in c]
    if not grading:
        cells = [c for c in cells if 'grading/grade.py' not in c]
    done = subprocess.run(
        [str(python), '-c', '\n\n'.join(cells)],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def graded(output):
    """The grader's table at the end of the output: {test: (score, points)}."""
    table = output.split('grading/grade.py . --edition')[-1]
    assert re.search(r'^  total \d+/\d+', table, re.M), table[-3000:]
    rows = re.findall(r'^ +(\d+)/(\d+) +(.+)$', table, re.M)
    return {name: (int(score), int(points)) for score, points, name in rows}


def assert_results(folder, variant):
    for v in ('vanilla', variant):
        for name in ['finetune.params', 'pretrain.dev.predictions', 'pretrain.test.predictions']:
            assert (folder / f'{v}.{name}').exists()
    assert (folder / 'vanilla.nopretrain.test.predictions').exists()
    if shutil.which('zip'):
        assert (folder / 'assignment5.zip').exists()


@pytest.mark.slow
def test_the_notebook_runs_headless_and_again_skips_what_exists(tiny, monkeypatch, grader_python):
    for relative in ['src', 'grading', 'tools', 'london_baseline.py', 'collect_submission.sh']:
        source = ROOT / relative
        if source.is_dir():
            shutil.copytree(source, tiny / relative, ignore=shutil.ignore_patterns('__pycache__'))
        else:
            shutil.copy(source, tiny / relative)
    with_the_data(tiny, tiny, monkeypatch)
    python = grader_python / 'bin' / 'python'
    first = headless(NOTEBOOK, tiny, python)
    assert 'data/ is ready' in first
    assert_results(tiny, 'synthesizer')
    assert graded(first)
    again = headless(NOTEBOOK, tiny, python, grading=False)
    assert again.count('exists: skipped') == 3 + 4 + 4
    ran = [line for line in again.split('\n') if line.startswith('$ ')]
    assert not [line for line in ran if 'src/run.py' in line and ' evaluate ' not in line]


@pytest.mark.slow
def test_a_starters_notebook_trains_the_students_code_and_grades_it(
    tiny, monkeypatch, grader_python
):
    """In a 2021 starter filled with the textbook answers: every run.py command is the
    starter's own, the results are written in its folder, and the grader's table gives
    its code full marks and reads its params and predictions."""
    from test_textbook import GETITEM, fill

    folder = tiny / 'a5'
    starter.write_starter('2021', folder)
    fill(folder, GETITEM)
    run_py = folder / 'src' / 'run.py'
    main = "if __name__ == '__main__':\n"
    mark = "    print('ran', os.path.realpath(__file__), file=sys.stderr)\n"
    text = run_py.read_text(encoding='utf-8')
    assert text.count(main) == 1
    run_py.write_text(text.replace(main, main + mark), encoding='utf-8')
    with_the_data(folder, tiny, monkeypatch)

    output = headless(folder / 'colab.ipynb', folder, grader_python / 'bin' / 'python')
    assert 'data/ is ready' in output
    assert output.count(f"ran {os.path.realpath(run_py)}") == 3 + 4 + 4
    assert output.count('\nran ') == 3 + 4 + 4  # no other run.py
    assert_results(folder, 'synthesizer')
    rows = graded(output)
    code = [name for name, t in marking.tests_for('2021', False) if t.probes]
    assert set(code) <= set(rows)
    assert [n for n in code if rows[n][0] < rows[n][1]] == []
    for name in [
        "(c) vanilla.model.params loads into the handout's vanilla model",
        "(f) vanilla.finetune.params loads into the handout's vanilla model",
        "(g) synthesizer.finetune.params loads into the handout's synthesizer model",
        '(d) vanilla without pretraining: test predictions, one per question',
        '(f) vanilla pretrained: test predictions, one per question',
        '(g) synthesizer pretrained: test predictions, one per question',
    ]:
        assert rows[name][0] == rows[name][1] > 0, name
