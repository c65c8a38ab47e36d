"""Held-out people reached, against the documents pretraining had about each: in a small
world whose people have differing numbers of documents (small_world.py --documents A-B),
the held-out people a checkpoint answers after finetuning, in bands of documents per
person, one line per pretraining and their mean, beside the floor (the untrained model
finetuned alike) and chance. The exposure curve of Kandpal et al. (2023), in a world where
every document is known.

    python research/reached_by_documents.py results/small_world/people240_docs4-28/rope* \
        --epoch 40 --plot by_documents.png

Each argument is a pretraining's folder of one world, as results/small_world/more_people.sh
publishes it (reached_over_minutes.py reads the same): the grid of its checkpoints
finetuned, FOLDER/--grid/grid.json with each run's held-out predictions beside it; the
world's world.json (each person's documents) and heldout.tsv are in the folder above.
Each pretraining counts with its checkpoint of --epoch (default: the last one every
pretraining has) finetuned with --seed; the floor is every run of the grids' untrained
model. --bands N splits the world's range of documents per person (its --documents A-B)
into N bands, as equal in width as whole numbers allow. It prints a row per band;
--plot (matplotlib) draws them.
"""

import import_paths  # noqa: F401 (first: src/ and tools/ on sys.path)

import json
import statistics
import sys
from pathlib import Path

import analyze
import grid
import plot
import reached_over_minutes
from machinery import checks, files


def read_world(world):
    """(documents per person {name: n}, the knobs' (A, B) range, chance) of a world.json."""
    path = Path(world) / 'world.json'
    try:
        record = json.loads(path.read_text(encoding='utf-8'))
        documents = {person['name']: int(person['documents']) for person in record['people']}
        low, high = record['knobs']['documents']
        return documents, (int(low), int(high)), float(record['chance'])
    except OSError as e:
        raise files.UserError(f"{path}: cannot read: {e.strerror}")
    except (ValueError, KeyError, TypeError):
        raise files.UserError(f"{path}: not a world of small_world.py (people, knobs, chance)")


def bands_of(low, high, count):
    """[(first, last)] of count bands covering low..high, their widths differing by one at
    most, the wider ones last: 4..28 in 4 is (4, 9), (10, 15), (16, 21), (22, 28)."""
    values = high - low + 1
    if not 1 <= count <= values:
        raise files.UserError(f"--bands {count}: from 1 to {values} ({low}-{high} documents)")
    edges = [low + (values * i) // count for i in range(count + 1)]
    return [(edges[i], edges[i + 1] - 1) for i in range(count)]


def band_name(band):
    """'4-9', or '16' for a band of one number."""
    first, last = band
    return f"{first}-{last}" if first != last else str(first)


def right_by_band(predictions, heldout, documents, bands, path):
    """[(right, people)] in each band of one run's predictions of the held-out people."""
    if len(predictions) != len(heldout):
        raise files.UserError(
            f"{path}: {len(predictions)} predictions for {len(heldout)} held-out people"
        )
    counts = [[0, 0] for _ in bands]
    for (_, person, place), predicted in zip(heldout, predictions):
        if person not in documents:
            raise files.UserError(f"{path}: {person} is not a person of the world")
        band = next(i for i, (a, b) in enumerate(bands) if a <= documents[person] <= b)
        counts[band][0] += predicted == place.strip()
        counts[band][1] += 1
    return [tuple(c) for c in counts]


def reached_by_band(folders, grid_name, epoch, seed, bands, documents):
    """({folder: [(right, people)] by band} at the checkpoint of epoch and finetuning seed,
    [[(right, people)] by band] of every floor run, the epoch) of one world's pretrainings,
    documents its read_world's. epoch None: the last epoch every pretraining's grid has."""
    world = reached_over_minutes.one_world(folders)
    heldout = analyze.read_questions(world / 'heldout.tsv')
    runs = {f: reached_over_minutes.checkpoint_predictions(f, grid_name) for f in folders}
    if epoch is None:
        have = [{e for e, s, _ in rows if e is not None and s == seed} for rows in runs.values()]
        common = set.intersection(*have)
        if not common:
            raise files.UserError(f"no epoch that every pretraining's grid has with seed {seed}")
        epoch = max(common)
    reached, floor = {}, []
    for folder, rows in runs.items():
        where = Path(folder) / grid_name
        for e, s, predictions in rows:
            if e is None:
                floor.append(right_by_band(predictions, heldout, documents, bands, where))
            elif (e, s) == (epoch, seed):
                reached[folder] = right_by_band(predictions, heldout, documents, bands, where)
        if folder not in reached:
            raise files.UserError(f"{where}: no checkpoint of epoch {epoch} with seed {seed}")
    for (first, last), (_, people) in zip(bands, next(iter(reached.values()))):
        if not people:
            raise files.UserError(
                f"--bands {len(bands)}: no held-out person has {band_name((first, last))} "
                f"documents; ask for fewer bands"
            )
    return reached, floor, epoch


def shares(counts):
    """The share right (%) of each (right, people)."""
    return [100 * right / people for right, people in counts]


def plot_by_band(reached, floor, bands, chance, epoch, out):
    plt = plot.pyplot('reached_by_documents.py --plot')
    fig, ax = plt.subplots(figsize=(7, 4.5))
    x = [(a + b) / 2 for a, b in bands]
    if floor:
        per_band = list(zip(*(shares(run) for run in floor)))
        low, high = [min(band) for band in per_band], [max(band) for band in per_band]
        ax.fill_between(x, low, high, color='gray', alpha=0.25, label='floor: untrained, finetuned')
    ax.axhline(100 * chance, color='gray', linestyle=':', label='chance')
    for i, (folder, counts) in enumerate(reached.items()):
        ax.plot(x, shares(counts), marker='o', markersize=3, linewidth=1, alpha=0.6,
                color=f"C{i % 10}", label=reached_over_minutes.label(folder))  # fmt: skip
    mean = [statistics.mean(band) for band in zip(*(shares(c) for c in reached.values()))]
    ax.plot(x, mean, color='black', linewidth=2.5, marker='o', label='mean of the pretrainings')
    ax.set_xticks(x, [band_name(band) for band in bands])
    reached_over_minutes.finish_plot(
        fig, ax, 'documents per held-out person in the pretraining corpus',
        f'held-out people right after finetuning (%), epoch {epoch}', out,
    )  # fmt: skip


def main(argv=None):
    argp = reached_over_minutes.pretraining_arguments(
        __doc__.split('\n\n')[0], "one world's pretrainings (more_people.sh's)"
    )
    argp.add_argument('--epoch', type=int, help="the checkpoint (default: the last of all)")
    argp.add_argument('--seed', type=int, default=0, help="the finetuning seed (default 0)")
    argp.add_argument('--bands', type=int, default=4, help="bands of documents (default 4)")
    args = argp.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        checks.check_reports(args, 'plot')
        world = Path(args.folders[0]).parent
        documents, (low, high), chance = read_world(world)
        bands = bands_of(low, high, args.bands)
        reached, floor, epoch = reached_by_band(
            args.folders, args.grid, args.epoch, args.seed, bands, documents
        )
        print(f"{world.name}: the held-out people right at epoch {epoch}, finetuning seed "
              f"{args.seed}, by documents per person")  # fmt: skip
        for i, (a, b) in enumerate(bands):
            people = next(iter(reached.values()))[i][1]
            right = ', '.join(str(counts[i][0]) for counts in reached.values())
            mean = grid.mean_sd([shares(counts)[i] for counts in reached.values()], '{:.0f}')
            floors = ', '.join(str(run[i][0]) for run in floor) or '-'
            print(f"{band_name((a, b)):>5} documents, {people:>3} people: {right} right ({mean}%); "
                  f"floor {floors}")  # fmt: skip
        print(f"pretrainings: {', '.join(map(reached_over_minutes.label, reached))}")
        print(f"chance: {chance:.1%}")
        if args.plot:
            plot_by_band(reached, floor, bands, chance, epoch, args.plot)
    except files.UserError as e:
        sys.exit(files.report(e))


if __name__ == '__main__':
    main()
