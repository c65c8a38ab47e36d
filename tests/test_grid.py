"""grid.py: every model x method x seed finetuned and evaluated, a table whose means and
standard deviations are those of the runs' predictions, and a second command that skips
what exists and refuses what was made with other settings."""

import csv
import json
import math
import os
import re
import shutil
import signal
import statistics
import subprocess

import pytest

import grid
import run
from conftest import PYTHON, held_grid, wait_for
from machinery import devices

BF16 = devices.cpu_has_native_bf16()  # what --precision auto means on this CPU

GRID = ['--pretrained', 'vanilla.params', '--methods', 'full', 'lora:2', '--seeds', '0', '1',
        '--max_epochs', '1', '--finetune_corpus_path', 'train.tsv', '--eval_corpus_path',
        'dev.tsv', '--test_corpus_path', 'test.tsv', '--outdir', 'g', '--device', 'cpu']  # fmt: skip


def test_grid_runs_reports_and_skips_what_exists(params, monkeypatch, capsys):
    monkeypatch.chdir(params)
    grid.main(GRID)
    out = capsys.readouterr().out
    assert out.count('finetune from pretrained done') == 4
    assert 'of them trained' in out  # lora's start line
    record = json.loads((params / 'g' / 'grid.json').read_text())
    accuracies = {}
    for method in ('full', 'lora:2'):
        for seed in (0, 1):
            prefix = params / 'g' / f"vanilla.{method.replace(':', '')}.s{seed}"
            for output in ('.params', '.dev.predictions', '.test.predictions'):
                assert (prefix.parent / (prefix.name + output)).exists()
            entry = record[f'vanilla {method} s{seed}']
            assert entry['made_with']['finetune'][-2:] == [
                '--precision',
                'bf16' if BF16 else 'fp32',
            ]
            assert entry['dev_total'] == 4
            accuracies.setdefault(method, []).append(100 * entry['dev_correct'] / 4)
    table = (params / 'g' / 'grid.md').read_text()
    for method, values in accuracies.items():
        mean_sd = f"{statistics.mean(values):.1f} ± {statistics.stdev(values):.1f}"
        every = f"0: {values[0]:.1f}, 1: {values[1]:.1f}"
        assert f"| vanilla | {method} |" in table and f"| 2 | {mean_sd} | {every} |" in table
    with open(params / 'g' / 'grid.csv', newline='') as f:
        rows = list(csv.DictReader(f))
    assert [(r['method'], r['seed']) for r in rows] == [
        ('full', '0'), ('full', '1'), ('lora:2', '0'), ('lora:2', '1')
    ]  # fmt: skip
    # lora:2 on 4 layers: 2 x (4 x (256 + 256) + (256 + 1024) + (1024 + 256)) each
    assert {r['trainable'] for r in rows if r['method'] == 'lora:2'} == {str(4 * 2 * 4608)}
    assert {r['trainable'] for r in rows if r['method'] == 'full'} == {rows[0]['parameters']}

    # again: everything skipped; a run whose predictions went missing is evaluated again
    (params / 'g' / 'vanilla.lora2.s1.dev.predictions').unlink()
    grid.main(GRID)
    out = capsys.readouterr().out
    assert out.count('skipped') == 3 and 'finetune from pretrained' not in out
    assert out.count('Correct: ') == 1
    assert (params / 'g' / 'grid.md').read_text() == table

    # other settings for the same outputs: refused before any work
    with pytest.raises(SystemExit) as stopped:
        grid.main(GRID[:-2] + ['--max_epochs', '2', '--device', 'cpu'])
    assert stopped.value.code == 2 and re.match(
        r'^error: g/vanilla.full.s0.params was made with other settings: --max_epochs 1 '
        r'\(this command: 2\)\. Use another',
        capsys.readouterr().err,
    )


def test_a_bad_method_is_one_line(capsys):
    with pytest.raises(SystemExit):
        grid.parse_args(['--methods', 'lora:x'])
    assert "'lora:x': a method is full, lora, lora:RANK, adapter or adapter:SIZE" in (
        capsys.readouterr().err
    )


def hand_made_record():
    return {
        f'v lora:4 s{seed}': {
            'made_with': {'model': 'v', 'method': 'lora:4', 'seed': seed},
            'trainable': 73_728,
            'finetune_seconds': seconds,
            'dev_correct': correct,
            'dev_total': 50,
            'machine': 'a machine',
        }
        for seed, correct, seconds in ((0, 5, 60), (1, 10, 62), (2, 15, 64))
    }


def test_table_shows_mean_sample_sd_and_every_run():
    record = hand_made_record()
    record['v full s0'] = {'made_with': {'model': 'v', 'method': 'full', 'seed': 0}}  # unfinished
    table = grid.table(record)
    assert 'Machine: a machine. Dev accuracy' in table
    # 10, 20 and 30%: mean 20, sample sd sqrt(((-10)^2 + 0 + 10^2) / 2) = 10
    assert '| v | lora:4 | 73,728 | 3 | 20.0 ± 10.0 | 0: 10.0, 1: 20.0, 2: 30.0 | 1m02s |' in table
    assert '| full |' not in table
    rows = grid.rows_csv(record).splitlines()
    assert rows[1] == 'v,lora:4,0,73728,,5,50,10.0,60.0,'


def test_the_table_and_picture_again_from_the_record(tmp_path, capsys):
    pytest.importorskip('matplotlib', reason='the picture needs matplotlib, an optional install')
    (tmp_path / 'grid.json').write_text(json.dumps(hand_made_record()))
    grid.main(['--outdir', str(tmp_path), '--plot', str(tmp_path / 'grid.png')])
    assert '20.0 ± 10.0' in (tmp_path / 'grid.md').read_text()
    assert (tmp_path / 'grid.png').stat().st_size > 1000
    capsys.readouterr()
    with pytest.raises(SystemExit) as stopped:
        grid.main(['--outdir', str(tmp_path / 'empty')])
    assert stopped.value.code == 2 and 'no finished runs yet' in capsys.readouterr().err


def test_the_picture_has_a_line_per_recipe_through_lora_and_full(monkeypatch, tmp_path):
    """p and p.s1 are one recipe (one colour, one line); the line goes through the means of
    LoRA and full finetuning by trainable parameters, never through adapters."""
    pytest.importorskip('matplotlib', reason='the picture needs matplotlib, an optional install')
    runs = [('p', 'full', 0, 10, 1000), ('p.s1', 'full', 0, 20, 1000), ('p', 'lora:1', 0, 5, 10),
            ('p', 'adapter', 0, 25, 50), ('q', 'adapter', 0, 5, 50)]  # fmt: skip
    record = {}
    for model, method, seed, correct, trainable in runs:
        record[f'{model} {method} s{seed}'] = finished_run(model, method, seed, correct)
        record[f'{model} {method} s{seed}']['trainable'] = trainable
    figures = []
    plt = grid.plot.pyplot('test')
    monkeypatch.setattr(plt.Figure, 'savefig', lambda fig, *a, **k: figures.append(fig))
    grid.plot_grid(record, tmp_path / 'grid.png')
    ax = figures[0].axes[0]
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert list(lines) == ['p', 'q']
    assert list(lines['p'].get_xdata()) == [10, 1000]
    assert list(lines['p'].get_ydata()) == [10.0, 30.0]  # lora 5/50; full (10 + 20)/2 of 50
    assert len(lines['q'].get_xdata()) == 0
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ['p', 'q', 'lora', 'adapter', 'full']
    # full finetuning alone: the legend names no method that was not run
    figures.clear()
    grid.plot_grid({k: v for k, v in record.items() if ' full ' in k}, tmp_path / 'grid.png')
    assert [t.get_text() for t in figures[0].axes[0].get_legend().get_texts()] == ['p', 'full']


def finished_run(model, method, seed, correct, total=50):
    return {'made_with': {'model': model, 'method': method, 'seed': seed},
            'dev_correct': float(correct), 'dev_total': float(total)}  # fmt: skip


def test_pretraining_seeds_are_set_beside_finetuning_seeds():
    """p, p.s1 and p.s2 are one recipe pretrained with three seeds: accuracies 10 and 20,
    30 and 40, 20 and 30 (%): means 15, 35 and 25, each with sample variance 50."""
    runs = [('p', 'full', 0, 5), ('q', 'full', 0, 5), ('p', 'full', 1, 10),
            ('p.s1', 'full', 0, 15), ('p.s1', 'full', 1, 20), ('p', 'lora:1', 0, 5),
            ('p.s2', 'full', 0, 10), ('p.s2', 'full', 1, 15), ('q.s1', 'lora:1', 0, 5)]  # fmt: skip
    record = {f'{m} {meth} s{s}': finished_run(m, meth, s, c) for m, meth, s, c in runs}
    table = grid.table(record)
    models = [line.split(' | ')[0] for line in table.splitlines() if line.startswith('| ')]
    # a model's methods together, models in the order they first appear
    assert models[:7] == ['| model', '| p', '| p', '| q', '| p.s1', '| p.s2', '| q.s1']
    # all six runs: mean 25, sample sd sqrt((15^2 + 5^2 + 5^2 + 15^2 + 5^2 + 5^2) / 5);
    # between: sd of 15, 35, 25 = 10; within: sqrt((50 + 50 + 50) / 3); the pretraining
    # seed alone: sqrt(10^2 - 50 / 2), two runs per pretraining
    row = (
        f'| p | full | 3 | 6 | 25.0 ± {math.sqrt(550 / 5):.1f} | 10.0 | 7.1 | {math.sqrt(75):.1f} |'
    )
    assert row in table
    assert table.count('| p | lora:1 |') == 1 and '| q | full | 2' not in table  # one seed each
    # the pooled sd weighs each pretraining by its degrees of freedom
    between, within, alone = grid.between_within({'a': [10, 20, 30], 'b': [0, 10]})
    assert between == pytest.approx(statistics.stdev([20, 5]))
    assert within == pytest.approx(math.sqrt((2 * 100 + 1 * 50) / 3))
    # unequal runs: the analysis of variance's sums of squares over all five runs, mean 14
    msb = 3 * (20 - 14) ** 2 + 2 * (5 - 14) ** 2  # between pretrainings, k - 1 = 1
    msw = ((10 - 20) ** 2 + 0 + (30 - 20) ** 2 + (0 - 5) ** 2 + (10 - 5) ** 2) / (5 - 2)
    assert alone == pytest.approx(math.sqrt((msb - msw) / (5 - (3**2 + 2**2) / 5)))
    # means closer than finetuning noise explains: the pretraining seed's share is none
    assert grid.between_within({'a': [0, 20], 'b': [1, 21]})[2] == 0
    assert grid.between_within({'a': [10], 'b': [0]}) == (pytest.approx(math.sqrt(50)), None, None)
    assert grid.rows_csv(record).splitlines()[1] == 'p,full,0,,,5,50,10.0,0.0,'


PRETRAIN = ['--pretrain', 'vanilla', 'synthesizer', '--pretrain_seeds', '0', '1', '--seeds', '0',
            '--pretrain_max_epochs', '30', '--max_epochs', '1', '--pretrain_corpus_path',
            'wiki.txt', '--finetune_corpus_path', 'train.tsv', '--eval_corpus_path', 'dev.tsv',
            '--test_corpus_path', 'test.tsv', '--outdir', 'p', '--device', 'cpu', '--jobs', '2']  # fmt: skip


@pytest.mark.slow
def test_pretraining_seeds_run_at_once_stop_and_go_on(tiny, monkeypatch, capsys):
    """Two variants x two pretraining seeds, two pretrainings at once: stopped (as by
    Ctrl-C) after the first pretraining's finetuning, the running pretrainings keep their
    state; the same command then resumes them, skips what exists, and reports each
    pretraining seed as a model of its recipe."""
    monkeypatch.chdir(tiny)
    finetune_all, calls = grid.finetune_all, []

    def stopping_finetune_all(*args):
        calls.append(1)
        if len(calls) == 3:  # the first two pretrainings' finetunings (and the first call)
            raise KeyboardInterrupt
        return finetune_all(*args)

    monkeypatch.setattr(grid, 'finetune_all', stopping_finetune_all)
    with pytest.raises(SystemExit) as stopped:
        grid.main(PRETRAIN)
    assert stopped.value.code == 130
    assert 'To continue: python research/grid.py --pretrain' in capsys.readouterr().err
    order = [f'{v}.s{s}' for s in (0, 1) for v in ('vanilla', 'synthesizer')]
    # the first two ran at once; the one written first was finetuned, the last not begun
    first = [n for n in order if (tiny / 'p' / f'{n}.full.s0.dev.predictions').exists()]
    assert len(first) == 1 and first[0] in order[:2]
    assert not (tiny / 'p' / f'{order[-1]}.pretrain.params').exists()

    monkeypatch.setattr(grid, 'finetune_all', finetune_all)
    grid.main(PRETRAIN)
    out = capsys.readouterr().out
    assert f'{first[0]} pretrain: p/{first[0]}.pretrain.params exists, skipped' in out
    record = json.loads((tiny / 'p' / 'grid.json').read_text())
    for name in order:
        entry = record[f'{name} pretrain']
        assert entry['made_with']['pretrain'][:5] == [name.split('.')[0], 'wiki.txt', '--seed',
                                                      name[-1], '--device']  # fmt: skip
        assert entry['pretrain_seconds'] > 0 and entry['final_loss'] > 0
        assert record[f'{name} full s0']['dev_total'] == 4
        assert (tiny / 'p' / f'{name}.pretrain.params.metrics.csv').exists()
    table = (tiny / 'p' / 'grid.md').read_text()
    assert re.search(r'^\| vanilla \| full \| 2 \| 2 \|', table, re.M)
    assert re.search(r'^\| synthesizer \| full \| 2 \| 2 \|', table, re.M)

    # the same outputs wanted with other pretraining settings: refused before any work
    with pytest.raises(SystemExit) as stopped:
        grid.main([*PRETRAIN[:9], '31', *PRETRAIN[10:]])
    assert stopped.value.code == 2
    assert 'p/vanilla.s0.pretrain.params was made with other settings: --max_epochs 30 ' in (
        capsys.readouterr().err
    )

    # another machine: what is committed (grid.json, predictions, metrics), no params
    for path in (tiny / 'p').iterdir():
        if path.is_dir():
            shutil.rmtree(path)  # tensorboard's
        elif not path.name.endswith(('.json', '.predictions', '.csv', '.md')):
            path.unlink()
    record_before = (tiny / 'p' / 'grid.json').read_text()
    grid.main(PRETRAIN)
    out = capsys.readouterr().out
    assert out.count('its finetunings and evaluations are done (grid.json') == 4, out
    assert 'run.py' not in out and 'finetune from pretrained' not in out
    assert json.loads((tiny / 'p' / 'grid.json').read_text()) == json.loads(record_before)
    # a run missing there: its pretraining is made again, and its runs from it
    (tiny / 'p' / 'synthesizer.s1.full.s0.dev.predictions').unlink()
    grid.main(PRETRAIN)
    out = capsys.readouterr().out
    assert out.count('its finetunings and evaluations are done (grid.json') == 3, out
    assert out.count('finetune from pretrained done') == 1
    record = json.loads((tiny / 'p' / 'grid.json').read_text())
    again = record['synthesizer.s1 pretrain']
    assert again['params_md5'] == record['synthesizer.s1 full s0']['made_with']['pretrained_md5']
    assert (tiny / 'p' / 'synthesizer.s1.full.s0.dev.predictions').exists()
    # and other settings are refused there too, from the record
    (tiny / 'p' / 'synthesizer.s1.pretrain.params').unlink()
    with pytest.raises(SystemExit) as stopped:
        grid.main([*PRETRAIN[:9], '31', *PRETRAIN[10:]])
    assert stopped.value.code == 2
    assert 'p/vanilla.s0.pretrain.params was made with other settings (grid.json): ' in (
        capsys.readouterr().err
    )


HELD_GRID = held_grid(3)  # grid.py, its pretraining held after step 3


@pytest.mark.skipif(os.name == 'nt', reason="process groups and SIGTERM are POSIX's")
@pytest.mark.parametrize('stop', ['ctrl-c', 'sigterm'])
@pytest.mark.slow
def test_a_stop_reaches_a_pretraining_once_and_its_state_is_saved(tiny, stop):
    """A terminal's Ctrl-C (SIGINT to grid.py's whole process group, as `timeout -s INT`
    sends it too) or a SIGTERM to grid.py alone: the pretraining gets one stop, from
    grid.py, saves its state after the step (a second stop would end it unsaved), and
    grid.py ends with the command that continues."""
    argv = ['--pretrain', 'vanilla', '--pretrain_seeds', '0', *PRETRAIN[6:-2]]
    process = subprocess.Popen([PYTHON, '-c', HELD_GRID, *argv], cwd=tiny, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               start_new_session=True)  # fmt: skip
    wait_for(tiny / 'held.0', process)
    if stop == 'ctrl-c':
        os.killpg(process.pid, signal.SIGINT)
    else:
        process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 130, err
    assert 'To continue: python research/grid.py --pretrain vanilla' in err
    log = (tiny / 'p' / 'vanilla.s0.pretrain.log').read_text()
    assert re.search(r'interrupted at epoch 3, step 1; state saved to '
                     r'p/vanilla.s0.pretrain.params.resume\. To continue', log), log  # fmt: skip
    assert (tiny / 'p' / 'vanilla.s0.pretrain.params.resume').exists()


def test_pretrainings_share_processes_in_groups_of_one_variant():
    """--share 2 over two variants and three seeds: each variant's seeds two to a process,
    every variant's first seeds first; a group's command is shared_runs.py with each run's
    seed and params file, one run's is run.py as before."""
    args = grid.parse_args(['--pretrain', 'vanilla', 'rope', '--pretrain_seeds', '0', '1', '2',
                            '--outdir', 'o', '--device', 'cpu', '--precision', 'fp32',
                            '--pretrain_max_epochs', '3', '--share', '2'])  # fmt: skip
    runs = [(key, out, argv) for key, out, _, argv in grid.pretraining_runs(args)]
    groups = grid.group_runs(runs, args.share)
    assert [[key for key, _, _ in g] for g in groups] == [
        ['vanilla.s0 pretrain', 'vanilla.s1 pretrain'], ['rope.s0 pretrain', 'rope.s1 pretrain'],
        ['vanilla.s2 pretrain'], ['rope.s2 pretrain'],
    ]  # fmt: skip
    command, log = grid.group_command(groups[1])
    assert command[1].endswith('src/machinery/shared_runs.py')
    assert command[2:] == ['pretrain', 'rope', 'wiki.txt', '--device', 'cpu', '--precision',
                           'fp32', '--max_epochs', '3', '--seeds', '0', '1',
                           '--writing_params_paths', 'o/rope.s0.pretrain.params',
                           'o/rope.s1.pretrain.params']  # fmt: skip
    assert log == 'o/rope.s0+1.pretrain.log'
    command, log = grid.group_command(groups[2])
    assert command[1].endswith('src/run.py') and command[-2:] == [
        '--writing_params_path', 'o/vanilla.s2.pretrain.params'
    ]  # fmt: skip
    assert log == 'o/vanilla.s2.pretrain.log'
    assert grid.group_runs(runs, 1) == [[r] for r in runs]  # the default: each alone


def test_shared_pretrainings_in_bf16_are_refused(tmp_path, capsys):
    with pytest.raises(SystemExit) as stopped:
        grid.main(['--pretrain', 'vanilla', '--share', '2', '--precision', 'bf16',
                   '--device', 'cpu', '--outdir', str(tmp_path)])  # fmt: skip
    assert stopped.value.code == 2
    assert 'error: --share 2: --precision bf16: runs that share a process train in fp32 only' in (
        capsys.readouterr().err
    )


def fake_pretrainings(monkeypatch):
    """grid's pretraining processes replaced: each writes its params and their done lines
    into its log and ends at its second poll; returns the list they are put in as they
    start."""
    started = []

    class Process:
        def __init__(self, command, stdout, stderr, env, start_new_session):
            assert start_new_session  # its one stop is grid.py's (test_a_stop_reaches...)
            self.command, self.env, self.polls, self.returncode = command, env, 0, None
            self.log = stdout
            self.running_then = sum(p.returncode is None for p in started)
            started.append(self)
            at = command.index('--writing_params_paths') if '--seeds' in command else None
            self.outs = (
                command[at + 1 :] if at else [command[command.index('--writing_params_path') + 1]]
            )

        def poll(self):
            self.polls += 1
            if self.polls >= 2 and self.returncode is None:
                for out in self.outs:
                    with open(out, 'w') as f:
                        f.write(out)
                    self.log.write(f"pretrain done: 2 steps in 0m01s (9 tokens/s), final loss "
                                   f"2.5000; params written to {out}\n")  # fmt: skip
                self.log.flush()
                self.returncode = 0
            return self.returncode

        def wait(self, timeout=None):
            return self.returncode

    monkeypatch.setattr(grid.records, 'commit', lambda: 'abc')
    monkeypatch.setattr(grid.subprocess, 'Popen', Process)
    monkeypatch.setattr(grid.time, 'sleep', lambda s: None)
    return started


def test_a_pretraining_that_ended_while_another_was_finetuned_is_recorded_at_a_stop(
    tmp_path, monkeypatch
):
    """Two at once: the first's params are handed on (its finetunings run) and the second
    ends meanwhile; a stop then (the generator closed, as a Ctrl-C in the finetuning
    closes it) records the second as written, since the same command skips its params."""
    fake_pretrainings(monkeypatch)
    args = grid.parse_args(['--pretrain', 'vanilla', '--pretrain_seeds', '0', '1', '--outdir',
                            str(tmp_path), '--device', 'cpu', '--jobs', '2'])  # fmt: skip
    record = {}
    written = grid.pretrain_all(args, grid.pretraining_runs(args), record, lambda: None)
    assert next(written) == str(tmp_path / 'vanilla.s0.pretrain.params')
    written.close()
    second = record['vanilla.s1 pretrain']
    assert second['params_md5'] == grid.files.md5(str(tmp_path / 'vanilla.s1.pretrain.params'))
    assert second['final_loss'] == 2.5 and second['shared'] == 1
    assert record['vanilla.s0 pretrain']['final_loss'] == 2.5
    assert 'pretrain_seconds' in second


def test_the_next_pretraining_starts_before_the_last_ones_finetunings(tmp_path, monkeypatch):
    """--jobs 1: a pretraining's params are handed on for finetuning with the next
    pretraining already started, so that it runs while they are finetuned."""
    started = fake_pretrainings(monkeypatch)
    args = grid.parse_args(['--pretrain', 'vanilla', '--pretrain_seeds', '0', '1', '--outdir',
                            str(tmp_path), '--device', 'cpu'])  # fmt: skip
    written = grid.pretrain_all(args, grid.pretraining_runs(args), {}, lambda: None)
    assert next(written) == str(tmp_path / 'vanilla.s0.pretrain.params')
    assert len(started) == 2 and started[1].returncode is None
    assert next(written) == str(tmp_path / 'vanilla.s1.pretrain.params')
    assert next(written, None) is None


def test_jobs_get_a_gpu_each_on_several(tmp_path, monkeypatch):
    """--jobs on a host with two GPUs (simulated): each process its own GPU, a freed one
    given to the next, more jobs than GPUs in turn; one GPU, or none, changes nothing; a
    CUDA_VISIBLE_DEVICES already set is what is shared out. grid.json records how many
    runs shared each process."""
    monkeypatch.setattr(grid.torch.cuda, 'device_count', lambda: 2)
    monkeypatch.delenv('CUDA_VISIBLE_DEVICES', raising=False)
    assert grid.visible_gpus('cuda') == ['0', '1'] and grid.visible_gpus('cpu') == []
    monkeypatch.setenv('CUDA_VISIBLE_DEVICES', '3,5')
    assert grid.visible_gpus('cuda') == ['3', '5']
    assert [grid.gpu_for(slot, ['3', '5']) for slot in range(3)] == [
        {'CUDA_VISIBLE_DEVICES': g} for g in ('3', '5', '3')
    ]
    assert grid.gpu_for(1, ['0']) == {} and grid.gpu_for(0, []) == {}

    started = fake_pretrainings(monkeypatch)
    monkeypatch.setattr(grid.devices, 'describe', lambda device: 'two GPUs')
    monkeypatch.delenv('CUDA_VISIBLE_DEVICES')
    args = grid.parse_args(['--pretrain', 'vanilla', '--pretrain_seeds', '0', '1', '2', '3', '4',
                            '--outdir', str(tmp_path), '--device', 'cuda', '--precision', 'bf16',
                            '--jobs', '2', '--share', '2'])  # fmt: skip
    record = {}
    written = list(grid.pretrain_all(args, grid.pretraining_runs(args), record, lambda: None))
    assert len(written) == 5
    # the third waits for the first, which ends first, and takes its GPU
    assert [p.env['CUDA_VISIBLE_DEVICES'] for p in started] == ['0', '1', '0']
    assert [p.running_then for p in started] == [0, 1, 1]
    assert [len(p.outs) for p in started] == [2, 2, 1]
    assert [record[f'vanilla.s{s} pretrain']['shared'] for s in range(5)] == [2, 2, 2, 2, 1]


@pytest.mark.slow
def test_pretrainings_that_share_a_process_are_finetuned_as_any(tiny, monkeypatch, capsys):
    """--share 2: vanilla's two seeds pretrained in one shared_runs.py process, each
    params file then finetuned and evaluated; grid.json records that two shared."""
    monkeypatch.chdir(tiny)
    argv = ['--pretrain', 'vanilla', '--pretrain_seeds', '0', '1', '--seeds', '0',
            '--pretrain_max_epochs', '2', '--max_epochs', '1', '--pretrain_corpus_path',
            'wiki.txt', '--finetune_corpus_path', 'train.tsv', '--eval_corpus_path', 'dev.tsv',
            '--test_corpus_path', 'test.tsv', '--outdir', 'p', '--device', 'cpu',
            '--precision', 'fp32', '--share', '2']  # fmt: skip
    grid.main(argv)
    assert 'shared_runs.py pretrain vanilla wiki.txt' in capsys.readouterr().out
    record = json.loads((tiny / 'p' / 'grid.json').read_text())
    for seed in (0, 1):
        entry = record[f'vanilla.s{seed} pretrain']
        assert entry['shared'] == 2 and entry['final_loss'] > 0
        assert record[f'vanilla.s{seed} full s0']['dev_total'] == 4
    assert (
        record['vanilla.s0 pretrain']['final_loss'] != record['vanilla.s1 pretrain']['final_loss']
    )
    assert 'pretrain done: 2 steps' in (tiny / 'p' / 'vanilla.s0+1.pretrain.log').read_text()


def test_batch_sizes_reach_the_pretraining_and_finetuning_commands():
    """--pretrain_batch_size is each pretraining's --batch_size, --batch_size each
    finetuning's; not given, the commands leave run.py's defaults (and their records) be."""
    args = grid.parse_args([*PRETRAIN, '--pretrain_batch_size', '32', '--batch_size', '16'])
    ((_, _, made_with, argv), *_) = grid.pretraining_runs(args)
    assert argv[-2:] == ['--batch_size', '32'] and made_with['pretrain'] == argv[1:]
    finetune = grid.overrides(args)
    assert finetune[finetune.index('--batch_size') + 1] == '16'
    plain = grid.parse_args(PRETRAIN)
    assert all('--batch_size' not in argv for *_, argv in grid.pretraining_runs(plain))
    assert '--batch_size' not in grid.overrides(plain)


def test_the_pretraining_edition_reaches_run_py_and_only_the_pretrainings():
    """--pretrain_edition is each pretraining's --edition, as run.py reads it (rope on the
    2021 schedule); the finetunings keep theirs; not given, each variant its own."""
    one = ['--pretrain', 'rope', '--pretrain_seeds', '0']
    args = grid.parse_args([*PRETRAIN, *one, '--pretrain_edition', '2021'])
    ((_, _, made_with, argv),) = grid.pretraining_runs(args)
    assert made_with['pretrain'] == argv[1:] and run.parse_args(argv).edition == '2021'
    assert '--edition' not in grid.overrides(args)
    plain = grid.parse_args([*PRETRAIN, *one])
    ((*_, argv),) = grid.pretraining_runs(plain)
    assert '--edition' not in argv and run.parse_args(argv).edition == '2024'
