"""measure_gpu.py: the GPU measurement runs its commands as printed and fills its table;
here on the CPU, at one epoch of each phase, eager, without the GPU tests; and a command
that outlasts --budget is cut off, its row saying so."""

import re
import sys

import pytest

import measure_gpu


@pytest.mark.slow
def test_the_table_is_filled_from_the_commands_outputs(real_data, tmp_path):
    out = tmp_path / 'gpu_run'
    settings = ['--device', 'cpu', '--max_epochs', '1', '--finetune_max_epochs', '1']
    measure_gpu.main(
        ['--out', str(out), *settings, '--bench_steps', '1', '--skip_tests', '--variants', 'rope']
    )
    table = (out / 'table.md').read_text()
    rows = dict(re.findall(r'^\| ([^|]+) \| ([^|]*) \|$', table, re.M))
    assert rows['pretrain, training loop'].startswith('23 steps in ')
    assert re.fullmatch(r'[\d.]+', rows['pretrain final loss'])
    assert re.fullmatch(r'[\d.]+ out of 500\.0: [\d.]+%', rows['dev accuracy'])
    assert re.search(r'x faster \(its own work ', rows['our step, eager (bench.py, same run)'])
    assert re.search(r'x faster .*; plain [\d.]+ ms$', rows['rope: our step, eager'])
    assert rows['pretrain notes'] == 'none'
    assert '-' not in rows.values()  # every figure found in its command's output
    for name in ('bench_vanilla', 'bench_rope', 'pretrain', 'finetune', 'evaluate'):
        assert (out / f'{name}.log').stat().st_size > 0
    assert (out / 'vanilla.pretrain.dev.predictions').exists()


def test_a_command_past_the_budget_is_cut_off(tmp_path):
    m = measure_gpu.Measurement(tmp_path, budget=8)
    text, seconds, ok = m.run(
        [sys.executable, '-c', 'print("started", flush=True); import time; time.sleep(30)'], 'slow'
    )
    assert not ok and 7 < seconds < 12 and 'started' in text
    assert (tmp_path / 'slow.log').read_text() == text
    assert m.run([sys.executable, '-c', 'pass'], 'late') == ('', 0.0, False)  # no time left
