"""What the handout editions differ in, and the assignment's data: the editions' settings
and accuracy floors, the files a submission is graded with, and the reading of them (a
--data folder, the test answers) with its one-line errors (UserError).

Imports nothing of ours: every other module of the grader reads these.
"""

from pathlib import Path

# the handout's models' tensor names and shapes, per variant ('vocab': the vocabulary's size)
ARCHITECTURES = Path(__file__).with_name('architectures.json')
DATA_FILES = ('wiki.txt', 'birth_places_train.tsv', 'birth_dev.tsv', 'birth_test_inputs.tsv')
FETCH_DATA = "python tools/get_data.py fetches the course's four files into data/; data/README.md"
ACCURACY_FILE = 'london_baseline_accuracy.txt'

# What differs between the editions: the variant beside vanilla and the flags its commands
# pass, pretraining's schedule (epochs of tokens), the span-corruption padding beyond
# block_size, and the accuracy floors (%), dev from the handouts, test one point lower
# where the handout names none (the public grader's rule).
EDITIONS = {
    '2021': dict(variant='synthesizer', flags=[], schedule=200, extra_pad=0,
                 vanilla_dev=10, vanilla_test=9, variant_dev=5, variant_test=4,
                 london_file=False),
    '2023': dict(variant='perceiver', flags=['--bottleneck_dim', '64'], schedule=200,
                 extra_pad=0, vanilla_dev=10, vanilla_test=9, variant_dev=6, variant_test=5,
                 london_file=False),
    '2024': dict(variant='rope', flags=[], schedule=650, extra_pad=1, vanilla_dev=15,
                 vanilla_test=14, variant_dev=30, variant_test=30, london_file=True),
}  # fmt: skip
EDITIONS['2025'] = EDITIONS['2024']
BLOCK_SIZE = 128
SPAN_BLOCK = 50  # span corruption is drawn with this block size, as the public grader does
SPAN_DRAWS = 4000
SPAN_SEED = 0  # random, numpy and torch are seeded with it before the draws


class UserError(Exception):
    """Bad input: one line, exit status 2."""


def read_lines(path):
    """The lines of a text file, without line ends, the empty one after a final newline
    dropped (as files.read_lines does)."""
    lines = Path(path).read_text(encoding='utf-8', errors='replace').split('\n')
    if lines and lines[-1] == '':
        lines.pop()
    return [line.rstrip('\r') for line in lines]


def check_data(data):
    """Refuses a --data folder that lacks one of the assignment's data files."""
    for name in DATA_FILES:
        if not (data / name).is_file():
            raise UserError(f"--data {data}: {name} is missing ({FETCH_DATA})")


def read_answers(path, data):
    if path is None:
        return None
    if not path.is_file():
        raise UserError(f"--answers {path}: no such file")
    lines = read_lines(path)
    questions = read_lines(data / 'birth_test_inputs.tsv')
    if len(lines) != len(questions):
        raise UserError(
            f"--answers {path}: {len(lines)} lines, but birth_test_inputs.tsv has {len(questions)}"
        )
    for number, line in enumerate(lines, start=1):
        if len(line.split('\t')) != 2:
            raise UserError(f"--answers {path}, line {number}: not 'question<TAB>place'")
    return lines
