"""File helpers: atomic saves, UTF-8 reading, data/ lookup, state_dict checks; copies to
the device; the CPU libraries' settings (cpu_libraries.py)."""

import cpu_libraries

import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import devices
import files
import params_files
import utils
from conftest import ROOT


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


def test_check_state_dict_finds_every_non_finite_value_and_only_those():
    expected = {'w': torch.Size([4])}
    params_files.check_state_dict(
        {'w': torch.tensor([3e38, 3e38, -1.0, 0.0])}, expected, 'f', 'm'
    )  # sum overflows
    params_files.check_state_dict(
        {'w': torch.tensor([1, 2, 3, 4])}, expected, 'f', 'm'
    )  # integers are always finite
    for values, bad in (
        ([float('inf'), float('-inf'), 0, 0], 2),
        ([0, float('nan'), 0, 0], 1),
        ([3e38, 3e38, float('nan'), 0], 1),
    ):
        with pytest.raises(files.UserError, match=rf"^f: 'w' has {bad} non-finite value"):
            params_files.check_state_dict({'w': torch.tensor(values)}, expected, 'f', 'm')


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


def test_evaluate_places_reads_crlf_files(tmp_path):
    (tmp_path / 'dev.tsv').write_bytes(
        b'Where was Ada born?\tLondon\r\nWhere was Max born?\tOslo\r\n'
    )
    assert utils.evaluate_places(str(tmp_path / 'dev.tsv'), ['London', 'Paris']) == (2.0, 1.0)


@pytest.mark.parametrize(
    'cuda, mps, expected', [(True, True, 'cuda'), (False, True, 'mps'), (False, False, 'cpu')]
)
def test_device_is_cuda_else_mps_else_cpu(monkeypatch, cuda, mps, expected):
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: cuda)
    monkeypatch.setattr(torch.backends.mps, 'is_available', lambda: mps)
    assert devices.pick_device('auto') == expected
    assert devices.pick_device('cpu') == 'cpu'
    for device, present in (('cuda', cuda), ('mps', mps)):
        if present:
            assert devices.pick_device(device) == device
        else:
            with pytest.raises(files.UserError, match=f'--device {device}: not available'):
                devices.pick_device(device)


@pytest.mark.parametrize('users_value, expected', [(None, '128'), ('7', '7')])
def test_onednn_kernel_cache_is_capped_unless_the_user_set_it(users_value, expected):
    env = {k: v for k, v in os.environ.items() if k != 'ONEDNN_PRIMITIVE_CACHE_CAPACITY'}
    if users_value is not None:
        env['ONEDNN_PRIMITIVE_CACHE_CAPACITY'] = users_value
    shown = subprocess.run(
        [
            sys.executable,
            '-c',
            'import os, cpu_libraries; print(os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"])',
        ],
        cwd=Path(utils.__file__).parent,
        env=env,
        capture_output=True,
        text=True,
    )
    assert shown.stdout.strip() == expected, shown.stderr


@pytest.mark.skipif(not torch.backends.mkl.is_available(), reason="this torch has no MKL")
@pytest.mark.parametrize(
    'users_value, expected', [(None, 'CNR:AUTO,STRICT Dyn:0'), ('', 'CNR:OFF Dyn:0')]
)
def test_mkl_runs_reproducibly_from_the_command_line(tiny, users_value, expected):
    """run.py sets MKL's reproducible mode and fixed thread count before torch loads MKL
    (MKL_VERBOSE shows what every fp32 matrix product ran with); the user's value wins."""
    env = {k: v for k, v in os.environ.items() if k not in cpu_libraries.SETTINGS}
    env['MKL_VERBOSE'] = '1'
    if users_value is not None:
        env['MKL_CBWR'] = users_value
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / 'src' / 'run.py'),
            'pretrain',
            'vanilla',
            'wiki.txt',
            '--writing_params_path',
            'p.params',
            '--max_epochs',
            '1',
            '--batch_size',
            '16',
            '--precision',
            'fp32',
            '--device',
            'cpu',
        ],
        cwd=tiny,
        env=env,
        capture_output=True,
        text=True,
    )
    calls = [line for line in result.stdout.splitlines() if re.match(r'MKL_VERBOSE [SD]GEMM', line)]
    assert result.returncode == 0 and calls, result.stderr
    assert all(expected in line for line in calls), calls[0]


@pytest.mark.parametrize('umask, mode', [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_written_files_get_the_users_usual_mode(tmp_path, umask, mode):
    old = os.umask(umask)
    try:
        files.atomic_save({'w': torch.ones(3)}, tmp_path / 'model.params')
    finally:
        os.umask(old)
    if os.name == 'posix':
        assert stat.S_IMODE((tmp_path / 'model.params').stat().st_mode) == mode


def test_copies_to_the_gpu_are_non_blocking_only_from_pinned_memory(monkeypatch):
    """Simulated (no GPU needed): to CUDA, pinned then non-blocking; to MPS or the CPU, a
    plain copy, since a non-blocking one from unpinned memory may read freed memory."""
    copies = []
    monkeypatch.setattr(torch.Tensor, 'pin_memory', lambda t: copies.append('pin') or t)
    monkeypatch.setattr(
        torch.Tensor, 'to', lambda t, device, **kw: copies.append((str(device), kw)) or t
    )
    x = torch.arange(3)
    for device in ('cuda', 'mps', 'cpu'):
        devices.to_device(x, device)
    assert copies == ['pin', ('cuda', {'non_blocking': True}), ('mps', {}), ('cpu', {})]
