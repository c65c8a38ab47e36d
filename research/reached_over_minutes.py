"""Held-out people reached, against pretraining minutes: for each pretraining of a small
world, the held-out people its checkpoints answer after finetuning, against the minutes its
pretraining took to reach each checkpoint, one line per pretraining, beside the floor (the
untrained model finetuned alike) and chance (one in the world's places).

    python research/reached_over_minutes.py results/small_world/people240/rope \
        results/small_world/people240/rope_seed1 --plot reached.png

Each argument is a pretraining's folder as results/small_world/more_people.sh publishes it:
its pretrain.metrics.csv (run.py's, whose seconds column times the checkpoints) and the
grid of its checkpoints finetuned, FOLDER/--grid/grid.json with each run's held-out
predictions beside it; the world's heldout.tsv and world.json are in the folder above.
A run of the grid's untrained model (research/untrained.py's VARIANT.untrained) is the
floor. It prints a row per checkpoint and finetuning seed; --plot (matplotlib) draws them,
a line style per world.
"""

import import_paths  # noqa: F401 (first: src/ and tools/ on sys.path)

import argparse
import csv
import json
import re
import sys
from pathlib import Path

import grid
import plot
import utils
from machinery import checks, files


def minutes_at_epochs(path):
    """{epoch: minutes of pretraining at its end} of a run.py metrics CSV."""
    try:
        with open(path, encoding='utf-8') as f:
            return {int(row['epoch']): float(row['seconds']) / 60 for row in csv.DictReader(f)}
    except OSError as e:
        raise files.UserError(f"{path}: cannot read: {e.strerror}")
    except (KeyError, ValueError, TypeError):
        raise files.UserError(f"{path}: not a metrics CSV of run.py (epoch and seconds columns)")


def checkpoint_predictions(folder, grid_name):
    """[(epoch or None for the floor, finetuning seed, its held-out predictions)] of one
    pretraining's folder: each run of the grid of its checkpoints finetuned."""
    folder = Path(folder)
    record = grid.records.read_record(str(folder / grid_name / 'grid.json'))
    if not record:
        raise files.UserError(f"{folder / grid_name / 'grid.json'}: no such grid record")
    runs = []
    for entry in record.values():
        made = entry['made_with']
        prefix = grid.output_prefix(
            str(folder / grid_name), made['model'], made['method'], made['seed']
        )
        predictions_path = Path(prefix + '.dev.predictions')
        try:
            predictions = predictions_path.read_text(encoding='utf-8').splitlines()
        except OSError as e:
            raise files.UserError(f"{predictions_path}: cannot read: {e.strerror}")
        found = re.search(r'\.epoch(\d+)$', made['model'])
        epoch = int(found[1]) if found else None  # VARIANT.untrained: the floor
        runs.append((epoch, made['seed'], predictions))
    return runs


def reached(folder, grid_name):
    """[(epoch or None for the floor, finetuning seed, right, total, minutes)] of one
    pretraining's folder, its grid's runs in the order of their epochs and seeds."""
    folder = Path(folder)
    world = folder.parent
    minutes = minutes_at_epochs(folder / 'pretrain.metrics.csv')
    rows = []
    for epoch, seed, predictions in checkpoint_predictions(folder, grid_name):
        total, right = utils.evaluate_places(str(world / 'heldout.tsv'), predictions)
        if epoch is not None and epoch not in minutes:
            raise files.UserError(f"{folder}: its metrics CSV has no epoch {epoch}")
        at = minutes[epoch] if epoch is not None else 0.0
        rows.append((epoch, seed, int(right), int(total), at))
    return sorted(rows, key=lambda row: (row[0] or 0, row[1]))


def one_world(folders):
    """The world (the folder above) of pretrainings' folders that must share one."""
    worlds = {Path(folder).parent for folder in folders}
    if len(worlds) != 1:
        raise files.UserError(f"pretrainings of {len(worlds)} worlds: give one world's")
    (world,) = worlds
    return world


def places_of(world):
    """The number of birthplaces of a world (its world.json's knobs): chance is one in it."""
    try:
        return json.loads((Path(world) / 'world.json').read_text(encoding='utf-8'))['knobs'][
            'places'
        ]
    except (OSError, ValueError, KeyError) as e:
        raise files.UserError(f"{world}/world.json: cannot read its knobs ({e})")


def label(folder):
    """WORLD/PRETRAINING of a folder: people240/rope_seed1."""
    folder = Path(folder)
    return f"{folder.parent.name}/{folder.name}"


def plot_reached(runs, chance, out):
    plt = plot.pyplot('reached_over_minutes.py --plot')
    fig, ax = plt.subplots(figsize=(8, 5))
    floor = [
        100 * right / total for rows in runs.values() for e, _, right, total, _ in rows if e is None
    ]
    if floor:
        ax.axhspan(
            min(floor), max(floor), color='gray', alpha=0.25, label='floor: untrained, finetuned'
        )
    ax.axhline(100 * chance, color='gray', linestyle=':', label='chance')
    styles = {}  # a world's line style; within a world, each pretraining a colour of its own
    drawn = {}
    for folder, rows in runs.items():
        world = Path(folder).parent
        style = styles.setdefault(world, ['-', '--', '-.', ':'][len(styles) % 4])
        colour = f"C{drawn.setdefault(world, 0) % 10}"
        drawn[world] += 1
        by_epoch = {}  # epoch: (minutes, [% right of each finetuning seed])
        for epoch, _, right, total, at in rows:
            if epoch is not None:
                by_epoch.setdefault(epoch, (at, []))[1].append(100 * right / total)
        points = [by_epoch[epoch] for epoch in sorted(by_epoch)]
        means = [sum(seeds) / len(seeds) for _, seeds in points]
        (line,) = ax.plot([at for at, _ in points], means, marker='o', markersize=4,
                          linestyle=style, color=colour, label=label(folder))  # fmt: skip
        for at, seeds in points:  # each finetuning seed, where there are several
            if len(seeds) > 1:
                ax.scatter([at] * len(seeds), seeds, color=line.get_color(), s=8)
    finish_plot(fig, ax, 'pretraining minutes', 'held-out people right after finetuning (%)', out)


def finish_plot(fig, ax, xlabel, ylabel, out):
    """A figure of held-out shares (0-100%) labelled, with its legend, written to out."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_ylim(0, 100)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    print(f"wrote {out}")


def pretraining_arguments(description, folders_help):
    """The parser of a tool that reads pretrainings' folders: the folders, --grid, --plot."""
    argp = argparse.ArgumentParser(description=description)
    argp.add_argument('folders', nargs='+', help=folders_help)
    argp.add_argument(
        '--grid', default='180_30_epochs_lr_6e-4',
        help="the folder of the checkpoints' grid in each (default 180_30_epochs_lr_6e-4)",
    )  # fmt: skip
    argp.add_argument('--plot', help="draw them here (needs matplotlib)")
    return argp


def main(argv=None):
    argp = pretraining_arguments(
        __doc__.split('\n\n')[0], "pretrainings' folders (more_people.sh's)"
    )
    args = argp.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        checks.check_reports(args, 'plot')
        runs = {folder: reached(folder, args.grid) for folder in args.folders}
        worlds = {Path(folder).parent for folder in args.folders}
        chance = 1 / max(places_of(world) for world in worlds)
        print(f"{'pretraining':<28} {'epoch':>5} {'minutes':>7} {'seed':>4}  held-out right")
        for folder, rows in runs.items():
            for epoch, seed, right, total, at in rows:
                shown = 'floor' if epoch is None else epoch
                print(f"{label(folder):<28} {shown:>5} {at:>7.1f} {seed:>4}  {right}/{total}")
        print(f"chance: {chance:.1%}")
        if args.plot:
            plot_reached(runs, chance, args.plot)
    except files.UserError as e:
        sys.exit(files.report(e))


if __name__ == '__main__':
    main()
