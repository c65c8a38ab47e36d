"""Known and unknown finetuning examples: one pretrained model finetuned on subsets of the
finetuning file, side by side. Does finetuning on facts pretraining never showed lower dev
accuracy, or raise the confidence given to people who do not exist?

    python src/exposure.py --json exposure.json --subsets subsets
    python src/grid.py --pretrained vanilla.pretrain.params --methods full lora:1 \\
        --seeds 0 1 2 3 4 --finetune_corpus_path subsets/seen.tsv --outdir grid-seen
    python src/analyze.py grid-seen/vanilla.full.s0.dev.predictions --variant vanilla \\
        --params grid-seen/vanilla.full.s0.params --exposure exposure.json \\
        --json grid-seen/vanilla.full.s0.analysis.json          # and so for every run
    python src/known_unknown.py grid-all grid-seen grid-seen.control grid-often grid-often.control

Each directory is a grid.py --outdir; each run's analyze.py report lies beside its params
(PREFIX.analysis.json for PREFIX.params). A row per directory, model and method: the
finetuning file and its examples, the runs, dev accuracy (mean ± standard deviation over
the seeds), then, as means over the runs with a report: the accuracy on dev facts that
pretraining showed often and on those it never showed, the median confidence on dev, and
on the invented people the median confidence and the share answered above 0.5.
"""

import argparse
import json
import os
import statistics
import sys

import analyze
import files
import grid

HEADER = ('| model | method | finetuning file | examples | runs | dev accuracy | often shown '
          '| never shown | median confidence: dev | invented | invented above 0.5 |')  # fmt: skip


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
    """What a row averages over the runs, from one run's analyze.py report."""
    invented = [confidence for _, _, confidence in report['invented people']['answers']]
    return {
        'often': band_accuracy(report, analyze.OFTEN),
        'never': band_accuracy(report, analyze.NEVER),
        'dev confidence': report['median confidence'],
        'invented confidence': report['invented people']['median confidence'],
        'invented above 0.5': 100 * sum(c > 0.5 for c in invented) / len(invented),
    }


def mean_of(figures, key):
    values = [f[key] for f in figures if f[key] is not None]
    return statistics.mean(values) if values else None


def rows(directory):
    """A row per model and method of the grid in directory."""
    path = os.path.join(directory, 'grid.json')
    if not os.path.exists(path):
        raise files.UserError(f"{directory}: no grid.json (give grid.py's --outdir)")
    record = grid.records.read_record(path)
    out = []
    for (model, method), entries in grid.finished(record).items():
        corpus = corpus_of(entries[0]['made_with'])
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
            **{key: mean_of(figures, key) for key in (figures[0] if figures else {})},
        })  # fmt: skip
    return out


def markdown_row(row):
    cell = lambda value, fmt: '-' if value is None else fmt.format(value)
    runs = f"{row['runs']}" + (
        f" ({row['analyzed']} analyzed)" if row['analyzed'] < row['runs'] else ''
    )
    return (
        f"| {row['model']} | {row['method']} | {row['finetuning file']} | "
        f"{cell(row['examples'], '{:,}')} | {runs} | {grid.mean_sd(row['dev accuracy'])} | "
        f"{cell(row.get('often'), '{:.1f}')} | {cell(row.get('never'), '{:.1f}')} | "
        f"{cell(row.get('dev confidence'), '{:.3f}')} | "
        f"{cell(row.get('invented confidence'), '{:.3f}')} | "
        f"{cell(row.get('invented above 0.5'), '{:.1f}%')} |"
    )


def main(argv=None):
    argp = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    argp.add_argument('grids', nargs='+', help="grid.py --outdir directories, one per subset")
    argp.add_argument('--json', help="write the rows here")
    args = argp.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        table = [row for directory in args.grids for row in rows(directory)]
    except files.UserError as e:
        sys.exit(files.report(e))
    table.sort(key=lambda row: (row['model'], row['method']))  # stable: the directories' order
    print("Dev accuracy in % (mean ± sd over the seeds); the other figures are means over the")
    print("runs with an analyze.py report: accuracy in % on the dev facts pretraining showed")
    print("often and never, the median confidence on dev and on invented people, and the")
    print("share of invented people answered with a confidence above 0.5.")
    print()
    print(HEADER)
    print('|---' * HEADER.count(' | ') + '|---|')
    for row in table:
        print(markdown_row(row))
    if args.json:
        text = json.dumps(table, indent=1)
        files.atomic_write(args.json, lambda f: f.write(text.encode('utf-8')))


if __name__ == '__main__':
    main()
