"""colab.ipynb: the handout's commands in order for Colab. Its commands are README's, and
its cells, run headless on the CPU at one epoch on the tiny corpus, make every output of
the submission, then skip them all when run again (as after a disconnect)."""

import json
import re
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT

NOTEBOOK = ROOT / 'colab.ipynb'


def code_cells():
    cells = json.loads(NOTEBOOK.read_text(encoding='utf-8'))['cells']
    return [c for c in cells if c['cell_type'] == 'code']


def readme_commands():
    """The commands of README's section of the handout's commands, a line each."""
    section = (ROOT / 'README.md').read_text().split("## The handout's commands")[1]
    text = section.split('\n## ')[0].replace('\\\n', ' ')
    lines = [re.sub(r'\s+', ' ', line.split('  #')[0]).strip() for line in text.split('\n')]
    return {line for line in lines if line.startswith(('python ', 'bash '))}


def test_the_notebooks_commands_are_readmes():
    """Each command the notebook runs is README's, as printed: the second variant's
    written with {V} and {FLAGS} give vanilla's when V is vanilla."""
    said = readme_commands()
    found = []
    for cell in code_cells():
        for literal in re.findall(r"handout\(\s*(f?)'([^']+)'\s*\)", ''.join(cell['source'])):
            prefix, command = literal
            if prefix:
                command = command.format(V='vanilla', FLAGS='', EDITION='2021')
            found.append(command.replace('collect_submission.sh 2021', 'collect_submission.sh'))
    assert len(found) == 2 + 4 + 4 + 4 + 1
    assert set(found) <= said, set(found) - said
    assert {c for c in said if not c.startswith('python tools/')} <= set(found)


@pytest.mark.slow
def test_the_notebook_runs_headless_and_again_skips_what_exists(tiny):
    for relative in ['src', 'london_baseline.py', 'collect_submission.sh']:
        source = ROOT / relative
        if source.is_dir():
            shutil.copytree(source, tiny / relative, ignore=shutil.ignore_patterns('__pycache__'))
        else:
            shutil.copy(source, tiny / relative)
    (tiny / 'data').mkdir()
    for ours, handout in [
        ('wiki.txt', 'wiki.txt'),
        ('train.tsv', 'birth_places_train.tsv'),
        ('dev.tsv', 'birth_dev.tsv'),
        ('test.tsv', 'birth_test_inputs.tsv'),
    ]:
        shutil.move(tiny / ours, tiny / 'data' / handout)
    cells = [''.join(c['source']) for c in code_cells()]
    assert 'parameters' in code_cells()[0]['metadata']['tags']
    # the first cell's values, then the CPU's: fp32 (fp16 is for GPUs) and one epoch
    cells.insert(1, "PRECISION = 'fp32'\nQUICK = ['--max_epochs', '1', '--device', 'cpu']")
    if shutil.which('zip') is None:  # collect_submission.sh needs it (it says so and stops)
        cells = [c for c in cells if 'collect_submission' not in c]
    program = '\n\n'.join(cells)

    def run():
        done = subprocess.run(
            [sys.executable, '-c', program], cwd=tiny, capture_output=True, text=True, timeout=600
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        return done.stdout

    first = run()
    assert 'data/ is ready' in first
    for variant in ('vanilla', 'synthesizer'):
        for name in ['finetune.params', 'pretrain.dev.predictions', 'pretrain.test.predictions']:
            assert (tiny / f'{variant}.{name}').exists()
    assert (tiny / 'vanilla.nopretrain.test.predictions').exists()
    if shutil.which('zip'):
        assert (tiny / 'assignment5.zip').exists()
    again = run()
    assert again.count('exists: skipped') == 3 + 4 + 4
    assert 'src/run.py' not in again.replace('src/run.py evaluate', '')  # nothing trained
