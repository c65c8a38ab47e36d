"""Held-out people reached, by attention variant: in one small world pretrained by several
variants, each with several seeds, the held-out people each pretraining's checkpoint
answers after finetuning, per variant and epoch every seed's count, their mean ± sd and
range, beside the variant's floor (its untrained model finetuned alike) and chance.

    python research/reached_by_variant.py \
        results/small_world/people240/{vanilla,rope}{,_seed?} --plot by_variant.png

Each argument is a pretraining's folder of one world, as results/small_world/more_people.sh
publishes it (reached_over_minutes.py reads the same): WORLD/VARIANT for pretraining seed 0
and WORLD/VARIANT_seedN for seed N, with the grid of its checkpoints finetuned,
FOLDER/--grid/grid.json, each run's held-out predictions beside it. Each checkpoint counts
with finetuning seed --seed; the floor is every run of a variant's grids' untrained model.
It prints a row per variant and epoch that every pretraining has; --plot (matplotlib)
draws them, a panel per epoch.
"""

import import_paths  # noqa: F401 (first: src/ and tools/ on sys.path)

import re
import sys
from pathlib import Path

import grid
import plot
import reached_over_minutes
from machinery import checks, files

# the name of a pretraining that differs from its variant's seed 0 only in its seed
SEED_RUN = re.compile(r'([a-z]+)(?:_seed(\d+))?')


def variant_and_seed(folder):
    """(variant, pretraining seed) of a folder named VARIANT or VARIANT_seedN."""
    if not Path(folder).is_dir():
        raise files.UserError(f"{folder}: no such folder")
    named = SEED_RUN.fullmatch(Path(folder).name)
    if not named:
        raise files.UserError(f"{folder}: not a pretraining named VARIANT or VARIANT_seedN")
    return named[1], int(named[2] or 0)


def reached_by_variant(folders, grid_name, seed):
    """({variant: {epoch: [(pretraining seed, right)]}} at the epochs every pretraining's grid
    has with finetuning seed `seed`, {variant: [right of each floor run]}, the held-out
    people) of one world's pretrainings, variants in the order of their first folder."""
    reached_over_minutes.one_world(folders)
    runs, floor, people = [], {}, set()
    for folder in folders:
        variant, pretraining_seed = variant_and_seed(folder)
        floor.setdefault(variant, [])
        rights = {}
        for epoch, s, right, total, _ in reached_over_minutes.reached(folder, grid_name):
            people.add(total)
            if epoch is None:
                floor[variant].append(right)
            elif s == seed:
                rights[epoch] = right
        runs.append((variant, pretraining_seed, rights))
    epochs = set.intersection(*(set(rights) for _, _, rights in runs))
    if not epochs:
        raise files.UserError(f"no epoch that every pretraining's grid has with seed {seed}")
    reached = {variant: {epoch: [] for epoch in sorted(epochs)} for variant in floor}
    for variant, pretraining_seed, rights in runs:
        for epoch in epochs:
            reached[variant][epoch].append((pretraining_seed, rights[epoch]))
    for variant, by_epoch in reached.items():
        seeds = [s for s, _ in next(iter(by_epoch.values()))]
        if len(set(seeds)) != len(seeds):
            raise files.UserError(f"{variant}: pretraining seed given twice ({sorted(seeds)})")
        for rows in by_epoch.values():
            rows.sort()
    (total,) = people  # every run answers the world's one heldout.tsv
    return reached, floor, total


def plot_by_variant(reached, floor, total, chance, out):
    plt = plot.pyplot('reached_by_variant.py --plot')
    epochs = list(next(iter(reached.values())))
    fig, axes = plt.subplots(1, len(epochs), figsize=(3.2 * len(epochs) + 1, 4.5), sharey=True)
    axes = axes if len(epochs) > 1 else [axes]
    for ax, epoch in zip(axes, epochs):
        labels = ['floor: untrained, finetuned', 'mean of the pretraining seeds']
        for x, (variant, by_epoch) in enumerate(reached.items()):
            if floor[variant]:
                low, high = (
                    100 * right / total for right in (min(floor[variant]), max(floor[variant]))
                )
                # half a point higher: a floor of one count still shows
                ax.fill_between([x - 0.3, x + 0.3], low, high + 0.5, color='gray', alpha=0.35,
                                label=labels[0])  # fmt: skip
                labels[0] = None  # once a panel
            rights = [100 * right / total for _, right in by_epoch[epoch]]
            spread = [x + 0.3 * ((i + 0.5) / len(rights) - 0.5) for i in range(len(rights))]
            ax.scatter(spread, rights, color=f"C{x % 10}", s=18, zorder=3)
            ax.hlines(sum(rights) / len(rights), x - 0.3, x + 0.3, color='black', linewidth=2.5,
                      zorder=4, label=labels[1])  # fmt: skip
            labels[1] = None
        ax.axhline(100 * chance, color='gray', linestyle=':', label='chance')
        ax.set_xticks(range(len(reached)), list(reached))
        ax.set_title(f"epoch {epoch}")
        ax.set_ylim(-2, 102)  # a count of 0 or all shows whole
        ax.grid(alpha=0.3, axis='y')
    axes[0].set_ylabel('held-out people right after finetuning (%)')
    axes[0].legend(fontsize=8, loc='upper left')
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    print(f"wrote {out}")


def main(argv=None):
    argp = reached_over_minutes.pretraining_arguments(
        __doc__.split('\n\n')[0], "one world's pretrainings (more_people.sh's)"
    )
    argp.add_argument('--seed', type=int, default=0, help="the finetuning seed (default 0)")
    args = argp.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        checks.check_reports(args, 'plot')
        reached, floor, total = reached_by_variant(args.folders, args.grid, args.seed)
        world = Path(args.folders[0]).resolve().parent
        chance = 1 / reached_over_minutes.places_of(world)
        print(f"{world.name}: the held-out people right (of {total}), finetuning seed {args.seed}")
        for variant, by_epoch in reached.items():
            floors = ', '.join(map(str, floor[variant])) or '-'
            for epoch, rows in by_epoch.items():
                rights = [right for _, right in rows]
                seeds = ', '.join(str(s) for s, _ in rows)
                print(f"{variant:>12} epoch {epoch:>3}, seeds {seeds}: "
                      f"{', '.join(map(str, rights))} ({grid.mean_sd(rights)}, "
                      f"{min(rights)}-{max(rights)}); floor {floors}")  # fmt: skip
        print(f"chance: {chance:.1%}")
        if args.plot:
            plot_by_variant(reached, floor, total, chance, args.plot)
    except files.UserError as e:
        sys.exit(files.report(e))


if __name__ == '__main__':
    main()
