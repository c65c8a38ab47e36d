"""Known and unknown finetuning examples: one pretrained model finetuned on subsets of the
finetuning file, side by side. Does finetuning on facts pretraining never showed lower dev
accuracy, or raise the confidence given to people who do not exist?

    python research/exposure.py --json exposure.json --subsets subsets
    python research/grid.py --pretrained vanilla.pretrain.params --methods full lora:1 \\
        --seeds 0 1 2 3 4 --finetune_corpus_path subsets/seen.tsv --outdir grid-seen
    python research/analyze.py grid-seen/vanilla.full.s0.dev.predictions --variant vanilla \\
        --params grid-seen/vanilla.full.s0.params --exposure exposure.json \\
        --json grid-seen/vanilla.full.s0.analysis.json          # and so for every run
    python research/known_unknown.py grid-all grid-seen grid-seen.control grid-often \\
        grid-often.control

Each directory is a grid.py --outdir; each run's analyze.py report lies beside its params
(PREFIX.analysis.json for PREFIX.params). A row per directory, model and method: the
finetuning file and its examples, the runs, dev accuracy (mean ± standard deviation over
the seeds), then, over the runs with a report: the accuracy on dev facts that pretraining
showed often and on those it never showed, the median confidence on dev, and on the
invented people the median confidence and the share answered above 0.5.

Then the differences that answer the question, each a difference of means ± its standard
error (sqrt(sd1^2/n1 + sd2^2/n2)): each subset NAME.tsv against its control
NAME.control.tsv (a random subset of the same size), every file against the first
directory's (give the whole finetuning file first), and each method against full
finetuning on the same file.
"""

import import_paths  # noqa: F401 (first: src/ and tools/ on sys.path)

import argparse
import json
import math
import os
import statistics
import sys

import analyze
import grid
from machinery import checks, files

HEADER = ('| model | method | finetuning file | examples | runs | dev accuracy | often shown '
          '| never shown | median confidence: dev | invented | invented above 0.5 |')  # fmt: skip
DIFFERENCES = ('| model | method | finetuning file | against | dev accuracy '
               '| median confidence: dev | invented | invented above 0.5 |')  # fmt: skip
FIGURES = ('often', 'never', 'dev confidence', 'invented confidence', 'invented above 0.5')
COMPARED = ('dev accuracy', 'dev confidence', 'invented confidence', 'invented above 0.5')


def corpus_of(made_with):
    """The --finetune_corpus_path a grid run was finetuned on."""
    argv = made_with['finetune']
    return argv[argv.index('--finetune_corpus_path') + 1]


def examples(path):
    """The questions of a finetuning file, or None where it is no longer readable."""
    try:
        return len(analyze.read_questions(path))
    except files.UserError:
        return None


def band_accuracy(report, band):
    row = report['by exposure'].get(band)
    return 100 * row['correct'] / row['questions'] if row else None


def run_figures(report):
    """One run's figures, from its analyze.py report."""
    invented = [confidence for _, _, confidence in report['invented people']['answers']]
    return {
        'often': band_accuracy(report, analyze.OFTEN),
        'never': band_accuracy(report, analyze.NEVER),
        'dev confidence': report['median confidence'],
        'invented confidence': report['invented people']['median confidence'],
        'invented above 0.5': 100 * sum(c > 0.5 for c in invented) / len(invented),
    }


def mean(values):
    return statistics.mean(values) if values else None


def difference(values, against):
    """(mean of values - mean of against, its standard error), or None without two of each."""
    if len(values) < 2 or len(against) < 2:
        return None
    se = math.sqrt(statistics.variance(values) / len(values)
                   + statistics.variance(against) / len(against))  # fmt: skip
    return statistics.mean(values) - statistics.mean(against), se


def rows(directory):
    """A row per model and method of the grid in directory."""
    path = os.path.join(directory, 'grid.json')
    if not os.path.exists(path):
        raise files.UserError(f"{directory}: no grid.json (give grid.py's --outdir)")
    record = grid.records.read_record(path)
    out = []
    for (model, method), entries in grid.finished(record).items():
        corpus = corpus_of(entries[0]['made_with'])
        # grid.py keeps apart only runs of one seed; one row's seeds must share both inputs
        for key, what in ((corpus_of, 'finetuning files'),
                          (lambda m: m.get('pretrained_md5'), 'pretrained params')):  # fmt: skip
            if len({key(entry['made_with']) for entry in entries}) > 1:
                raise files.UserError(
                    f"{directory}: the {model} ({method}) runs have different {what}: "
                    "give each grid.py command its own --outdir"
                )
        figures = []
        for entry in entries:
            prefix = grid.output_prefix(directory, model, method, entry['made_with']['seed'])
            if os.path.exists(prefix + '.analysis.json'):
                report = analyze.read_report(prefix + '.analysis.json')
                if 'by exposure' not in report:
                    raise files.UserError(f"{prefix}.analysis.json: made without --exposure")
                figures.append(run_figures(report))
        out.append({
            'directory': directory, 'model': model, 'method': method,
            'finetuning file': os.path.basename(corpus), 'examples': examples(corpus),
            'runs': len(entries), 'analyzed': len(figures),
            'dev accuracy': [grid.accuracy(e) for e in entries],
            **{key: [f[key] for f in figures if f[key] is not None] for key in FIGURES},
        })  # fmt: skip
    return out


def differences(table, whole):
    """Each subset's rows against its control's and against those of the file named whole,
    and each method's against full's."""
    row_of = {}
    for r in table:
        key = (r['model'], r['method'], r['finetuning file'])
        if key in row_of:
            raise files.UserError(
                f"{r['directory']} and {row_of[key]['directory']}: both finetune {key[0]} "
                f"({key[1]}) on a file named {key[2]}"
            )
        row_of[key] = r
    pairs = []
    for row in table:
        stem, ext = os.path.splitext(row['finetuning file'])
        control = row_of.get((row['model'], row['method'], stem + '.control' + ext))
        if control:
            pairs.append((row, control, control['finetuning file']))
    for row in table:
        first = row_of.get((row['model'], row['method'], whole))
        if first and row is not first:
            pairs.append((row, first, whole))
    for row in table:
        full = row_of.get((row['model'], 'full', row['finetuning file']))
        if full and row is not full:
            pairs.append((row, full, 'full'))
    return [
        {'model': row['model'], 'method': row['method'],
         'finetuning file': row['finetuning file'], 'against': against,
         **{key: difference(row[key], other[key]) for key in COMPARED}}
        for row, other, against in pairs
    ]  # fmt: skip


def cell(value, fmt):
    return '-' if value is None else fmt.format(value)


def markdown_row(row):
    runs = f"{row['runs']}" + (
        f" ({row['analyzed']} analyzed)" if row['analyzed'] < row['runs'] else ''
    )
    return (
        f"| {row['model']} | {row['method']} | {row['finetuning file']} | "
        f"{cell(row['examples'], '{:,}')} | {runs} | {grid.mean_sd(row['dev accuracy'])} | "
        f"{cell(mean(row['often']), '{:.1f}')} | {cell(mean(row['never']), '{:.1f}')} | "
        f"{grid.mean_sd(row['dev confidence'], '{:.3f}')} | "
        f"{grid.mean_sd(row['invented confidence'], '{:.3f}')} | "
        f"{grid.mean_sd(row['invented above 0.5'], '{:.1f}')} |"
    )


def markdown_difference(row):
    def signed(key, fmt):
        if row[key] is None:
            return '-'
        value, se = row[key]
        return f"{fmt.format(value)} ± {fmt.format(se).lstrip('+')}"

    return (
        f"| {row['model']} | {row['method']} | {row['finetuning file']} | {row['against']} | "
        f"{signed('dev accuracy', '{:+.1f}')} | {signed('dev confidence', '{:+.3f}')} | "
        f"{signed('invented confidence', '{:+.3f}')} | {signed('invented above 0.5', '{:+.1f}')} |"
    )


def print_table(header, lines):
    print(header)
    print('|---' * header.count(' | ') + '|---|')
    for line in lines:
        print(line)


def main(argv=None):
    argp = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    argp.add_argument('grids', nargs='+', help="grid.py --outdir directories, one per subset")
    argp.add_argument('--json', help="write the rows here")
    args = argp.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        checks.check_reports(args, 'json')
        table = [row for directory in args.grids for row in rows(directory)]
        table.sort(key=lambda row: (row['model'], row['method']))  # stable: directories' order
        whole = next((r['finetuning file'] for r in table if r['directory'] == args.grids[0]), None)
        compared = differences(table, whole)
    except files.UserError as e:
        sys.exit(files.report(e))
    print("Dev accuracy in % (mean ± sd over the seeds); the other figures come from the runs")
    print("with an analyze.py report: accuracy in % on the dev facts pretraining showed often")
    print("and never (means), the median confidence on dev and on invented people, and the")
    print("share in % of invented people answered with a confidence above 0.5 (mean ± sd).")
    print()
    print_table(HEADER, [markdown_row(row) for row in table])
    print()
    print("Differences of the means ± their standard error: each subset against its control")
    print("(a random subset of the same size), every file against the first directory's,")
    print("each method against full finetuning.")
    print()
    print_table(DIFFERENCES, [markdown_difference(row) for row in compared])
    if args.json:
        text = json.dumps({'rows': table, 'differences': compared}, indent=1)
        files.atomic_write(args.json, lambda f: f.write(text.encode('utf-8')))


if __name__ == '__main__':
    main()
