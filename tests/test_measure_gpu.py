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


@pytest.mark.slow
def test_a_command_past_the_budget_is_cut_off(tmp_path):
    m = measure_gpu.Measurement(tmp_path, budget=6)
    text, seconds, ok = m.run(
        [sys.executable, '-c', 'print("started", flush=True); import time; time.sleep(600)'],
        'slow',
    )
    assert not ok and 5 < seconds < 300 and 'started' in text  # cut off, long before its end
    assert (tmp_path / 'slow.log').read_text() == text
    assert m.run([sys.executable, '-c', 'pass'], 'late') == ('', 0.0, False)  # no time left


def test_sharing_commands_and_their_rates(tmp_path):
    """--sharing: one alone (graphed and eager on CUDA), two at once, K in one process;
    runs per minute from a command's wall clock and from its runs' tokens/s, scaled to
    the handout's whole pretraining (650 x 23 steps of 128 x 127 targets)."""
    args = measure_gpu.parse_args(['--out', str(tmp_path), '--sharing', '--share_counts', '1', '4'])
    commands = measure_gpu.sharing_commands(args, tmp_path)
    assert [(name, runs) for name, _, runs in commands] == [
        ('one alone, CUDA graphs', 1), ('one alone, eager', 1),
        ('one alone, CUDA graphs, --precision auto (the default)', 1),
        ('two alone at once (--jobs 2)', 2), ('1 sharing one process (--share 1)', 1),
        ('4 sharing one process (--share 4)', 4),
    ]  # fmt: skip
    assert commands[0][1][1:10] == ['src/run.py', 'pretrain', 'vanilla', 'wiki.txt',
                                    '--max_epochs', '20', '--precision', 'fp32', '--seed']  # fmt: skip
    assert commands[1][1][-1] == '--eager'
    auto = commands[2][1]
    assert auto[auto.index('--precision') :][:5] == ['--precision', 'auto', '--seed', '0',
                                                      '--writing_params_path']  # fmt: skip
    pair = commands[3][1][2]
    assert pair.count('src/run.py') == 2 and pair.endswith('& wait') and '--seed 1 ' in pair
    shared = commands[5][1]
    assert shared[1] == 'src/machinery/shared_runs.py'
    assert shared[shared.index('--seeds') :][:5] == ['--seeds', '0', '1', '2', '3']
    assert len(shared) - shared.index('--writing_params_paths') - 1 == 4
    cpu = measure_gpu.parse_args(
        ['--out', 'x', '--sharing', '--device', 'cpu', '--max_epochs', '1']
    )
    names = [name for name, _, _ in measure_gpu.sharing_commands(cpu, tmp_path)]
    assert names[0] == 'one alone' and 'one alone, eager' not in names

    rate = 14950 * 128 * 127 / 120  # a whole pretraining in 2 minutes
    text = ''.join(f"pretrain done: 460 steps in 0m05s ({rate:,.0f} tokens/s), final loss 2.0; "
                   f"params written to s{i}.params\n" for i in range(2))  # fmt: skip
    assert (
        measure_gpu.runs_per_minute(text, 30.0, 2)
        == '4.00/min (process), 1.00/min (loop, 650 epochs)'
    )
    assert measure_gpu.runs_per_minute(text, 30.0, 3) == '- (of 3 runs, 2 finished)'


def test_loss_agreement_of_two_runs_of_one_seed(tmp_path):
    def log(name, losses):
        rows = [f"1,{step},{loss:.6f},6e-03,0,0.0" for step, loss in losses.items()]
        path = tmp_path / name
        path.write_text('epoch,step,loss,lr,tokens,seconds\n' + '\n'.join(rows) + '\n')
        return path

    a = log('a.csv', {1: 5.5, 10: 3.4, 20: 3.2})
    assert measure_gpu.loss_agreement(a, log('b.csv', {1: 5.5, 10: 3.4, 20: 3.2, 30: 3.0})) == (
        'identical: 3 logged steps, up to step 20'
    )
    apart = measure_gpu.loss_agreement(a, log('c.csv', {1: 5.5, 10: 3.401, 20: 3.25}))
    assert apart == (
        'first apart at step 10 (3.400000 against 3.401000); largest difference 0.050000 '
        'over 3 logged steps; at step 20: 3.200000 against 3.250000'
    )
    assert measure_gpu.loss_agreement(a, tmp_path / 'missing.csv') == '-'
    assert measure_gpu.late_mean_loss(a, 10, 20) == pytest.approx(3.3)
    assert measure_gpu.late_mean_loss(tmp_path / 'missing.csv', 10, 20) is None


@pytest.mark.slow
def test_sharing_measured_on_the_cpu(tiny, tmp_path):
    """The whole --sharing measurement, one epoch of the tiny corpus on the CPU."""
    out = tmp_path / 'share'
    measure_gpu.main(['--out', str(out), '--sharing', '--device', 'cpu', '--precision', 'fp32',
                      '--max_epochs', '1', '--share_counts', '2', '--corpus',
                      str(tiny / 'wiki.txt')])  # fmt: skip
    rows = dict(re.findall(r'^\| ([^|]+) \| ([^|]*) \|$', (out / 'table.md').read_text(), re.M))
    for name in ('one alone', 'two alone at once (--jobs 2)', '2 sharing one process (--share 2)'):
        assert re.fullmatch(r'[\d.]+/min \(process\), [\d.]+/min \(loop, 650 epochs\)', rows[name])
    assert (out / 's2.s1.params').exists() and (out / 'j1.params').exists()
    # the CPU repeats a run bit for bit; a run alone takes other batches here than sharing
    assert rows['seed 0 alone, twice (one alone; --jobs 2)'].startswith('identical: ')
    assert rows['seed 0 alone, and among 2 sharing'] == '- (alone, off CUDA, other batches)'
