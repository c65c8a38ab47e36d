"""The whole assignment in one command: the handout's eleven run.py commands (parts d, f
and g) and the London baseline, then a table of dev accuracies and times.

    python tools/reproduce.py                 # the handout's settings (hours on a CPU)
    python tools/reproduce.py --max_epochs 1  # every training phase cut to 1 epoch
    python tools/reproduce.py --edition 2024  # another edition: vanilla and rope, its settings

Each edition's second variant: synthesizer (2021), perceiver with --bottleneck_dim 64
as its handout passes (2023), rope (2024, 2025).

It writes the handout's file names (vanilla.model.params, ...) into --outdir, so that
collect_submission.sh can pack them, and skips each phase whose output already exists:
after an interruption, run the same command again. A phase that was interrupted
resumes from its saved state. results.json beside the outputs records the settings each
was made with (edition, seed, --max_epochs, precision, corpus) and the params it was made
from: an output made with other settings is refused, naming the file, before any work,
and one whose params have changed since is made again. The table goes to results.md.
"""

import import_paths  # noqa: F401 (first: src/ and tools/ on sys.path)

import machinery.cpu_libraries  # noqa: F401 (first: it sets up MKL and oneDNN before torch)

import argparse
import os
import time

from london_baseline import london_baseline, write_accuracy

import records
import run
import utils
from machinery import devices, distributed, files


def parse_args(argv):
    argp = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    argp.add_argument('--pretrain_corpus_path', default='wiki.txt')
    argp.add_argument('--outdir', default='.', help="where the results go (default: here)")
    argp.add_argument(
        '--max_epochs', type=run.positive(int), help="cap every training phase at this"
    )
    argp.add_argument('--seed', type=int, default=0)
    devices.add_arguments(argp)
    argp.add_argument(
        '--edition',
        choices=sorted(run.EDITIONS),
        default='2021',
        help="the handout edition to run (default 2021: vanilla and synthesizer)",
    )
    return argp.parse_args(argv)


def phases(out, edition='2021'):
    """(name, run.py arguments after the corpus, output file) in the handout's order;
    outputs go to the folder `out`, inputs are found as run.py finds them."""
    variant, variant_flags = run.EDITIONS[edition]['second_variant']
    train = files.find_data_file('birth_places_train.tsv')

    def step(name, output, function, v, *flags):
        argv = [function, v, *flags, '--edition', edition] + (variant_flags if v == variant else [])
        return name, argv, os.path.join(out, output)

    def evaluations(v, params, prefix):
        return [
            step(f'{prefix}: evaluate {split}', f'{prefix}.{split}.predictions', 'evaluate', v,
                 '--reading_params_path', os.path.join(out, params),
                 '--eval_corpus_path', files.find_data_file(corpus),
                 '--outputs_path', os.path.join(out, f'{prefix}.{split}.predictions'))
            for split, corpus in (('dev', 'birth_dev.tsv'), ('test', 'birth_test_inputs.tsv'))
        ]  # fmt: skip

    scratch = 'vanilla.model.params'
    steps = [
        step('vanilla, no pretraining: finetune', scratch, 'finetune', 'vanilla',
             '--writing_params_path', os.path.join(out, scratch), '--finetune_corpus_path', train)
    ]  # fmt: skip
    steps += evaluations('vanilla', scratch, 'vanilla.nopretrain')
    for v in ('vanilla', variant):
        pretrained, finetuned = f'{v}.pretrain.params', f'{v}.finetune.params'
        steps += [
            step(f'{v}: pretrain', pretrained, 'pretrain', v,
                 '--writing_params_path', os.path.join(out, pretrained)),
            step(f'{v}: finetune', finetuned, 'finetune', v,
                 '--reading_params_path', os.path.join(out, pretrained),
                 '--writing_params_path', os.path.join(out, finetuned),
                 '--finetune_corpus_path', train),
        ]  # fmt: skip
        steps += evaluations(v, finetuned, f'{v}.pretrain')
    return steps


def run_all(args, device):
    """Every phase whose output is missing or stale, then the London baseline; returns the
    results record, which results.json keeps after every phase."""
    os.makedirs(args.outdir, exist_ok=True)
    record = os.path.join(args.outdir, 'results.json')
    results = records.read_record(record)
    save = lambda: records.write_record(record, results)
    made_with = {
        'edition': args.edition,
        'seed': args.seed,
        'max_epochs': args.max_epochs,
        'precision': devices.training_precision(args.precision, device),
        'pretrain_corpus': os.path.basename(args.pretrain_corpus_path),
    }
    steps = phases(args.outdir, args.edition)
    records.check_made_with([(name, output, made_with) for name, _, output in steps], results)
    for name, phase_argv, output in steps:
        inputs = input_digests(phase_argv)
        if os.path.exists(output) and results.get(name, {}).get('inputs', inputs) == inputs:
            print(f"== {name}: {output} exists, skipped")
            results.setdefault(name, {'seconds': None})
        else:
            redone = f": redone, as its input changed since {output} was made"
            print(f"== {name}{redone if os.path.exists(output) else ''}")
            results[name] = {'made_with': made_with, 'inputs': inputs, 'seconds': None}
            save()  # before the work: a leftover .resume is then known to be this run's
            start = time.time()
            run_phase(phase_argv, output, args.pretrain_corpus_path, overrides(args), device)
            results[name]['seconds'] = time.time() - start
        if name.endswith('evaluate dev'):
            predictions = open(output, encoding='utf-8').read().splitlines()
            results[name]['accuracy'] = accuracy(
                utils.evaluate_places('birth_dev.tsv', predictions)
            )
        save()
    london = london_baseline('birth_dev.tsv')
    results['London baseline'] = {'accuracy': accuracy(london), 'seconds': 0}
    if run.EDITIONS[args.edition]['london_accuracy_file']:
        write_accuracy(*london, os.path.join(args.outdir, 'london_baseline_accuracy.txt'))
    return results


def overrides(args):
    """The flags this command passes on to every training phase."""
    flags = ['--seed', str(args.seed), '--precision', args.precision]
    return flags + (['--max_epochs', str(args.max_epochs)] if args.max_epochs else [])


def input_digests(phase_argv):
    """{path: md5} of the params files a phase reads: what its output was made from."""
    return {
        path: files.md5(path)
        for flag, path in zip(phase_argv, phase_argv[1:])
        if flag == '--reading_params_path' and os.path.exists(path)
    }


def run_phase(argv, output, corpus, overrides, device):
    """Runs one run.py command in this process; evaluate returns (total, correct)."""
    function, variant = argv[:2]
    argv = argv + ['--device', device]
    if function != 'evaluate':
        argv = argv + overrides + (['--resume'] if os.path.exists(output + '.resume') else [])
    return records.run_command([function, variant, corpus] + argv[2:])


def accuracy(total_correct):
    total, correct = total_correct
    return f"{correct / total * 100:.1f}% ({correct:.0f}/{total:.0f})" if total else "n/a"


def write_table(results, settings, path, device):
    lines = [
        '# Results',
        '',
        f"Machine: {devices.describe(device)}",
        f"Settings: {settings}",
        '',
        '| phase | dev accuracy | time |',
        '|---|---|---|',
    ]
    for name, entry in results.items():
        time_taken = (
            run.format_seconds(entry['seconds'])
            if entry.get('seconds') is not None
            else 'earlier run'
        )
        lines.append(f"| {name} | {entry.get('accuracy', '')} | {time_taken} |")
    files.atomic_write(path, lambda f: f.write(('\n'.join(lines) + '\n').encode('utf-8')))
    return '\n'.join(lines)


def main(argv=None):
    args = parse_args(argv)
    with records.one_line_stops('tools/reproduce.py', argv):
        distributed.one_process('reproduce.py')
        device = devices.pick_device(args.device)
        results = run_all(args, device)
    settings = (
        f"the {args.edition} handout's, training precision "
        f"{devices.training_precision(args.precision, device)}, seed {args.seed}"
    )
    if args.max_epochs:
        settings += f", --max_epochs {args.max_epochs} for every training phase"
    print()
    print(write_table(results, settings, os.path.join(args.outdir, 'results.md'), device))


if __name__ == '__main__':
    main()
