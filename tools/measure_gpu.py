"""What a GPU does with this code, measured in one go and printed as a table for README
(docs/gpus-and-macs.md): the GPU tests, bench.py's step against the plain path in the
same run (eager and replayed from CUDA graphs), the handout's whole vanilla pretraining
timed, then its finetuning, and the dev accuracy.

    python tools/measure_gpu.py --out gpu_run                    # an H100: about 5 minutes
    python tools/measure_gpu.py --out gpu_run --precision fp16   # a T4 (Colab)

Every command runs as printed (`python src/run.py ...`, each in its own process), its
output kept in --out beside the params, metrics and predictions; the table is printed at
the end and written to --out/table.md. --max_epochs shortens the pretraining (a first
try; with --finetune_max_epochs and --device cpu, without graphs, the suite runs it).
"""

import import_paths  # noqa: F401 (first: src/ and tools/ on sys.path)

import argparse
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable


def run(command, out, name, timeout=None):
    """command (a list) run from the repository's root, its output shown and kept in
    out/name.log; returns (the output, the seconds it took)."""
    print(f"$ {shlex.join(command)}", flush=True)
    start = time.perf_counter()
    result = subprocess.run(
        command,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
    )
    seconds = time.perf_counter() - start
    (out / f'{name}.log').write_text(result.stdout, encoding='utf-8')
    tail = '\n'.join(line.split('\r')[-1] for line in result.stdout.splitlines()[-8:])
    print(tail, flush=True)
    if result.returncode:
        print(f"(exit status {result.returncode} after {seconds:.0f} s)", flush=True)
    return result.stdout, seconds, result.returncode


def found(pattern, text, default='-'):
    match = re.search(pattern, text)
    return match.group(1) if match else default


def phase_command(args, function, *more):
    """run.py's command for one phase of the handout's vanilla runs, with this run's
    device, precision and (on CUDA) graphs."""
    command = [PYTHON, 'src/run.py', function, 'vanilla', 'wiki.txt', *more]
    if function != 'evaluate':
        command += ['--device', args.device, '--precision', args.precision]
        if args.device == 'cuda':
            command.append('--cuda_graph')
    return command


def measure(args):
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    rows = []  # (what, figure)
    if not args.skip_tests:
        tests = ['tests/test_accelerators.py', 'tests/test_cuda_graphs.py']
        text, seconds, _ = run(
            [PYTHON, '-m', 'pytest', '-q', '-m', 'slow or not slow', *tests], out, 'tests'
        )
        summary = found(r'(\d+ (?:passed|failed)[^\n]*) in ', text)
        rows.append(('GPU tests (test_accelerators, test_cuda_graphs)', summary))
    for graphs in [False, True] if args.device == 'cuda' else [False]:
        bench = [PYTHON, 'tools/bench.py', '--steps', str(args.bench_steps), '--questions', '5']
        bench += ['--device', args.device, '--precision', args.precision]
        bench += ['--cuda_graph'] if graphs else []
        name = 'bench_graphs' if graphs else 'bench'
        text, _, _ = run(bench, out, name)
        label = 'replayed from CUDA graphs' if graphs else 'eager'
        if not graphs:
            rows.append(('machine', found(r'machine: ([^\n]*)', text)))
            rows.append(
                ('plain step (fp32, handout path)', found(r'plain: +([\d.]+ ms)/step', text))
            )
        ours = found(r'ours: +([\d.]+ ms/step.*x faster)', text)
        rows.append((f'our step, {label} (bench.py, same run)', re.sub(r'\s+', ' ', ours)))
    pretrain = out / 'vanilla.pretrain.params'
    more = ['--max_epochs', str(args.max_epochs)] if args.max_epochs else []
    command = phase_command(args, 'pretrain', '--writing_params_path', str(pretrain), *more)
    text, seconds, _ = run(command, out, 'pretrain')
    done = found(r'pretrain done: (\d+ steps in \S+ \([\d,]+ tokens/s\))', text)
    rows.append(('pretrain (wall clock, the process whole)', f"{seconds:.0f} s"))
    rows.append(('pretrain (training loop)', done))
    rows.append(('pretrain final loss', found(r'final loss ([\d.]+)', text)))
    finetuned = out / 'vanilla.finetune.params'
    command = phase_command(
        args,
        'finetune',
        '--reading_params_path',
        str(pretrain),
        '--writing_params_path',
        str(finetuned),
        '--finetune_corpus_path',
        'birth_places_train.tsv',
        *(['--max_epochs', str(args.finetune_max_epochs)] if args.finetune_max_epochs else []),
    )
    text, seconds, _ = run(command, out, 'finetune')
    rows.append(('finetune (wall clock)', f"{seconds:.0f} s"))
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
    text, seconds, _ = run(command, out, 'evaluate')
    rows.append(('evaluate dev (wall clock)', f"{seconds:.0f} s"))
    rows.append(('dev accuracy', found(r'Correct: ([^\n]*)', text)))
    table = '| measured | |\n|---|---|\n' + ''.join(f'| {a} | {b} |\n' for a, b in rows)
    (out / 'table.md').write_text(table, encoding='utf-8')
    print('\n' + table)
    return table


def parse_args(argv):
    argp = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    argp.add_argument('--out', required=True, help="folder for the logs, params and table")
    argp.add_argument('--device', default='cuda', choices=['cuda', 'cpu', 'mps'])
    argp.add_argument(
        '--precision',
        default='auto',
        choices=['auto', 'fp32', 'bf16', 'fp16'],
        help="run.py's --precision (fp16 on a T4)",
    )
    argp.add_argument(
        '--max_epochs', type=int, help="pretraining epochs (default: the handout's 650)"
    )
    argp.add_argument(
        '--finetune_max_epochs', type=int, help="finetuning epochs (default: the handout's)"
    )
    argp.add_argument('--bench_steps', type=int, default=20, help="bench.py's --steps")
    argp.add_argument('--skip_tests', action='store_true', help="leave out the GPU tests")
    return argp.parse_args(argv)


def main(argv=None):
    measure(parse_args(argv))


if __name__ == '__main__':
    main()
