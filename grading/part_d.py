"""The tests of part (d): the London baseline, and the vanilla model's predictions
without pretraining."""

from editions import ACCURACY_FILE
from suite import Fail, check_accuracy, has_number, printed_accuracy, test


@test(
    "(d) London baseline: london_baseline.py's accuracy",
    2,
    probes=['london'],
    hint=lambda edition: (
        "check london_baseline.py (part d): it predicts London for every question of "
        "birth_dev.tsv and prints the accuracy utils.evaluate_places gives"
        + (f" and writes it to {ACCURACY_FILE}" if edition['london_file'] else '')
    ),
)
def london_printed(g):
    if not any(
        (g.submission / p).is_file() for p in ('london_baseline.py', 'src/london_baseline.py')
    ):
        raise Fail("london_baseline.py is missing")
    accuracy = g.london_accuracy()
    written = g.probe('london')['written']
    if g.edition['london_file']:
        if written is None:
            raise Fail(f"london_baseline.py wrote no {ACCURACY_FILE}")
        if not has_number(written, [accuracy]):
            raise Fail(f"{ACCURACY_FILE} holds {written.strip()[:40]!r}, not {accuracy:g}")
    elif not printed_accuracy(g.log('london'), accuracy):
        raise Fail(f"london_baseline.py did not print the accuracy, {accuracy:g}%")


@test(
    f"(d) {ACCURACY_FILE} holds the London baseline's accuracy",
    1,
    editions=('2024', '2025'),
    hint=(
        "python london_baseline.py writes it (part d), and collect_submission.sh puts it in the zip"
    ),
)
def london_file(g):
    beside = f"src/{ACCURACY_FILE}"  # where london_baseline.py run from src/ leaves it
    found = [name for name in (ACCURACY_FILE, beside) if (g.submission / name).is_file()]
    if not found:
        raise Fail(f"{ACCURACY_FILE} is missing (neither beside src/ nor in it)")
    text = g.read(found[0])
    if not has_number(text, [g.london_accuracy()]):
        raise Fail(f"it holds {text.strip()[:40]!r}, not {g.london_accuracy():g}")


@test("(d) vanilla without pretraining: dev predictions, at least 1 right", 2)
def nopretrain_dev(g):
    check_accuracy(g, 'vanilla.nopretrain.dev.predictions', 'dev', minimum_right=1)


@test("(d) vanilla without pretraining: test predictions, one per question", 1)
def nopretrain_test_lines(g):
    g.predictions('vanilla.nopretrain.test.predictions', 'test')


@test("(d) vanilla without pretraining: test predictions, at least 1 right", 4, answers=True)
def nopretrain_test(g):
    check_accuracy(g, 'vanilla.nopretrain.test.predictions', 'test', minimum_right=1)
