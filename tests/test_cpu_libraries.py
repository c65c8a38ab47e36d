"""cpu_libraries.py: the MKL, oneDNN and OpenMP settings reach the libraries from the
command line, a user's own value wins, and neither the kernel cache cap nor OpenMP's spin
count changes any result."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import utils
from conftest import ROOT, cli
from machinery import cpu_libraries

# torch's own condition for handing bf16 products to oneDNN (AVX-512 or bf16 instructions);
# elsewhere its kernels emulate them (ONEDNN_VERBOSE lists no primitive), 20 times slower,
# and the cap has nothing to change
ONEDNN_BF16 = getattr(torch.ops.mkldnn, '_is_mkldnn_bf16_supported', lambda: True)()


@pytest.mark.skipif(not ONEDNN_BF16, reason="oneDNN computes no bf16 products on this CPU")
@pytest.mark.slow
def test_the_cpu_kernel_cache_cap_changes_no_result(tiny):
    """utils caps oneDNN's kernel cache to save memory: no cache at all (every bf16 matmul
    compiles its kernel again) and oneDNN's default give the same params."""

    def params(capacity):
        name = f'cache{capacity}.params'
        cli(
            'pretrain',
            'synthesizer',
            'wiki.txt',
            '--writing_params_path',
            name,
            '--max_epochs',
            1,  # 3 steps of other shapes
            '--batch_size',
            16,
            '--precision',
            'bf16',
            '--device',
            'cpu',
            cwd=tiny,
            env={**os.environ, 'ONEDNN_PRIMITIVE_CACHE_CAPACITY': str(capacity)},
        )
        return torch.load(tiny / name, weights_only=True)

    uncached, default = params(0), params(1024)
    assert all(torch.equal(uncached[k], default[k]) for k in default)


@pytest.mark.parametrize('users_value', [None, '7'])
def test_each_setting_is_made_unless_the_user_made_it(users_value):
    names = sorted(cpu_libraries.SETTINGS)
    env = {k: v for k, v in os.environ.items() if k not in names}
    if users_value is not None:
        env.update({name: users_value for name in names})
    shown = subprocess.run(
        [sys.executable, '-c', f'import os, machinery.cpu_libraries; '
         f'print(*(os.environ[n] for n in {names}))'],
        cwd=Path(utils.__file__).parent, env=env, capture_output=True, text=True,
    )  # fmt: skip
    expected = [users_value or cpu_libraries.SETTINGS[name] for name in names]
    assert shown.stdout.split() == expected, shown.stderr


@pytest.mark.slow
def test_openmps_spin_count_changes_no_result(tiny):
    """GOMP_SPINCOUNT says how long a waiting thread spins, not what any thread computes:
    libgomp's default (300,000) and ours give the same params."""

    def params(spins):
        name = f'spin{spins}.params'
        cli('pretrain', 'vanilla', 'wiki.txt', '--writing_params_path', name, '--max_epochs', 1,
            '--batch_size', 8, '--precision', 'fp32', cwd=tiny,
            env={**os.environ, 'GOMP_SPINCOUNT': spins})  # fmt: skip
        return torch.load(tiny / name, weights_only=True)

    default, ours = params('300000'), params(cpu_libraries.SETTINGS['GOMP_SPINCOUNT'])
    assert all(torch.equal(default[k], ours[k]) for k in default)


@pytest.mark.skipif(not torch.backends.mkl.is_available(), reason="this torch has no MKL")
@pytest.mark.parametrize(
    'users_value, expected', [(None, 'CNR:AUTO,STRICT Dyn:0'), ('', 'CNR:OFF Dyn:0')]
)
@pytest.mark.slow
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
