"""grading/learning_check.py: its slice of the data, what it says at each stage (the
stages run by stand-ins here: run.py itself is not run), its errors; and, slow, that it
passes a correct pipeline and stops each classic mistake with the line that names it."""

import re
import shutil
import subprocess
import sys

import pytest

from conftest import NO_DATA, ROOT

sys.path.insert(0, str(ROOT / 'grading'))
import editions  # noqa: E402
import grade  # noqa: E402
import learning_check as lc  # noqa: E402
import starter  # noqa: E402

DATA = ROOT / 'data'
NEEDS_DATA = pytest.mark.skipif(not (DATA / 'wiki.txt').exists(), reason=NO_DATA)


@NEEDS_DATA
def test_the_slice_is_people_whose_line_names_their_birth_place():
    corpus, questions = lc.data_slice(DATA)
    rows = [row.split('\t') for row in questions.splitlines()]
    lines = corpus.split('\n')
    assert len(rows) == lc.PEOPLE and corpus.endswith('\n') and lines[-1] == ''
    for (question, place), line in zip(rows, lines):
        name = question.removeprefix('Where was ').removesuffix(' born?')
        assert line.startswith(name + '.') and place in line[: lc.PLACE_WITHIN], (line, place)
    assert set(questions) - {'\t', '\n'} <= set(corpus)  # the vocabulary holds the questions
    assert len(lines) - 1 > lc.PEOPLE  # a line added for the characters the questions need
    assert lc.data_slice(DATA) == (corpus, questions)  # the same slice every time


class Stages:
    """Stand-ins for the three run.py commands: each writes what the real one writes (the
    metrics CSV, the predictions) and returns its status and output."""

    def __init__(self, losses=(2.2,) * 40, right=40, fails=None, error=''):
        self.losses, self.right, self.fails, self.error = losses, right, fails, error
        self.ran = []

    def __call__(self, folder, argv, work):
        self.ran.append(argv[0])
        if argv[0] == self.fails:
            return 1, f'Traceback (most recent call last):\n{self.error}\n', 1.0
        path = argv[argv.index('--writing_params_path') + 1] if argv[0] != 'evaluate' else None
        if argv[0] == 'pretrain':
            rows = ''.join(f'1,{i + 1},{loss},0.006,0,1.0\n' for i, loss in enumerate(self.losses))
            (work / f'{path}.metrics.csv').write_text('epoch,step,loss,lr,tokens,seconds\n' + rows)
        if argv[0] == 'evaluate':
            questions = (work / 'questions.tsv').read_text().splitlines()
            places = [q.split('\t')[1] for q in questions]
            said = places[: self.right] + ['Nowhere'] * (len(places) - self.right)
            out = argv[argv.index('--outputs_path') + 1]
            (work / out).write_text(''.join(p + '\n' for p in said))
        return 0, 'done\n', 1.0


@pytest.fixture
def correct(monkeypatch):
    """A correct pipeline's figures for every variant: loss 2.0 to 2.5, at least 30 right."""
    bands = {v: dict(loss=(2.0, 2.5), recall=30) for v in lc.CORRECT}
    monkeypatch.setattr(lc, 'CORRECT', bands)


def run_check(tmp_path, monkeypatch, stages):
    monkeypatch.setattr(lc, 'run_phase', stages)
    return lc.check(ROOT, '2024', 0, tmp_path, data=DATA)


@NEEDS_DATA
def test_a_correct_pipelines_figures_pass(tmp_path, monkeypatch, correct):
    stages = Stages()
    report, learns = run_check(tmp_path, monkeypatch, stages)
    assert learns and stages.ran == ['pretrain', 'finetune', 'evaluate']
    assert re.match(r"1\. pretrain .*: mean loss of the last 30 steps 2\.200; a correct "
                    r"pipeline's 2\.00 to 2\.50 -- ok$", report[0])  # fmt: skip
    assert report[1].endswith("questions in 2 s: 40 right; a correct pipeline at least 30 -- ok")


@NEEDS_DATA
@pytest.mark.parametrize(
    'stages, said',
    [
        (Stages(losses=[0.1] * 40), 'check that attention masks every position after'),
        (Stages(losses=[3.1] * 40), 'check part e (truncate to a random length'),
        (Stages(right=3), 'check finetuning and the model'),
        (
            Stages(
                fails='pretrain',
                error='RuntimeError: The size of tensor a (113) must '
                'match the size of tensor b (127) at non-singleton dimension 3',
            ),
            'stopped: RuntimeError: The size of tensor a (113) must match the size of tensor '
            'b (127) at non-singleton dimension 3; a size that does not match: check that',
        ),
        (Stages(fails='evaluate', error='ValueError: bad'), '2. evaluation stopped: ValueError'),
    ],  # fmt: skip
    ids=['too low', 'too high', 'recalls little', 'sizes', 'evaluation'],
)
def test_each_stage_says_what_to_check(tmp_path, monkeypatch, correct, stages, said):
    report, learns = run_check(tmp_path, monkeypatch, stages)
    assert not learns and said in '\n'.join(report), report
    assert not re.search(r'pack|(?<!rope_)cache|machinery', '\n'.join(report), re.I)


def test_the_last_error_names_the_students_file(tmp_path):
    (tmp_path / 'src').mkdir()
    output = (
        'Traceback (most recent call last):\n'
        f'  File "{ROOT}/src/machinery/packing.py", line 3, in f\n'
        f'  File "{tmp_path}/src/attention.py", line 95, in forward\n'
        f'  File "{ROOT}/src/machinery/packing.py", line 9, in g\n'
        'RuntimeError: bad shape\n'
    )
    assert lc.last_error(output, tmp_path) == 'RuntimeError: bad shape (src/attention.py:95)'
    assert lc.last_error('x\nerror: --max_epochs: must be positive\n', tmp_path) == (
        '--max_epochs: must be positive'
    )


def test_a_folder_without_a_starter_or_data_is_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as stopped:
        lc.main([str(tmp_path)])
    assert 'no src/run.py here' in str(stopped.value)
    (tmp_path / 'src').mkdir()
    (tmp_path / 'src' / 'run.py').write_text("DEFAULT_EDITION = '2024'\n")
    with pytest.raises(SystemExit) as stopped:
        lc.main([str(tmp_path), '--data', str(tmp_path)])
    assert str(stopped.value) == (
        f"error: {tmp_path / 'wiki.txt'}: missing (python tools/get_data.py fetches the "
        f"course's four files into data/; data/README.md)"
    )


def test_the_grader_adds_it_as_a_row_of_no_points(monkeypatch, tmp_path):
    """grade.py runs learning_check.py's command line in a process of its own (here a
    stand-in for that process, printing what main prints where check's report is these
    two lines) and makes its report one line."""
    ran = []

    def process(command, **kwargs):
        ran.append(command)
        printed = (
            "Learning check: ...\n1. pretrain ... -- not so\n   why\n" + lc.DOES_NOT_TRAIN + "\n"
        )
        return subprocess.CompletedProcess(command, 1, printed, '')

    monkeypatch.setattr(grade.subprocess, 'run', process)
    name, score, points, reason = grade.learning_row(tmp_path, '2021', DATA)
    assert (score, points, reason) == (0, 0, "1. pretrain ... -- not so why")
    assert name.startswith('learning check (optional, no points): the synthesizer model')
    learning_check_py = str(ROOT / 'grading' / 'learning_check.py')
    assert ran == [[sys.executable, learning_check_py, str(tmp_path), '--edition', '2021',
                    '--seed', '0', '--data', str(DATA), '--skip_code_checks']]  # fmt: skip


@NEEDS_DATA
def test_the_graders_row_is_what_check_reports(tmp_path):
    """The row from learning_check.py's own process is check()'s report on the same folder,
    of the edition given (a run.py that stops at once, naming the variant it was given;
    without --edition the folder would be taken for a 2021 one); where it stops before
    its report, the line that says why."""
    (tmp_path / 'src').mkdir()
    stops = "import sys\nsys.exit('error: stopped for ' + ' '.join(sys.argv[1:3]))\n"
    (tmp_path / 'src' / 'run.py').write_text(stops)
    name, score, points, reason = grade.learning_row(tmp_path, '2024', DATA)
    (tmp_path / 'work').mkdir()
    report, learns = lc.check(tmp_path, '2024', 0, tmp_path / 'work', data=DATA)
    assert not learns and report == [f"1. {lc.CRASHED['pretrain']}: stopped for pretrain rope"]
    assert (score, points, reason) == (0, 0, ' '.join(line.strip() for line in report))
    assert name == (
        'learning check (optional, no points): the rope model trains as a correct one does'
    )
    (tmp_path / 'src' / 'run.py').unlink()  # learning_check.py refuses the folder
    assert grade.learning_row(tmp_path, '2024', DATA)[3] == (
        f"learning_check.py stopped: error: {tmp_path}: no src/run.py here (give your "
        "starter's folder)"
    )


# A classic mistake in a textbook answer: (file, the answer's text, the mistaken text)
MISTAKES = {
    ('2021', 'the causal mask left out'): (
        'src/attention.py',
        'scores = scores.masked_fill(self.mask[:, :, :T, :T] == 0, -1e10)',
        'scores = scores',
    ),
    ('2021', 'b2 not cut to T'): ('src/attention.py', '+ self.b2[:T]', '+ self.b2'),
    ('2024', 'the causal mask left out'): (
        'src/attention.py',
        "att = att.masked_fill(self.mask[:, :, :T, :T] == 0, float('-inf'))",
        'att = att',
    ),
    ('2024', 'rope_cache not cut to T'): (
        'src/attention.py',
        'rope_cache[:T].contiguous()',
        'rope_cache.contiguous()',
    ),
}
for _edition in ('2021', '2024'):
    MISTAKES[(_edition, 'x and y swapped')] = ('src/dataset.py', 'return x, y\n', 'return y, x\n')
    MISTAKES[(_edition, 'a masked span half the length')] = (
        'src/dataset.py',
        'masked_len = min(n, random.randint(1, max(1, n // 2 - 1)))',
        'masked_len = min(n, random.randint(1, max(1, n - 1)))',
    )
# the line that stops each (a regular expression)
STOPPED_BY = {
    'the causal mask left out': r"changes when the character at position \d+ changes: it reads "
    r"positions after the one it predicts; check the causal mask",
    'b2 not cut to T': r"must match the size of tensor b \(127\).*; check the code you wrote "
    r"\(part g\): what has block_size positions",
    'rope_cache not cut to T': r"must match the size of tensor b \(128\).*; check the code you "
    r"wrote \(part g\)",
    'x and y swapped': r"y is x shifted by one: x\[1:\] != y\[:-1\]",
    'a masked span half the length': r"the masked length: masked spans average [\d.]+ "
    r"characters where a quarter of the truncated length averages",
}


def textbook_starter(edition, folder, mistake=None):
    """The edition's starter with the textbook answers (tests/test_textbook.py), a mistake
    planted, and the data in data/."""
    import test_textbook

    starter.write_starter(edition, folder)
    test_textbook.fill(folder, test_textbook.GETITEM)
    if mistake:
        path, old, new = MISTAKES[(edition, mistake)]
        text = (folder / path).read_text(encoding='utf-8')
        assert text.count(old) == 1, (path, old)
        (folder / path).write_text(text.replace(old, new), encoding='utf-8')
    (folder / 'data').mkdir(exist_ok=True)
    for name in editions.DATA_FILES:
        shutil.copy(DATA / name, folder / 'data' / name)
    return folder


@NEEDS_DATA
@pytest.mark.slow
@pytest.mark.parametrize('edition, mistake', list(MISTAKES), ids=[' '.join(m) for m in MISTAKES])
def test_each_classic_mistake_is_stopped_in_seconds(tmp_path, capsys, edition, mistake):
    """Before any training, by the grader's checks the learning check starts with (the
    same whatever the seed: they do not draw from it)."""
    folder = textbook_starter(edition, tmp_path / 'starter', mistake)
    assert lc.main([str(folder)]) == 1
    out = capsys.readouterr().out
    assert re.search(STOPPED_BY[mistake], out), out
    assert 'Fix these first' in out and '1. pretrain' not in out


@NEEDS_DATA
@pytest.mark.slow
@pytest.mark.parametrize('edition, seed', [('2021', 1), ('2024', 2)])
def test_a_textbook_pipeline_learns(tmp_path, capsys, edition, seed):
    """About two minutes each on a 2-core CPU: every stage within a correct pipeline's
    figures."""
    folder = textbook_starter(edition, tmp_path / 'starter')
    assert lc.main([str(folder), '--seed', str(seed)]) == 0
    out = capsys.readouterr().out
    assert out.count(' -- ok') == 3 and 'Your pipeline trains as a correct one does.' in out
