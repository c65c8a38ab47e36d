"""File helpers: atomic saves, UTF-8 reading, data/ lookup, state_dict checks; the CPU
kernel cache's cap."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import utils


def test_interrupted_save_leaves_the_old_file_whole(tmp_path):
    path = tmp_path / 'model.params'
    utils.atomic_save({'w': torch.ones(3)}, path)

    def dies_half_way(f):
        f.write(b'partial bytes')
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        utils.atomic_write(path, dies_half_way)
    assert torch.equal(torch.load(path, weights_only=True)['w'], torch.ones(3))
    assert [p.name for p in tmp_path.iterdir()] == ['model.params']  # no temporary left behind


def test_read_text_checks(tmp_path):
    (tmp_path / 'ok.txt').write_text('caf\u00e9\n', encoding='utf-8')
    assert utils.read_text(str(tmp_path / 'ok.txt')) == 'caf\u00e9\n'
    (tmp_path / 'bad.txt').write_bytes(b'fine\nfine\ncaf\xe9\n')
    with pytest.raises(utils.UserError, match=r'bad.txt, line 3: not valid UTF-8'):
        utils.read_text(str(tmp_path / 'bad.txt'))
    (tmp_path / 'blank.txt').write_text('  \n\n')
    with pytest.raises(utils.UserError, match='file is empty'):
        utils.read_text(str(tmp_path / 'blank.txt'))


def test_bare_names_are_found_in_data(tmp_path, monkeypatch):
    monkeypatch.setattr(utils, 'DATA_DIR', tmp_path / 'data')
    (tmp_path / 'data').mkdir()
    (tmp_path / 'data' / 'corpus.txt').write_text('x\n')
    monkeypatch.chdir(tmp_path)
    assert utils.find_data_file('corpus.txt') == str(tmp_path / 'data' / 'corpus.txt')
    (tmp_path / 'corpus.txt').write_text('here\n')
    assert utils.find_data_file('corpus.txt') == 'corpus.txt'  # the current directory wins
    assert utils.find_data_file('sub/corpus.txt') == 'sub/corpus.txt'  # paths are taken as given


def test_check_state_dict_finds_every_non_finite_value_and_only_those():
    expected = {'w': torch.Size([4])}
    utils.check_state_dict({'w': torch.tensor([3e38, 3e38, -1.0, 0.0])}, expected, 'f', 'm')  # sum overflows
    utils.check_state_dict({'w': torch.tensor([1, 2, 3, 4])}, expected, 'f', 'm')  # integers are always finite
    for values, bad in (([float('inf'), float('-inf'), 0, 0], 2), ([0, float('nan'), 0, 0], 1),
                        ([3e38, 3e38, float('nan'), 0], 1)):
        with pytest.raises(utils.UserError, match=rf"^f: 'w' has {bad} non-finite value"):
            utils.check_state_dict({'w': torch.tensor(values)}, expected, 'f', 'm')


def test_windows_and_old_mac_line_ends_read_as_the_originals_text_mode(tmp_path):
    text = 'Ada was born in London.\nMax\tOslo\n\ncaf\u00e9\n'
    for name, ends in (('lf', '\n'), ('crlf', '\r\n'), ('cr', '\r')):
        (tmp_path / name).write_bytes(text.replace('\n', ends).encode('utf-8'))
        with open(tmp_path / name, encoding='utf-8') as f:  # how the original read every file
            assert utils.read_text(str(tmp_path / name)) == f.read() == text
        assert utils.read_lines(str(tmp_path / name)) == text.split('\n')[:-1]
    (tmp_path / 'bad').write_bytes(b'fine\r\nfine\rcaf\xe9\r\n')
    with pytest.raises(utils.UserError, match=r'bad, line 3: not valid UTF-8'):
        utils.read_text(str(tmp_path / 'bad'))


def test_evaluate_places_reads_crlf_files(tmp_path):
    (tmp_path / 'dev.tsv').write_bytes(b'Where was Ada born?\tLondon\r\nWhere was Max born?\tOslo\r\n')
    assert utils.evaluate_places(str(tmp_path / 'dev.tsv'), ['London', 'Paris']) == (2.0, 1.0)


@pytest.mark.parametrize('cuda, mps, expected', [(True, True, 'cuda'), (False, True, 'mps'),
                                                 (False, False, 'cpu')])
def test_device_is_cuda_else_mps_else_cpu(monkeypatch, cuda, mps, expected):
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: cuda)
    monkeypatch.setattr(torch.backends.mps, 'is_available', lambda: mps)
    assert utils.pick_device('auto') == expected
    assert utils.pick_device('cpu') == 'cpu'
    for device, present in (('cuda', cuda), ('mps', mps)):
        if present:
            assert utils.pick_device(device) == device
        else:
            with pytest.raises(utils.UserError, match=f'--device {device}: not available'):
                utils.pick_device(device)


@pytest.mark.parametrize('users_value, expected', [(None, '128'), ('7', '7')])
def test_onednn_kernel_cache_is_capped_unless_the_user_set_it(users_value, expected):
    env = {k: v for k, v in os.environ.items() if k != 'ONEDNN_PRIMITIVE_CACHE_CAPACITY'}
    if users_value is not None:
        env['ONEDNN_PRIMITIVE_CACHE_CAPACITY'] = users_value
    shown = subprocess.run([sys.executable, '-c', 'import os, utils; '
                            'print(os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"])'],
                           cwd=Path(utils.__file__).parent, env=env, capture_output=True, text=True)
    assert shown.stdout.strip() == expected, shown.stderr
