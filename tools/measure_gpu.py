"""What a GPU does with this code, measured in one go and printed as a table for
docs/gpus-and-macs.md: bench.py's step against the plain path in the same run (eager,
graphed, compiled and graphed), each graph's replay alone and the producer's rate; the
handout's whole vanilla pretraining timed as a student runs it (the command as printed),
its loss against the CPU reference run's, then its finetuning and the dev accuracy; the
GPU tests; and the other variants' steps.

    python tools/measure_gpu.py --out gpu_run                    # an H100 or H200: 5 minutes
    python tools/measure_gpu.py --out gpu_run --precision fp16   # a T4 (Colab)
    python tools/measure_gpu.py --out gpu_share --sharing --budget 300   # 5 minutes

--sharing measures instead how many pretrainings a GPU makes a minute, in fp32 (the
precision runs that share a process take): one alone (CUDA graphs, and eager), two alone
at once (grid.py --jobs 2), and K runs stepping together in one process
(machinery/shared_runs.py, grid.py --share K) for each --share_counts, each --max_epochs
long (default 20), as runs per minute of the whole process and of the training loop,
extrapolated to the handout's 650 epochs; on CUDA also one alone in the precision run.py
picks (bf16 on a recent GPU), and first the largest K's graphed steps of runs alone
replayed one after another and at once on K streams (bench.py --concurrent). Last, how
seed 0's logged losses agree: its run alone against its second run alone (the first of
--jobs 2), which is the device's own spread, and on CUDA against seed 0 among K sharing
(elsewhere run.py alone draws other batches than sharing does).
"""

import import_paths  # noqa: F401 (first: src/ and tools/ on sys.path)

import argparse
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import plot
from machinery import files

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
REFERENCE_METRICS = ROOT / 'results' / 'vanilla.pretrain.params.metrics.csv'


class Measurement:
    """The table's rows, written to out/table.md as they come, and the time left."""

    def __init__(self, out, budget):
        self.out, self.rows = out, []
        self.deadline = time.perf_counter() + budget if budget else None

    def add(self, what, figure):
        self.rows.append((what, figure))
        (self.out / 'table.md').write_text(self.table(), encoding='utf-8')

    def table(self):
        return '| measured | |\n|---|---|\n' + ''.join(f'| {a} | {b} |\n' for a, b in self.rows)

    def left(self):
        return None if self.deadline is None else self.deadline - time.perf_counter()

    def run(self, command, name):
        """command (a list) run from the repository's root, its output shown and kept in
        out/name.log; returns (the output, the seconds it took, whether it ended in time
        with status 0)."""
        left = self.left()
        if left is not None and left < 5:
            print(f"(no time left for: {shlex.join(command)})", flush=True)
            return '', 0.0, False
        print(f"$ {shlex.join(command)}", flush=True)
        start = time.perf_counter()
        # its own process group, so that a command cut off ends with its children
        process = subprocess.Popen(
            command,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=sys.platform != 'win32',
        )
        try:
            text, _ = process.communicate(timeout=left)
            status = process.returncode
        except subprocess.TimeoutExpired:
            if sys.platform == 'win32':
                process.kill()
            else:
                os.killpg(process.pid, signal.SIGKILL)
            text, _ = process.communicate()
            status = 'cut off by --budget'
        seconds = time.perf_counter() - start
        (self.out / f'{name}.log').write_text(text, encoding='utf-8')
        tail = '\n'.join(line.split('\r')[-1] for line in text.splitlines()[-8:])
        print(tail, flush=True)
        if status:
            print(f"({status} after {seconds:.0f} s)", flush=True)
        return text, seconds, status == 0


def found(pattern, text, default='-'):
    match = re.search(pattern, text)
    return match.group(1) if match else default


def phase_command(args, function, *more):
    """run.py's command for one phase of the handout's vanilla runs, as printed, with
    this run's device and precision where they were given."""
    command = [PYTHON, 'src/run.py', function, 'vanilla', 'wiki.txt', *more]
    if args.device:
        command += ['--device', args.device]
    if args.precision and function != 'evaluate':
        command += ['--precision', args.precision]
    return command


def logged_losses(path):
    """{step: loss} of a metrics CSV (plot.logged_steps), empty where it cannot be read."""
    try:
        return {step: loss for step, (_, loss, _) in plot.logged_steps(path).items()}
    except files.UserError:
        return {}


def late_mean_loss(path, first, last):
    """The mean loss of steps first..last of a metrics CSV (None if it has none)."""
    losses = [loss for step, loss in logged_losses(path).items() if first <= step <= last]
    return sum(losses) / len(losses) if losses else None


def loss_agreement(path_a, path_b):
    """How two runs of one seed agree, from their metrics CSVs: the same at every logged
    step, or the first step where they part and the largest difference; '-' where either
    log is missing or they share no step."""
    a, b = logged_losses(path_a), logged_losses(path_b)
    steps = sorted(a.keys() & b.keys())
    if not steps:
        return '-'
    apart = [s for s in steps if a[s] != b[s]]
    if not apart:
        return f"identical: {len(steps)} logged steps, up to step {steps[-1]}"
    first, largest = apart[0], max(abs(a[s] - b[s]) for s in steps)
    return (
        f"first apart at step {first} ({a[first]:.6f} against {b[first]:.6f}); largest "
        f"difference {largest:.6f} over {len(steps)} logged steps; at step {steps[-1]}: "
        f"{a[steps[-1]]:.6f} against {b[steps[-1]]:.6f}"
    )


def bench(m, args, variant, paths, steps, more=()):
    command = [PYTHON, 'tools/bench.py', '--steps', str(steps), '--questions', '5']
    command += ['--variant', variant, '--paths', *paths, *more]
    command += ['--device', args.device or 'cuda']
    command += ['--precision', args.precision] if args.precision else []
    text, _, _ = m.run(command, f'bench_{variant}')
    return text


def measure(args):
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    m = Measurement(out, args.budget)
    gpu = (args.device or 'cuda') == 'cuda'
    paths = ['eager', 'graphed', 'compiled+graphed'] if gpu else ['eager']

    text = bench(m, args, 'vanilla', paths, args.bench_steps)
    m.add('machine', found(r'machine: ([^\n]*)', text))
    m.add('plain step (fp32, the handout path; bench.py)', found(r'plain: +([\d.]+ ms)/step', text))
    for path in paths:
        line = found(rf'ours, {re.escape(path)}: +([^\n]*)', text)
        m.add(f'our step, {path} (bench.py, same run)', re.sub(r'\s+', ' ', line))
    if gpu:
        producer = r'from (\d+ producer processes, which hand one over every [^;]*)'
        m.add('producer', found(producer, text))

    pretrain = out / 'vanilla.pretrain.params'
    more = ['--max_epochs', str(args.max_epochs)] if args.max_epochs else []
    command = phase_command(args, 'pretrain', '--writing_params_path', str(pretrain), *more)
    text, seconds, ok = m.run(command, 'pretrain')
    m.add('pretrain, the whole process (wall clock)', f"{seconds:.0f} s")
    m.add(
        'pretrain, training loop',
        found(r'pretrain done: (\d+ steps in \S+ \([\d,]+ tokens/s\))', text),
    )
    m.add('pretrain final loss', found(r'final loss ([\d.]+)', text))
    metrics = Path(f'{pretrain}.metrics.csv')
    if ok and not args.max_epochs and metrics.exists():
        here, there = (late_mean_loss(p, 14000, 14950) for p in (metrics, REFERENCE_METRICS))
        m.add(
            'pretrain mean loss, steps 14,000-14,950',
            f"{here:.4f} (the CPU reference run's: {there:.4f})",
        )
    notes = sorted(set(re.findall(r'^note: [^\n]*', text, re.M)))
    m.add('pretrain notes', '; '.join(notes) or 'none')

    finetuned = out / 'vanilla.finetune.params'
    epochs = ['--max_epochs', str(args.finetune_max_epochs)] if args.finetune_max_epochs else []
    command = phase_command(
        args,
        'finetune',
        '--reading_params_path',
        str(pretrain),
        '--writing_params_path',
        str(finetuned),
        '--finetune_corpus_path',
        'birth_places_train.tsv',
        *epochs,
    )
    text, seconds, _ = m.run(command, 'finetune')
    m.add('finetune (wall clock)', f"{seconds:.0f} s")
    command = phase_command(
        args,
        'evaluate',
        '--reading_params_path',
        str(finetuned),
        '--eval_corpus_path',
        'birth_dev.tsv',
        '--outputs_path',
        str(out / 'vanilla.pretrain.dev.predictions'),
    )
    text, seconds, _ = m.run(command, 'evaluate')
    m.add('evaluate dev (wall clock)', f"{seconds:.0f} s")
    m.add('dev accuracy', found(r'Correct: ([^\n]*)', text))

    if not args.skip_tests:
        tests = ['tests/test_cuda_graphs.py', 'tests/test_accelerators.py']
        text, seconds, _ = m.run(
            [
                PYTHON,
                '-m',
                'pytest',
                '-q',
                '-p',
                'no:cacheprovider',
                '-m',
                'slow or not slow',
                *tests,
            ],
            'tests',
        )
        summary = found(r'(\d+ (?:passed|failed)[^\n]*) in ', text)
        m.add('GPU tests (test_cuda_graphs, test_accelerators)', summary)
    for variant in args.variants:
        text = bench(m, args, variant, paths[-1:], args.bench_steps)
        line = re.sub(r'\s+', ' ', found(rf'ours, {re.escape(paths[-1])}: +([^\n]*)', text))
        plain = found(r'plain: +([\d.]+ ms)/step', text)
        m.add(f'{variant}: our step, {paths[-1]}', f"{line}; plain {plain}")
    print('\n' + m.table())
    return m.table()


# What one of the handout's vanilla pretrainings trains on: 650 epochs of 23 steps of
# 128 rows of 127 targets (its 2021 edition pads to the block size, 128).
HANDOUT_EPOCHS, HANDOUT_STEPS, HANDOUT_ROWS, HANDOUT_T = 650, 650 * 23, 128, 127
SHARING_EPOCHS = 20


def sharing_commands(args, out):
    """[(row name, command, runs it makes)] of --sharing: the vanilla pretraining, alone
    (graphed and eager on CUDA), two alone at once, and K sharing one process."""
    epochs = str(args.max_epochs or SHARING_EPOCHS)
    common = ['pretrain', 'vanilla', args.corpus, '--max_epochs', epochs]
    common += ['--device', args.device] if args.device else []
    # fp32 throughout: shared runs train in fp32 only (shared_runs.PRECISION_REFUSED)
    common += ['--precision', args.precision or 'fp32']
    alone = [PYTHON, 'src/run.py', *common, '--seed', '0', '--writing_params_path']
    gpu = (args.device or 'cuda') == 'cuda'
    commands = [
        ('one alone' + (', CUDA graphs' if gpu else ''), alone + [str(out / 'a.params')], 1)
    ]
    if gpu:
        commands.append(('one alone, eager', alone + [str(out / 'e.params'), '--eager'], 1))
        if not args.precision:
            auto = alone + [str(out / 'b.params')]
            auto[auto.index('--precision') + 1] = 'auto'
            commands.append(('one alone, CUDA graphs, --precision auto (the default)', auto, 1))
    pair = ' & '.join(
        shlex.join([*alone[:-2], str(seed), alone[-1], str(out / f'j{seed}.params')])
        for seed in (0, 1)
    )
    commands.append(('two alone at once (--jobs 2)', ['sh', '-c', f'{pair} & wait'], 2))
    for k in args.share_counts:
        seeds = [str(seed) for seed in range(k)]
        paths = [str(out / f's{k}.s{seed}.params') for seed in seeds]
        command = [PYTHON, 'src/machinery/shared_runs.py', *common, '--seeds', *seeds,
                   '--writing_params_paths', *paths]  # fmt: skip
        commands.append((f'{k} sharing one process (--share {k})', command, k))
    return commands


def runs_per_minute(text, seconds, runs):
    """'W/min (process), L/min (loop, 650 epochs)' of a sharing command's output: runs per
    minute of its wall clock, and of its training loops' rate extrapolated to the
    handout's pretraining (each run's tokens/s, summed); '-' for what it lacks."""
    done = re.findall(r'pretrain done: (\d+) steps in \S+ \(([\d,]+) tokens/s\)', text)
    if len(done) < runs or not seconds:
        return f"- (of {runs} runs, {len(done)} finished)"
    per_run = HANDOUT_STEPS * HANDOUT_ROWS * HANDOUT_T  # targets of one whole pretraining
    loop = sum(60 * int(rate.replace(',', '')) / per_run for _, rate in done[:runs])
    return f"{60 * runs / seconds:.2f}/min (process), {loop:.2f}/min (loop, 650 epochs)"


def measure_sharing(args):
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    m = Measurement(out, args.budget)
    m.add('runs per minute of', 'whole processes (short runs); training loops, extrapolated')
    gpu = (args.device or 'cuda') == 'cuda'
    if gpu:  # first: a minute at most, and it picks the design
        k = max(args.share_counts)
        text = bench(m, args, 'vanilla', ['graphed'], args.bench_steps, ['--concurrent', str(k)])
        m.add(f"{k} runs' graphed steps, alone and on {k} streams (bench.py)",
              found(r"graphed steps \(([^\n]*)", text))  # fmt: skip
    for index, (name, command, runs) in enumerate(sharing_commands(args, out)):
        text, seconds, ok = m.run(command, f'sharing{index}')
        m.add(name, runs_per_minute(text, seconds, runs) if ok else '- (failed or cut off)')
    # Seed 0 ran alone twice: how far the device's own arithmetic moves one run is the
    # yardstick for how far sharing moves it.
    alone = out / 'a.params.metrics.csv'
    m.add(
        'seed 0 alone, twice (one alone; --jobs 2)',
        loss_agreement(alone, out / 'j0.params.metrics.csv'),
    )
    for k in args.share_counts:
        shared = out / f's{k}.s0.params.metrics.csv'
        # off CUDA, run.py alone draws the handout's batches, not the seeded ones of sharing
        m.add(
            f'seed 0 alone, and among {k} sharing',
            loss_agreement(alone, shared) if gpu else '- (alone, off CUDA, other batches)',
        )
    print('\n' + m.table())
    return m.table()


def parse_args(argv):
    argp = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    argp.add_argument('--out', required=True, help="folder for the logs, params and table")
    argp.add_argument('--device', choices=['cuda', 'cpu', 'mps'], help="default: run.py's")
    argp.add_argument(
        '--precision',
        choices=['auto', 'fp32', 'bf16', 'fp16'],
        help="run.py's --precision (fp16 on a T4; default: run.py's)",
    )
    argp.add_argument(
        '--max_epochs', type=int, help="pretraining epochs (default: the handout's 650)"
    )
    argp.add_argument(
        '--finetune_max_epochs', type=int, help="finetuning epochs (default: the handout's)"
    )
    argp.add_argument('--bench_steps', type=int, default=30, help="bench.py's --steps")
    argp.add_argument('--skip_tests', action='store_true', help="leave out the GPU tests")
    argp.add_argument(
        '--variants',
        nargs='*',
        default=['synthesizer', 'rope', 'perceiver'],
        help="the other variants whose step bench.py times (default: all three)",
    )
    argp.add_argument('--budget', type=float, help="seconds for the whole measurement")
    argp.add_argument(
        '--sharing', action='store_true', help="measure pretrainings per minute instead (above)"
    )
    argp.add_argument(
        '--share_counts', nargs='+', type=int, default=[1, 2, 4, 5],
        help="with --sharing: the K runs per process measured (default 1 2 4 5)",
    )  # fmt: skip
    argp.add_argument('--corpus', default='wiki.txt', help="with --sharing: the corpus")
    return argp.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    (measure_sharing if args.sharing else measure)(args)


if __name__ == '__main__':
    main()
