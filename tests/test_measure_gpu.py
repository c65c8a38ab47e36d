"""measure_gpu.py: the GPU measurement runs its commands as printed and fills its table;
here on the CPU, at one epoch of each phase, without graphs or the GPU tests."""

import re

import pytest

import measure_gpu


@pytest.mark.slow
def test_the_table_is_filled_from_the_commands_outputs(real_data, tmp_path):
    out = tmp_path / 'gpu_run'
    settings = ['--device', 'cpu', '--max_epochs', '1', '--finetune_max_epochs', '1']
    measure_gpu.main(['--out', str(out), *settings, '--bench_steps', '1', '--skip_tests'])
    table = (out / 'table.md').read_text()
    rows = dict(re.findall(r'^\| ([^|]+) \| ([^|]*) \|$', table, re.M))
    assert rows['pretrain (training loop)'].startswith('23 steps in ')
    assert re.fullmatch(r'[\d.]+', rows['pretrain final loss'])
    assert re.fullmatch(r'[\d.]+ out of 500\.0: [\d.]+%', rows['dev accuracy'])
    assert re.search(r'x faster$', rows['our step, eager (bench.py, same run)'])
    assert '-' not in rows.values()  # every figure found in its command's output
    for name in ('bench', 'pretrain', 'finetune', 'evaluate'):
        assert (out / f'{name}.log').stat().st_size > 0
    assert (out / 'vanilla.pretrain.dev.predictions').exists()
