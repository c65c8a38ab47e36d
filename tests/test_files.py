"""files.py: input text checked and read as the original's text mode read it, bare names
found in data/, files written whole, with the user's usual mode, or not at all, and a
user error ended alike by every script: one line and exit status 2."""

import os
import re
import stat
import subprocess

import pytest
import torch

from conftest import PYTHON, ROOT
from machinery import files


def test_interrupted_save_leaves_the_old_file_whole(tmp_path):
    path = tmp_path / 'model.params'
    files.atomic_save({'w': torch.ones(3)}, path)

    def dies_half_way(f):
        f.write(b'partial bytes')
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        files.atomic_write(path, dies_half_way)
    assert torch.equal(torch.load(path, weights_only=True)['w'], torch.ones(3))
    assert [p.name for p in tmp_path.iterdir()] == ['model.params']  # no temporary left behind


def test_read_text_checks(tmp_path):
    (tmp_path / 'ok.txt').write_text('caf\u00e9\n', encoding='utf-8')
    assert files.read_text(str(tmp_path / 'ok.txt')) == 'caf\u00e9\n'
    (tmp_path / 'bad.txt').write_bytes(b'fine\nfine\ncaf\xe9\n')
    with pytest.raises(files.UserError, match=r'bad.txt, line 3: not valid UTF-8'):
        files.read_text(str(tmp_path / 'bad.txt'))
    (tmp_path / 'blank.txt').write_text('  \n\n')
    with pytest.raises(files.UserError, match='file is empty'):
        files.read_text(str(tmp_path / 'blank.txt'))


def test_bare_names_are_found_in_data(tmp_path, monkeypatch):
    monkeypatch.setattr(files, 'DATA_DIR', tmp_path / 'data')
    (tmp_path / 'data').mkdir()
    (tmp_path / 'data' / 'corpus.txt').write_text('x\n')
    monkeypatch.chdir(tmp_path)
    assert files.find_data_file('corpus.txt') == str(tmp_path / 'data' / 'corpus.txt')
    (tmp_path / 'corpus.txt').write_text('here\n')
    assert files.find_data_file('corpus.txt') == 'corpus.txt'  # the current directory wins
    assert files.find_data_file('sub/corpus.txt') == 'sub/corpus.txt'  # paths are taken as given


def test_windows_and_old_mac_line_ends_read_as_the_originals_text_mode(tmp_path):
    text = 'Ada was born in London.\nMax\tOslo\n\ncaf\u00e9\n'
    for name, ends in (('lf', '\n'), ('crlf', '\r\n'), ('cr', '\r')):
        (tmp_path / name).write_bytes(text.replace('\n', ends).encode('utf-8'))
        with open(tmp_path / name, encoding='utf-8') as f:  # how the original read every file
            assert files.read_text(str(tmp_path / name)) == f.read() == text
        assert files.read_lines(str(tmp_path / name)) == text.split('\n')[:-1]
    (tmp_path / 'bad').write_bytes(b'fine\r\nfine\rcaf\xe9\r\n')
    with pytest.raises(files.UserError, match=r'bad, line 3: not valid UTF-8'):
        files.read_text(str(tmp_path / 'bad'))


@pytest.mark.parametrize('umask, mode', [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_written_files_get_the_users_usual_mode(tmp_path, umask, mode):
    old = os.umask(umask)
    try:
        files.atomic_save({'w': torch.ones(3)}, tmp_path / 'model.params')
    finally:
        os.umask(old)
    if os.name == 'posix':
        assert stat.S_IMODE((tmp_path / 'model.params').stat().st_mode) == mode


# (script, its arguments, files to write first, the error's one line): a user error in each
USER_ERRORS = [
    ('src/run.py', ['evaluate', 'vanilla', 'wiki.txt'], {},
     r'evaluate needs --reading_params_path'),
    ('tools/reproduce.py', ['--outdir', 'out'], {'out/results.json': '{'},
     r'out/results.json: not JSON; move it away to start afresh'),
    ('research/grid.py', ['--outdir', 'empty'], {}, r'empty: no finished runs yet \(give --pretrained or --pretrain\)'),
    ('research/analyze.py', ['missing.predictions', '--eval_corpus_path', 'dev.tsv'], {},
     r'missing.predictions: cannot read: .*'),
    ('tools/bench.py', ['--params', 'missing.params'], {},
     r'--params missing.params: no such file'),
    ('tools/bench.py', ['--concurrent', '2'], {},
     r'--concurrent 2: for CUDA GPUs only, and this runs on the cpu'),
    ('tools/bench.py', ['--concurrent', '33'], {}, r'--concurrent 33: 32 runs at most'),
    ('tools/compiled_gradients.py', ['--paths', 'inductor', 'fast'], {},
     r'--paths fast: not a path \(inductor, aot_eager, inductor-forward, inductor-backward, '
     r'inductor:NAME=VALUE\)'),
    ('tools/compiled_gradients.py', ['--paths', 'inductor:no_such_setting=1'], {},
     r'--paths inductor:no_such_setting=1: torch._inductor.config has no no_such_setting'),
    ('tools/plot.py', ['missing.csv'], {}, r'.+'),  # no such file, or no matplotlib
    ('london_baseline.py', ['test.tsv'], {}, r'test.tsv has no gold places to compare with'),
]  # fmt: skip


# each a process that loads torch, about 2 s: the handout's and the grid's commands in the
# quick suite, the tools' in the slow checks
QUICK_SCRIPTS = {'src/run.py', 'tools/reproduce.py', 'research/grid.py'}


@pytest.mark.parametrize(
    'script, argv, inputs, line',
    [c if c[0] in QUICK_SCRIPTS else pytest.param(*c, marks=pytest.mark.slow) for c in USER_ERRORS],
    ids=[c[0] for c in USER_ERRORS],
)
def test_every_script_ends_a_user_error_with_one_line_and_exit_status_2(
    tiny, script, argv, inputs, line
):
    for name, text in inputs.items():
        (tiny / name).parent.mkdir(exist_ok=True)
        (tiny / name).write_text(text)
    device = ['--device', 'cpu'] if script != 'london_baseline.py' and 'plot' not in script else []
    result = subprocess.run(
        [PYTHON, str(ROOT / script), *argv, *device], cwd=tiny, capture_output=True, text=True
    )
    assert result.returncode == 2, result.stderr
    assert re.fullmatch(rf'error: {line}\n', result.stderr), result.stderr
