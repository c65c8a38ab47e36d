"""devices.py: the device chosen (CUDA, else MPS, else the CPU), a missing one as one
line, bf16 only where it is native, and copies to the GPU non-blocking only from pinned
memory."""

import pytest
import torch

import devices
import files
from conftest import main


@pytest.mark.parametrize(
    'capability, expected',
    [((6, 0), 'fp32'), ((7, 0), 'fp32'), ((7, 5), 'fp32'), ((8, 0), 'bf16'), ((9, 0), 'bf16')],
)
def test_auto_precision_is_bf16_only_where_native(monkeypatch, capability, expected):
    """P100, V100 and T4 emulate bf16, and torch.cuda.is_bf16_supported() says True there."""
    monkeypatch.setattr(torch.cuda, 'is_bf16_supported', lambda *a, **k: True)
    monkeypatch.setattr(torch.cuda, 'get_device_capability', lambda *a, **k: capability)
    assert devices.training_precision('auto', 'cuda') == expected
    assert (
        devices.training_precision('fp16', 'cuda') == 'fp16'
        and devices.training_precision('fp32', 'cuda') == 'fp32'
    )
    assert devices.training_precision('auto', 'mps') == 'fp32'
    for native in (True, False):
        monkeypatch.setattr(devices, 'cpu_has_native_bf16', lambda native=native: native)
        assert devices.training_precision('auto', 'cpu') == ('bf16' if native else 'fp32')


def test_missing_device_is_one_clear_line(tiny, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)
    monkeypatch.setattr(torch.backends.mps, 'is_available', lambda: False)
    for device in ('cuda', 'mps'):
        code = main(
            'pretrain',
            'vanilla',
            'wiki.txt',
            '--writing_params_path',
            'x.params',
            '--device',
            device,
            cwd=tiny,
        )
        assert code == 2 and capsys.readouterr().err.startswith(
            f'error: --device {device}: not available'
        )


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
