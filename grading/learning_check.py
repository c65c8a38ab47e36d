"""Does my pipeline train as a correct one does? A few minutes of the assignment's own
commands, on a slice of the data, on the CPU, compared with what a correct pipeline does
there.

    python grading/learning_check.py              # from your starter's folder, once the
                                                  # parts are written
    python grading/learning_check.py ../a5 --seed 1

A full pretraining takes hours on a laptop, and one epoch of it answers no question,
right or wrong, so the accuracy floors cannot tell a working pipeline from a broken one
until then. Here, after the grader's checks of the code that training runs (seconds),
your run.py pretrains your edition's second variant on the wiki.txt lines of PEOPLE
people, finetunes it on their birth-place questions and evaluates it on the same
questions, with --max_epochs and --batch_size made small (and finetuning's --finetune_lr
raised). A correct pipeline (this repository's solution and answers written from the
handouts, seeds 0-2) ends its pretraining with a loss inside a band and then recalls at
least a floor of the questions it was finetuned on; each stage prints what it did, what
came, what a correct pipeline gets, and, where they differ, what to check.

What it shows is that the pipeline trains as a correct one does, not that pretraining
helped: a finetuning that ignores the pretrained params recalled as many (finetuning
learns its own questions by heart), and no run of minutes has shown knowledge reaching
questions the finetuning never saw. That test is the full run, the handout's commands: a
pretraining takes 2h50m to 3h40m on a 2-core AMD EPYC with bf16 (up to about 8 hours on
slower CPUs), 131 s on an H200.
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import marking
from editions import DATA_FILES, EDITIONS, FETCH_DATA
from suite import VARIANT_PARTS
from uploads import guess_edition

PEOPLE = 64
PLACE_WITHIN = 96  # characters: the place is in what span corruption keeps of the line
SETTINGS = {
    'pretrain': ['--max_epochs', '120', '--batch_size', '32'],
    'finetune': ['--max_epochs', '120', '--batch_size', '16', '--finetune_lr', '3e-3'],
}
# What a correct pipeline gets, per variant, measured with this repository's solution and
# with answers written from the handouts (tests/test_textbook.py), seeds 0-2 each, on a
# 2-core AMD EPYC with bf16 (docs/grading.md): the pretraining's mean loss over its last
# LATE steps (synthesizer 2.13-2.34, rope 2.13-2.41, perceiver 2.19-2.50), the band those
# runs' range widened by about 0.3 each side; and the questions recalled with SETTINGS'
# finetuning (synthesizer 62 of 64 every time, rope 28-59, perceiver 7-47), the floor about
# half the fewest and above the 3 that answering every question with the commonest place
# gets.
LATE = 30
CORRECT = {
    'synthesizer': dict(loss=(1.85, 2.65), recall=31),
    'rope': dict(loss=(1.85, 2.70), recall=14),
    'perceiver': dict(loss=(1.85, 2.80), recall=4),
}


def data_slice(data, people=PEOPLE):
    """(corpus text, questions tsv text): the wiki.txt lines of the first `people` people of
    birth_places_train.tsv whose line starts with their name and names their birth place
    within PLACE_WITHIN characters, and their questions; plus, where the questions use a
    character those lines lack ('?', say), the first wiki.txt line that has it, so that
    the vocabulary covers them."""
    lines = (data / 'wiki.txt').read_text(encoding='utf-8').split('\n')
    first = {}
    for line in lines:
        first.setdefault(line.split('.')[0], line)
    chosen = []
    for row in (data / 'birth_places_train.tsv').read_text(encoding='utf-8').splitlines():
        question, place = row.split('\t')
        name = question.removeprefix('Where was ').removesuffix(' born?')
        line = first.get(name)
        if line is not None and place in line[:PLACE_WITHIN]:
            chosen.append((line, row))
        if len(chosen) == people:
            break
    corpus = [line for line, _ in chosen]
    rows = [row for _, row in chosen]
    missing = set(''.join(rows)) - set(''.join(corpus)) - {'\t'}
    for char in sorted(missing):
        corpus.append(next(line for line in lines if char in line))
    return '\n'.join(corpus) + '\n', '\n'.join(rows) + '\n'


def last_error(output, folder):
    """The line that says why a command stopped: our one-line errors ('error: ...'), else a
    traceback's last line with the deepest frame in the submission's own files."""
    lines = [line.split('\r')[-1] for line in output.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith('error: ')]
    if errors:
        return errors[-1].removeprefix('error: ')
    frames = re.findall(r'File "([^"]+)", line (\d+)', output)
    own = [(f, n) for f, n in frames if Path(f).resolve().is_relative_to(folder.resolve())]
    where = f" ({os.path.relpath(own[-1][0], folder)}:{own[-1][1]})" if own else ''
    return (lines[-1] if lines else 'no output') + where


def crash_line(stage, output, folder, variant):
    """What stopped a stage: the error's line, and for a size mismatch what of the
    variant's to check."""
    error = last_error(output, folder)
    sizes = 'must match the size' in error or 'shape' in error
    return f"{CRASHED[stage]}: {error}" + (sizes_hint(variant) if sizes else '')


def run_phase(folder, argv, work):
    """Your run.py with these arguments, on the CPU, from `folder`: (status, output, seconds)."""
    command = [sys.executable, str(folder / 'src' / 'run.py'), *argv, '--device', 'cpu']
    start = time.perf_counter()
    done = subprocess.run(command, cwd=folder, capture_output=True, text=True)
    (work / f'{argv[0]}.log').write_text(done.stdout + done.stderr, encoding='utf-8')
    return done.returncode, done.stdout + done.stderr, time.perf_counter() - start


def late_loss(metrics_csv, late=LATE):
    rows = [line.split(',') for line in Path(metrics_csv).read_text().splitlines()[1:]]
    losses = [float(row[2]) for row in rows[-late:]]
    return sum(losses) / len(losses)


def recalled(predictions, questions):
    """How many predictions are the questions' places, as the assignment counts them."""
    gold = [row.split('\t')[1] for row in questions.splitlines()]
    said = predictions.splitlines()
    return sum(p.strip() == g for p, g in zip(said, gold)), len(gold)


# What to check when a stage differs from a correct pipeline's, in the handout's parts.
TOO_LOW = (
    "a loss this low means the model sees what it is asked to predict: check that "
    "attention masks every position after the current one (the causal mask, cut to T), "
    "and that y is x shifted one character left, not right (part e: x = string[:-1], "
    "y = string[1:])"
)
TOO_HIGH = (
    "a loss this high means the examples are harder than span corruption's, or the model "
    "learns less: check part e (truncate to a random length from 4 to int(block_size*7/8); "
    "a masked span a quarter of that length on average; prefix MASK suffix MASK masked, "
    "then PAD) and the attention you wrote (part g: its scaling, its slicing to the T "
    "positions given)"
)
LOW_RECALL = (
    "pretraining looks right, so check finetuning and the model: part c/f's finetune "
    "(it loads --reading_params_path and trains on the NameDataset of "
    "--finetune_corpus_path) and new_model (part c)"
)


def sizes_hint(variant):
    """What to check for a size that does not match, in the variant's terms."""
    positions = VARIANT_PARTS[variant]['positions']
    return (
        f"; a size that does not match: check that what has block_size positions ({positions}) "
        "is cut to the T positions of the input, which training often gives fewer than "
        "block_size (part g)"
    )


TRAINS = (
    "Your pipeline trains as a correct one does. Whether pretraining puts knowledge within "
    "reach of questions the finetuning never saw, only the full run tells (the handout's "
    "commands; a pretraining takes about 3 hours on a 2-core CPU, up to about 8 on slower "
    "ones, about 2 minutes on an H200)."
)
DOES_NOT_TRAIN = "Your pipeline does not train as a correct one does: see above."
CRASHED = {
    'pretrain': "pretraining (part f's pretrain, your span corruption in part e, your model "
    "in parts c and g) stopped",
    'finetune': "finetuning (part c/f's finetune) stopped",
    'evaluate': "evaluation stopped",
}


def code_checks(folder, edition, data):
    """The grader's checks of your code that training depends on, a few seconds: span
    corruption (part e), the phases' Trainer settings and the model (parts c, f, g), that
    it reads no later position and trains and decodes as its forward computes (not the
    London baseline's). Returns the report's line, and the failed tests' lines."""
    chosen = [
        name
        for name, t in marking.tests_for(edition, False)
        if t.probes and 'london' not in t.probes
    ]
    rows = marking.grade(folder, edition, data, only=chosen)
    failed = [f"   {name}: {why}" for name, score, points, why in rows if score < points]
    line = f"0. the grader's {len(rows)} checks of the code training runs"
    return line + (" -- not so:" if failed else " -- ok"), failed


def check(folder, edition, seed, work, settings=SETTINGS, people=PEOPLE, data=None):
    """Runs the stages on a slice of the data in `work` (from pretraining on; the caller
    runs code_checks first); returns the report's lines and whether the pipeline trains
    as a correct one does."""
    data = Path(data or folder / 'data')
    variant = EDITIONS[edition]['variant']
    corpus, questions = data_slice(data, people)
    (work / 'wiki.txt').write_text(corpus, encoding='utf-8')
    (work / 'questions.tsv').write_text(questions, encoding='utf-8')
    corpus_path, questions_path = str(work / 'wiki.txt'), str(work / 'questions.tsv')
    pretrained, finetuned = work / f'{variant}.pretrain.params', work / f'{variant}.finetune.params'
    common = [variant, corpus_path, '--seed', str(seed), *EDITIONS[edition]['flags']]
    correct = CORRECT[variant]
    report = []

    status, output, seconds = run_phase(
        folder, ['pretrain', *common, '--writing_params_path', str(pretrained),
                 *settings['pretrain']], work)  # fmt: skip
    if status:
        return report + ["1. " + crash_line('pretrain', output, folder, variant)], False
    loss = late_loss(f'{pretrained}.metrics.csv')
    low, high = correct['loss']
    line = (
        f"1. pretrain ({' '.join(settings['pretrain'])}) in {seconds:.0f} s: mean loss of the "
        f"last {LATE} steps {loss:.3f}; a correct pipeline's {low:.2f} to {high:.2f}"
    )
    if not low <= loss <= high:
        return report + [line + " -- not so", '   ' + (TOO_LOW if loss < low else TOO_HIGH)], False
    report.append(line + " -- ok")

    status, output, seconds = run_phase(
        folder, ['finetune', *common, '--reading_params_path', str(pretrained),
                 '--writing_params_path', str(finetuned), '--finetune_corpus_path',
                 questions_path, *settings['finetune']], work)  # fmt: skip
    if status:
        return report + ["2. " + crash_line('finetune', output, folder, variant)], False
    predictions = work / 'questions.predictions'
    status, output, more = run_phase(
        folder, ['evaluate', *common, '--reading_params_path', str(finetuned),
                 '--eval_corpus_path', questions_path, '--outputs_path', str(predictions)],
        work)  # fmt: skip
    if status:
        return report + ["2. " + crash_line('evaluate', output, folder, variant)], False
    right, total = recalled(predictions.read_text(encoding='utf-8'), questions)
    line = (
        f"2. finetune ({' '.join(settings['finetune'])}) and evaluate on the same {total} "
        f"questions in {seconds + more:.0f} s: {right} right; a correct pipeline at least "
        f"{correct['recall']}"
    )
    if right < correct['recall']:
        return report + [line + " -- not so", '   ' + LOW_RECALL], False
    return report + [line + " -- ok"], True


def parse_args(argv):
    argp = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    argp.add_argument(
        'folder', nargs='?', default='.', help="your starter's folder (default: here)"
    )
    argp.add_argument('--seed', type=int, default=0, help="run.py's --seed (default 0)")
    argp.add_argument(
        '--data', help="the folder of the four data files (default: the starter's data/)"
    )
    argp.add_argument('--keep', help="keep the runs' files and logs in this folder")
    argp.add_argument(
        '--edition', choices=sorted(EDITIONS), help="default: your starter's, told from its files"
    )
    argp.add_argument(
        '--skip_code_checks',
        action='store_true',
        help="leave out step 0, the grader's checks of the code (grade.py's table has them)",
    )
    return argp.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    folder = Path(args.folder).resolve()
    if not (folder / 'src' / 'run.py').is_file():
        sys.exit(f"error: {folder}: no src/run.py here (give your starter's folder)")
    data = Path(args.data) if args.data else folder / 'data'
    for name in DATA_FILES:
        if not (data / name).is_file():
            sys.exit(f"error: {data / name}: missing ({FETCH_DATA})")
    edition = args.edition or guess_edition(folder, folder)
    variant = EDITIONS[edition]['variant']
    print(
        f"Learning check: the {variant} model of your {edition} starter, seed {args.seed}, on "
        f"the wiki.txt lines of {PEOPLE} people and their questions, on the CPU (a few minutes)"
    )
    if not args.skip_code_checks:
        line, failed = code_checks(folder, edition, data)
        print('\n'.join([line, *failed]), flush=True)
        if failed:
            print("Fix these first: the pipeline trains through this code.")
            return 1
    with tempfile.TemporaryDirectory() as temporary:
        work = Path(args.keep or temporary)
        work.mkdir(parents=True, exist_ok=True)
        report, learns = check(folder, edition, args.seed, work, data=data)
    print('\n'.join(report))
    print(TRAINS if learns else DOES_NOT_TRAIN)
    return 0 if learns else 1


if __name__ == '__main__':
    sys.exit(main())
