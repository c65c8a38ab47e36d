"""Knowledge over pretraining: what each checkpoint of one pretraining has stored and what
finetuning can retrieve from it, epoch by epoch, beside the learning rate.

    python src/run.py pretrain vanilla wiki.txt --writing_params_path vanilla.pretrain.params \
        --save_every 50
    python research/grid.py --pretrained vanilla.pretrain.epoch*.params --outdir grid
    python research/cloze.py vanilla.pretrain.epoch050.params --exposure vanilla.exposure.json \
        --finetuned grid/vanilla.pretrain.epoch050.full.s0.dev.predictions \
        --json cloze/epoch050.json      # and so on for each checkpoint
    python research/over_pretraining.py cloze/*.json \
        --metrics vanilla.pretrain.params.metrics.csv --plot knowledge.png

Each input is cloze.py's --json of one checkpoint (a params file named as --save_every
names them, ...epochNNN.params), made with --finetuned (that checkpoint's finetuned dev
predictions) and --exposure. A row per checkpoint: the pretraining's learning rate at the
epoch's end and its mean loss over the epoch (from --metrics), then, over all dev people
and over those whose place pretraining showed often: the finetuned model's accuracy and
how often the pretrained model continues the person's document with the place (stored);
over all, the "NAME was born in " and question probes too (extractable without
finetuning). --plot (matplotlib) draws the same against the epoch.
"""

import import_paths  # noqa: F401 (first: src/ and tools/ on sys.path)

import argparse
import json
import re
import sys

import analyze
import plot
from machinery import checks, files


def read_checkpoint(path):
    """(epoch, cloze report) of one of cloze.py's --json reports."""
    try:
        with open(path, encoding='utf-8') as f:
            report = json.load(f)
        records, name = report['records'], report['params']
    except OSError as e:
        raise files.UserError(f"{path}: cannot read: {e.strerror}")
    except (ValueError, KeyError, TypeError):
        raise files.UserError(f"{path}: not the --json of cloze.py")
    match = re.search(r'\.epoch(\d+)\.', name)
    if not match:
        raise files.UserError(
            f"{path}: its params {name} name no epoch (run.py --save_every's names)"
        )
    if not records or 'finetuned right' not in records[0] or records[0]['fraction seen'] is None:
        raise files.UserError(f"{path}: made without cloze.py's --finetuned and --exposure")
    return int(match.group(1)), records


def share(records, right):
    """The share of the records for which right(record) holds, of those it is not None for."""
    values = [right(r) for r in records]
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def checkpoint_row(epoch, records, metrics):
    often = [r for r in records if analyze.exposure_bin(r['fraction seen']) == analyze.OFTEN]
    stored = lambda r: r['document']['right'] if 'document' in r else None
    row = {'epoch': epoch, 'people': len(records), 'often people': len(often)}
    if metrics:
        epochs, losses, lrs = metrics
        in_epoch = [loss for x, loss in zip(epochs, losses) if epoch - 1 < x <= epoch]
        row['lr'] = next((lr for x, lr in zip(reversed(epochs), reversed(lrs)) if x <= epoch), None)
        row['loss'] = sum(in_epoch) / len(in_epoch) if in_epoch else None
    row['finetuned'] = share(records, lambda r: r['finetuned right'])
    row['finetuned, often'] = share(often, lambda r: r['finetuned right'])
    row['document'] = share(records, stored)
    row['document, often'] = share(often, stored)
    row['name'] = share(records, lambda r: r['name']['right'])
    row['question'] = share(records, lambda r: r['question']['right'])
    return row


COLUMNS = [  # (key, header, format)
    ('epoch', 'epoch', '{:>5}'),
    ('lr', 'lr', '{:>8.1e}'),
    ('loss', 'loss', '{:>6.3f}'),
    ('finetuned', 'finetuned', '{:>9.1%}'),
    ('finetuned, often', 'ft often', '{:>9.1%}'),
    ('document', 'document', '{:>8.1%}'),
    ('document, often', 'doc often', '{:>9.1%}'),
    ('name', 'name', '{:>5.1%}'),
    ('question', 'question', '{:>8.1%}'),
]


def print_table(rows):
    columns = [c for c in COLUMNS if c[0] in rows[0]]
    width = lambda fmt: int(re.search(r'>(\d+)', fmt).group(1))
    print(' '.join(f"{header:>{width(fmt)}}" for _, header, fmt in columns))
    for row in rows:
        cells = []
        for key, _, fmt in columns:
            value = row[key]
            cells.append(fmt.format(value) if value is not None else f"{'-':>{width(fmt)}}")
        print(' '.join(cells))


def plot_rows(rows, metrics, out):
    plt = plot.pyplot('over_pretraining.py --plot')
    fig, ax = plt.subplots(figsize=(8, 5.5))
    epochs = [row['epoch'] for row in rows]
    lines = [
        ('finetuned', 'finetuned: dev accuracy', 'C0', '-'),
        ('finetuned, often', 'finetuned: places shown often', 'C0', ':'),
        ('document, often', 'stored: own document, places shown often', 'C1', ':'),
        ('document', 'stored: own document', 'C1', '-'),
        ('name', 'extractable: "NAME was born in"', 'C2', '-'),
    ]
    for key, label, color, style in lines:
        values = [100 * row[key] if row[key] is not None else None for row in rows]
        ax.plot(epochs, values, color=color, linestyle=style, marker='o', markersize=3, label=label)
    ax.set_xlabel('pretraining epoch')
    ax.set_ylabel('% right')
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    if metrics:
        lr_axis = ax.twinx()
        lr_axis.plot(metrics[0], metrics[2], color='gray', linestyle='--', linewidth=0.8)
        lr_axis.set_ylabel('learning rate (dashed)')
        lr_axis.set_ylim(bottom=0)
    ax.legend(fontsize=8, loc='upper center', bbox_to_anchor=(0.5, -0.13), ncol=2)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    print(f"wrote {out}")


def main(argv=None):
    argp = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    argp.add_argument('cloze', nargs='+', help="cloze.py's --json of each checkpoint")
    argp.add_argument('--metrics', help="the pretraining's PARAMS.metrics.csv (run.py's)")
    argp.add_argument('--plot', help="draw the table against the epoch here (needs matplotlib)")
    argp.add_argument('--json', help="write the table's rows here")
    args = argp.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        checks.check_reports(args, 'json', 'plot')
        checkpoints = sorted((read_checkpoint(path) for path in args.cloze), key=lambda c: c[0])
        epochs = [epoch for epoch, _ in checkpoints]
        if len(set(epochs)) < len(epochs):
            raise files.UserError("two of the cloze reports are of the same epoch")
        metrics = plot.read_metrics(args.metrics) if args.metrics else None
        rows = [checkpoint_row(epoch, records, metrics) for epoch, records in checkpoints]
        people, often = rows[0]['people'], rows[0]['often people']
        print(f"{len(rows)} checkpoints; right, over all {people} dev people and over the")
        print(f"{often} whose place pretraining showed often:")
        print_table(rows)
        if args.json:
            text = json.dumps(rows, indent=1)
            files.atomic_write(args.json, lambda f: f.write(text.encode('utf-8')))
        if args.plot:
            plot_rows(rows, metrics, args.plot)
    except files.UserError as e:
        sys.exit(files.report(e))


if __name__ == '__main__':
    main()
