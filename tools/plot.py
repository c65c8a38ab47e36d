"""Loss curves from training metrics, to hold a run of your own against the reference run.

    python tools/plot.py results/*.metrics.csv --out my_curves.png
    python tools/plot.py vanilla.pretrain.params.metrics.csv \
        results/vanilla.pretrain.params.metrics.csv

Each CSV is what run.py writes beside the params (PARAMS.metrics.csv: one row per step).
Pretraining runs (a file name with "pretrain.params") share one panel and finetuning
runs another, with epochs on the x axis: the per-step loss, light, its running mean, and
the learning rate, dashed, on the right-hand axis (the 2021 schedule's cosine ends near
epoch 200, then the rate climbs again: the loss curve shows it).
Needs matplotlib (pip install matplotlib), which nothing else here uses.
"""

import import_paths  # noqa: F401 (first: src/ and tools/ on sys.path)

import argparse
import csv
import os
import sys

from machinery import files


def logged_steps(path):
    """{step: (epoch, loss, learning rate)} of a metrics CSV. A resumed run appends to its
    CSV and may repeat the steps it ran after its last saved state: the later row of each
    step is kept."""
    try:
        with open(path, newline='', encoding='utf-8') as f:
            rows = list(csv.DictReader(f))
        by_step = {
            int(r['step']): (int(r['epoch']), float(r['loss']), float(r['lr'])) for r in rows
        }
    except OSError as e:
        raise files.UserError(f"{path}: cannot read: {e.strerror}")
    except (KeyError, ValueError, TypeError):
        raise files.UserError(f"{path}: not a metrics CSV (columns epoch, step, loss, lr, ...)")
    if not by_step:
        raise files.UserError(f"{path}: no steps recorded")
    return by_step


def read_metrics(path):
    """(epochs, losses, learning rates) of a metrics CSV (logged_steps), epochs as fractions
    (step 11 of a run with 8 steps per epoch is at 1.375). Works on thinned CSVs too."""
    by_step = logged_steps(path)
    steps = sorted(by_step)
    # step s of epoch e means (e-1)*S < s <= e*S for S steps per epoch; the last step of
    # any epoch (the final row, at least, of a finished run) gives S exactly
    steps_per_epoch = max(-(-s // by_step[s][0]) for s in steps)
    return (
        [s / steps_per_epoch for s in steps],
        [by_step[s][1] for s in steps],
        [by_step[s][2] for s in steps],
    )


def running_mean(values, width):
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= width:
            total -= values[i - width]
        out.append(total / min(i + 1, width))
    return out


def label(path):
    name = os.path.basename(path)
    return name[: -len('.params.metrics.csv')] if name.endswith('.params.metrics.csv') else name


def pyplot(who):
    """matplotlib.pyplot, drawing to files only; a UserError naming `who` without it."""
    try:
        import matplotlib
    except ImportError:
        raise files.UserError(f"{who} needs matplotlib (pip install matplotlib)")
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    return plt


def plot(paths, out):
    plt = pyplot('plot.py')
    panels = {
        'pretraining': [p for p in paths if 'pretrain.params' in os.path.basename(p)],
        'finetuning': [p for p in paths if 'pretrain.params' not in os.path.basename(p)],
    }
    panels = {title: group for title, group in panels.items() if group}
    fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 4.5), squeeze=False)
    for ax, (title, group) in zip(axes[0], panels.items()):
        lr_axis = ax.twinx()
        for path in group:
            epochs, losses, lrs = read_metrics(path)
            width = max(1, len(losses) // 200)
            (line,) = ax.plot(epochs, losses, alpha=0.25, linewidth=0.6)
            ax.plot(
                epochs,
                running_mean(losses, width),
                color=line.get_color(),
                linewidth=1.4,
                label=label(path),
            )
            lr_axis.plot(epochs, lrs, color=line.get_color(), linestyle='--', linewidth=0.8)
        ax.set_title(title)
        ax.set_xlabel('epoch')
        ax.set_ylabel('training loss (per step, and running mean)')
        lr_axis.set_ylabel('learning rate (dashed)')
        lr_axis.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    print(f"loss curves written to {out}")


def main(argv=None):
    argp = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    argp.add_argument('metrics', nargs='+', help="PARAMS.metrics.csv files written by run.py")
    argp.add_argument(
        '--out', default='loss_curves.png', help="picture to write (.png, .svg, .pdf)"
    )
    args = argp.parse_args(argv)
    try:
        plot(args.metrics, args.out)
    except files.UserError as e:
        sys.exit(files.report(e))


if __name__ == '__main__':
    main()
