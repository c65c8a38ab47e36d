"""Every accuracy we publish, recomputed from the committed prediction files: README's
reference table from results/*.dev.predictions, and each grid (results/*/grid.json, and a
small world's, under results/small_world/WORLD/): its grid.md is the table of its
record, and every run whose dev predictions are committed beside it scores what the
record says; results/README.md's small-world tables from their grids, predictions,
cloze reports and pretraining logs."""

import argparse
import csv
import functools
import itertools
import json
import re
from pathlib import Path

import pytest

import grid
import reached_by_documents
import reached_by_variant
import small_world
import utils
from conftest import NO_DATA, ROOT
from machinery.finetune_methods import LEARNING_RATES

DEV = ROOT / 'data' / 'birth_dev.tsv'
NEEDS_DATA = pytest.mark.skipif(not DEV.exists(), reason=NO_DATA)
# README's reference rows and their predictions in results/ (None: London for everyone)
REFERENCE_ROWS = {
    'vanilla, no pretraining (part d)': 'vanilla.nopretrain',
    'vanilla, pretrain + finetune (part f)': 'vanilla.pretrain',
    'synthesizer, pretrain + finetune (part g)': 'synthesizer.pretrain',
    'London baseline': None,
    'RoPE, pretrain + finetune (2024)': 'rope.pretrain',
    'perceiver, pretrain + finetune (2023, m=64)': 'perceiver.pretrain',
}
SMALL_WORLD = ROOT / 'results' / 'small_world'
GRIDS = sorted(ROOT.glob('results/*/grid.json')) + sorted(SMALL_WORLD.glob('*/**/grid.json'))
GRID_IDS = [str(p.parent.relative_to(ROOT / 'results')) for p in GRIDS]


def dev_correct(predictions, questions=DEV):
    total, correct = utils.evaluate_places(str(questions), predictions)
    return int(correct), int(total)


def reference_table():
    """{row name: the 'ours' cell} of README's reference table."""
    text = (ROOT / 'README.md').read_text(encoding='utf-8')
    section = text.split('## Reference results')[1].split('\n## ')[0]
    rows = [line.split('|')[1:-1] for line in section.splitlines() if line.startswith('| ')]
    return {cells[0].strip(): cells[1].strip() for cells in rows[1:]}  # past the header


@NEEDS_DATA
def test_readmes_reference_results_are_their_predictions():
    table = reference_table()
    assert set(table) == set(REFERENCE_ROWS), "a row without its predictions here, or gone"
    for row, name in REFERENCE_ROWS.items():
        if name is None:
            predictions = ['London'] * len(DEV.read_text(encoding='utf-8').splitlines())
        else:
            path = ROOT / 'results' / f'{name}.dev.predictions'
            predictions = path.read_text(encoding='utf-8').splitlines()
        correct, total = dev_correct(predictions)
        assert table[row] == f"{100 * correct / total:.1f}% ({correct}/{total})", row


@pytest.mark.parametrize('path', GRIDS, ids=GRID_IDS)
def test_a_grids_table_is_its_record(path):
    record = grid.records.read_record(str(path))
    assert (path.parent / 'grid.md').read_text(encoding='utf-8') == grid.table(record)


@pytest.mark.parametrize('path', GRIDS, ids=GRID_IDS)
def test_each_committed_grid_run_scores_what_its_record_says(path):
    """results/grid keeps no predictions (its runs' params stayed on the machine that ran
    them); a grid that keeps any, as results/seeds does, keeps them for every run. A grid
    of a small world was evaluated on its world's held-out questions (WORLD/heldout.tsv),
    the others on data/birth_dev.tsv."""
    if SMALL_WORLD in path.parents:
        questions = next(p / 'heldout.tsv' for p in path.parents if (p / 'heldout.tsv').exists())
    elif DEV.exists():
        questions = DEV
    else:
        pytest.skip(NO_DATA)
    record = grid.records.read_record(str(path))
    runs = [entry for entry in record.values() if entry.get('dev_total')]
    kept = {}
    for entry in runs:
        made = entry['made_with']
        prefix = grid.output_prefix(str(path.parent), made['model'], made['method'], made['seed'])
        kept[prefix] = entry
    files = {str(p).removesuffix('.dev.predictions') for p in path.parent.glob('*.dev.predictions')}
    assert files in (set(), set(kept)), "runs without predictions, or predictions without a run"
    for prefix in files:
        entry = kept[prefix]
        predictions = open(prefix + '.dev.predictions', encoding='utf-8').read().splitlines()
        assert dev_correct(predictions, questions) == (entry['dev_correct'], entry['dev_total']), (
            prefix
        )


def correct_of(predictions_path, questions_path):
    predictions = predictions_path.read_text(encoding='utf-8').splitlines()
    return '/'.join(map(str, dev_correct(predictions, questions_path)))


def everyone(bands, probe):
    """The share right in a cloze probe over all of a report's exposure bands."""
    people = sum(band['people'] for band in bands.values())
    return sum(band['people'] * band[probe] for band in bands.values()) / people


def epochs(entry):
    """The pretraining epochs of a frontier grid's model: 0 for VARIANT.untrained."""
    found = re.search(r'epoch(\d+)$', entry['made_with']['model'])
    return int(found[1]) if found else 0


@functools.cache
def steps_by_epoch(pretraining):
    """{epoch: its rows} of a pretraining's pretrain.metrics.csv, read once per folder."""
    by_epoch = {}
    for row in csv.DictReader(open(pretraining / 'pretrain.metrics.csv', encoding='utf-8')):
        by_epoch.setdefault(int(row['epoch']), []).append(row)
    return by_epoch


@pytest.mark.parametrize(
    'pretraining',
    sorted(p.parent for p in SMALL_WORLD.glob('*/*/pretrain.metrics.csv')),
    ids=lambda p: f"{p.parent.name}/{p.name}",
)
def test_a_published_pretraining_logged_each_step_once(pretraining):
    """Steps 1, 2, 3, ... in order: a resumed run's log holds no step twice (the times and
    losses the tables read are the run's own)."""
    steps = [int(row['step']) for rows in steps_by_epoch(pretraining).values() for row in rows]
    assert steps == list(range(1, len(steps) + 1))


def checkpoint_cells(pretraining, entry):
    """The cells of a finetuned model's pretraining: epochs, steps, the pretraining's time
    and mean loss at that epoch, and the cloze probes of the held-out people before
    finetuning, from the pretraining's folder (pretrain.metrics.csv, MODEL.cloze.json)."""
    model = entry['made_with']['model']  # VARIANT.untrained, VARIANT.pretrain.epochNNN
    epoch = epochs(entry)
    if epoch:
        in_epoch = steps_by_epoch(pretraining)[epoch]
        loss = sum(float(row['loss']) for row in in_epoch) / len(in_epoch)
        last = in_epoch[-1]
        minutes = float(last['seconds']) / 60
        pretrained = f"{epoch} | {last['step']} | {minutes:.1f} min | {loss:.2f}"
        cloze = json.loads((pretraining / f'{model}.cloze.json').read_text())['bands']
    else:  # the floor: the cloze reports' untrained model, initialised as the checkpoints'
        pretrained = '0 | 0 | - | -'
        first = sorted(pretraining.glob('*.cloze.json'))[0]
        cloze = json.loads(first.read_text())['untrained']['bands']
    probes = ' | '.join(f"{100 * everyone(cloze, k):.0f}%" for k in ('document', 'name'))
    return f"{pretraining.name} | {pretrained} | {probes}"  # VARIANT, or VARIANT_HOW (rope_seed1)


def frontier_rows(world):
    """results/README.md's rows for one world's grids (WORLD/VARIANT/grid.json): the
    untrained model (the floor) and each pretraining checkpoint, with the cloze probe of
    the held-out people before finetuning, their answers after it, and the finetuning
    people's recalled."""
    rows = []
    for folder in sorted(p.parent for p in world.glob('*/grid.json')):
        record = grid.records.read_record(str(folder / 'grid.json'))
        for entry in sorted(record.values(), key=epochs):
            prefix = grid.output_prefix(str(folder), entry['made_with']['model'], 'full', 0)
            heldout = correct_of(Path(prefix + '.dev.predictions'), world / 'heldout.tsv')
            recalled = correct_of(Path(prefix + '.recall.predictions'), world / 'finetune.tsv')
            cells = checkpoint_cells(folder, entry)
            rows.append(f"| {world.name} | {cells} | {heldout} | {recalled} |")
    return rows


def heldout_correct(world, folder, entries):
    """The held-out people right ('N/TOTAL') of each of a model's grid runs, seed by seed."""
    right = []
    for entry in sorted(entries, key=lambda entry: entry['made_with']['seed']):
        made = entry['made_with']
        prefix = grid.output_prefix(str(folder), made['model'], made['method'], made['seed'])
        right.append(correct_of(Path(prefix + '.dev.predictions'), world / 'heldout.tsv'))
    return right


def finetuning_rows(world):
    """results/README.md's rows for the other finetunings of a world's last checkpoints
    (WORLD/finetuning/SETTING/grid.json): checkpoint, setting, method, and the held-out
    people right for each finetuning seed."""
    rows = []
    for path in sorted(world.glob('finetuning/*/grid.json')):
        runs = {}  # (model, method): its entries, seed by seed
        for entry in grid.records.read_record(str(path)).values():
            made = entry['made_with']
            runs.setdefault((made['model'], made['method']), []).append(entry)
        for (model, method), entries in runs.items():
            heldout = ', '.join(heldout_correct(world, path.parent, entries))
            rows.append(f"| {world.name} | {model} | {path.parent.name} | {method} | {heldout} |")
    return rows


def finetuning_setting(world, entry):
    """(finetuning people, epochs, learning rate) of a grid run, from its finetuning
    command: all of the world's finetune.tsv, or its first N (finetuneN.tsv)."""
    argv = entry['made_with']['finetune']
    flag = lambda name, default: argv[argv.index(name) + 1] if name in argv else default  # noqa: E731
    first = re.search(r'finetune(\d+)\.tsv$', flag('--finetune_corpus_path', ''))
    everyone = len((world / 'finetune.tsv').read_text(encoding='utf-8').splitlines())
    people = int(first[1]) if first else everyone
    lr = flag('--finetune_lr', LEARNING_RATES[entry['made_with']['method']])  # run.py's default
    return people, int(flag('--max_epochs', 0)), float(lr)


def people_rows(world):
    """results/README.md's rows for a world's checkpoints finetuned on some or all of its
    finetuning people (WORLD/VARIANT/SETTING/grid.json, the pretraining's files in
    WORLD/VARIANT): the pretraining's cells, the finetuning, and the held-out people right
    for each finetuning seed."""
    rows = []
    for path in world.glob('*/*/grid.json'):
        if not (path.parent.parent / 'pretrain.metrics.csv').exists():
            continue  # WORLD/finetuning/SETTING: other finetunings of one checkpoint
        runs = {}  # the model: its entries, seed by seed
        for entry in grid.records.read_record(str(path)).values():
            runs.setdefault(entry['made_with']['model'], []).append(entry)
        for entries in runs.values():
            heldout = heldout_correct(world, path.parent, entries)
            people, max_epochs, lr = finetuning_setting(world, entries[0])
            cells = checkpoint_cells(path.parent.parent, entries[0])
            setting = f"{max_epochs} epochs, lr {lr:g}"
            row = f"| {world.name} | {cells} | {people} | {setting} | {', '.join(heldout)} |"
            order = (path.parent.parent.name, people, max_epochs, epochs(entries[0]))
            rows.append((order, row))
    return [row for _, row in sorted(rows)]


def seed_runs(world, named_as=reached_by_variant.SEED_RUN):
    """{(variant, epoch): [(pretraining seed, 'RIGHT/60', minutes)]} of the pretrainings of
    one recipe that differ only in their seed, their folders named as `named_as` matches
    (VARIANT, then the seed: WORLD/VARIANT for seed 0, WORLD/VARIANT_seedN): the held-out
    people right after finetuning on all of the world's finetuning people at 6e-4 for 30
    epochs (finetuning seed 0), and the pretraining minutes to that epoch."""
    at_epoch = {}
    for folder in sorted(world.iterdir()):
        named = named_as.fullmatch(folder.name)
        path = folder / '180_30_epochs_lr_6e-4' / 'grid.json'
        if not named or not path.exists():
            continue
        for entry in grid.records.read_record(str(path)).values():
            made = entry['made_with']
            if not epochs(entry) or made['seed'] != 0:
                continue  # the floor, or another finetuning seed
            (right,) = heldout_correct(world, path.parent, [entry])
            minutes = float(steps_by_epoch(folder)[epochs(entry)][-1]['seconds']) / 60
            seed = int(named[2] or 0)
            at_epoch.setdefault((named[1], epochs(entry)), []).append((seed, right, minutes))
    return {key: sorted(runs) for key, runs in sorted(at_epoch.items())}


def right_counts(runs):
    return [int(right.split('/')[0]) for _, right, _ in runs]


def seed_rows(world):
    """results/README.md's rows for each recipe and epoch two or more pretraining seeds
    reached (seed_runs): every seed's count, their mean, standard deviation and range, and
    the pretraining minutes."""
    rows = []
    for (variant, epoch), runs in seed_runs(world).items():
        if len(runs) < 2:
            continue
        counts = right_counts(runs)
        minutes = [m for _, _, m in runs]
        cells = [
            world.name, variant, str(epoch), ', '.join(str(seed) for seed, _, _ in runs),
            ', '.join(right for _, right, _ in runs), grid.mean_sd(counts),
            f"{min(counts)}-{max(counts)}", f"{min(minutes):.1f}-{max(minutes):.1f} min",
        ]  # fmt: skip
        rows.append(f"| {' | '.join(cells)} |")
    return rows


def permutation_p(a, b):
    """The exact two-sided permutation test's p of a difference of means: the share of all
    ways to split a + b into groups of their sizes whose means differ at least as much."""
    pooled, n = a + b, len(a)
    observed = abs(sum(a) / n - sum(b) / len(b))
    splits = list(itertools.combinations(range(len(pooled)), n))
    as_far = 0
    for chosen in splits:
        first = [pooled[i] for i in chosen]
        rest = [pooled[i] for i in range(len(pooled)) if i not in chosen]
        as_far += abs(sum(first) / n - sum(rest) / len(rest)) >= observed - 1e-9
    return as_far / len(splits)


def test_the_permutation_p_is_what_its_splits_give():
    """Against cases worked by hand: two groups of two, 2 of the 6 splits as far apart as
    the observed one; groups that cannot be told apart; groups as far apart as can be,
    matched only by their swap."""
    assert permutation_p([1, 2], [3, 4]) == 2 / 6  # {1,2}|{3,4} and {3,4}|{1,2}
    assert permutation_p([1, 4], [2, 3]) == 1.0  # every split differs by 0 or more
    assert permutation_p([0, 0, 0], [9, 9, 9]) == 2 / 20


def comparison_rows():
    """results/README.md's rows comparing the one-biography world with the paraphrased one,
    for each recipe and epoch both reached with two or more pretraining seeds: each world's
    mean ± sd, the paraphrased world's mean less the other's, and permutation_p."""
    one, paraphrased = (seed_runs(SMALL_WORLD / name) for name in ('people240_one', 'people240'))
    return side_by_side(one, paraphrased)


def side_by_side(first, second):
    """A compared row for each (variant, epoch) of two seed_runs both reached with two or
    more pretraining seeds, in first's order."""
    rows = []
    for (variant, epoch), runs in first.items():
        others = second.get((variant, epoch), [])
        if len(runs) >= 2 and len(others) >= 2:
            rows.append(compared(variant, epoch, right_counts(runs), right_counts(others)))
    return rows


def compared(variant, epoch, a, b):
    """A row of two groups of seeds' counts: each group's number: mean ± sd, the second's
    mean less the first's, and permutation_p."""
    cells = [
        variant, str(epoch), f"{len(a)}: {grid.mean_sd(a)}", f"{len(b)}: {grid.mean_sd(b)}",
        f"{sum(b) / len(b) - sum(a) / len(a):+.1f}", f"{permutation_p(a, b):.2f}",
    ]  # fmt: skip
    return f"| {' | '.join(cells)} |"


def published_rows(heading, row):
    """The lines of results/README.md's section under a heading that the regular expression
    row matches from their start: a table's rows, its header left out."""
    text = (ROOT / 'results' / 'README.md').read_text(encoding='utf-8')
    section = text.split(heading)[1].split('\n#')[0]
    return [line for line in section.splitlines() if re.match(row, line)]


def test_the_worlds_comparison_is_its_runs():
    published = published_rows('### One biography against four paraphrases', r'\| rope')
    expected = comparison_rows()
    assert published == expected, "\n".join(expected)


def variant_rows():
    """results/README.md's rows setting each variant's pretraining seeds on people240 beside
    RoPE's, at each epoch both reached with two or more seeds (compared: the variant, then
    RoPE)."""
    runs = seed_runs(SMALL_WORLD / 'people240')
    others = {key: its for key, its in runs.items() if key[0] != 'rope'}
    rope = {(variant, epoch): runs.get(('rope', epoch), []) for variant, epoch in others}
    return side_by_side(others, rope)


def test_the_variants_comparison_is_its_runs():
    published = published_rows('### Four variants', r'\| [a-z]+ \| \d')
    expected = variant_rows()
    assert published == expected, "\n".join(expected)


def documents_rows(world):
    """results/README.md's rows for a world whose people have from A to B documents each
    (small_world.py --documents A-B): at each epoch two or more of its pretraining seeds
    reached (seed_runs), for each of reached_by_documents.py's four bands of documents per
    person, the held-out people in it, the right of each seed's checkpoint finetuned on all
    at 6e-4 for 30 epochs (finetuning seed 0), their mean ± sd and range (%), and the right
    of each floor run (the untrained model finetuned alike, its finetuning seeds)."""
    documents, (low, high), _ = reached_by_documents.read_world(world)
    if low == high:
        return []
    bands = reached_by_documents.bands_of(low, high, 4)
    rows = []
    for (variant, epoch), runs in seed_runs(world).items():
        if len(runs) < 2:
            continue
        folders = [world / (f"{variant}_seed{seed}" if seed else variant) for seed, _, _ in runs]
        reached, floor, _ = reached_by_documents.reached_by_band(
            folders, '180_30_epochs_lr_6e-4', epoch, 0, bands, documents
        )
        for i, band in enumerate(bands):
            people = reached[folders[0]][i][1]
            right = [reached[folder][i][0] for folder in folders]
            shares = [100 * r / people for r in right]
            cells = [
                world.name, variant, str(epoch), reached_by_documents.band_name(band), str(people),
                ', '.join(str(seed) for seed, _, _ in runs), ', '.join(map(str, right)),
                f"{grid.mean_sd(shares, '{:.0f}')}%", f"{min(shares):.0f}-{max(shares):.0f}%",
                ', '.join(str(run[i][0]) for run in floor) or '-',
            ]  # fmt: skip
            rows.append(f"| {' | '.join(cells)} |")
    return rows


@pytest.mark.parametrize(
    'world', sorted(SMALL_WORLD.glob('*/world.json')), ids=lambda p: p.parent.name
)
def test_a_published_world_is_what_its_knobs_make(world):
    """Each world's committed files, made again from the knobs its record holds."""
    knobs = json.loads(world.read_text(encoding='utf-8'))['knobs']
    made = small_world.make_world(argparse.Namespace(outdir=None, **knobs))
    for name in ('world.json', 'finetune.tsv', 'heldout.tsv'):
        assert (world.parent / name).read_text(encoding='utf-8') == made[name], name


ON_EPYC = re.compile(r'([a-z]+)_epyc_seed(\d+)')  # the Xeon's recipe run again on the EPYC


def cpu_rows():
    """results/README.md's rows setting RoPE's pretraining seeds on people240, run on the
    Intel Xeon (WORLD/rope, WORLD/rope_seedN), beside the same commands run on the AMD EPYC
    (WORLD/rope_epyc_seedN), at each epoch both reached with two or more seeds (compared:
    the Xeon's, then the EPYC's)."""
    world = SMALL_WORLD / 'people240'
    return side_by_side(seed_runs(world), seed_runs(world, ON_EPYC))


def machines(folders):
    """The machines the grid records of these pretrainings' finetunings name."""
    named = set()
    for folder in folders:
        record = grid.records.read_record(str(folder / '180_30_epochs_lr_6e-4' / 'grid.json'))
        named |= {entry['machine'].split(',')[0] for entry in record.values()}
    return named


def test_the_cpus_comparison_is_its_runs():
    """The table, and each side's finetunings run on the CPU its column names."""
    published = published_rows('### The same commands on another CPU', r'\| rope')
    expected = cpu_rows()
    assert published == expected, "\n".join(expected)
    world = SMALL_WORLD / 'people240'
    xeon = [world / 'rope'] + sorted(world.glob('rope_seed?'))
    assert machines(xeon) == {'Intel(R) Xeon(R) Processor'}
    assert machines(sorted(world.glob('rope_epyc_seed?'))) == {'AMD EPYC'}


@pytest.mark.parametrize(
    'heading, rows',
    [
        ('## The frontier: one seed', frontier_rows),
        ('## Other finetunings', finetuning_rows),
        ("## Finetuned at the handout's learning rate", people_rows),
        ('## Pretraining seeds', seed_rows),
        ('### Documents per person', documents_rows),
    ],
)
def test_a_small_world_table_is_its_runs(heading, rows):
    published = published_rows(heading, r'\| p')
    worlds = sorted(p for p in SMALL_WORLD.iterdir() if (p / 'heldout.tsv').exists())
    expected = [row for world in worlds for row in rows(world)]
    assert published == expected, "\n".join(expected)
