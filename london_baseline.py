"""The London baseline: the dev accuracy of predicting "London" as everyone's birth place.

    python london_baseline.py [birth_dev.tsv]

Prints the accuracy line and, as the 2024/25 editions ask, writes the accuracy (0-100)
to london_baseline_accuracy.txt in the current folder.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / 'src'))
import utils  # noqa: E402
from machinery import files  # noqa: E402

ACCURACY_FILE = 'london_baseline_accuracy.txt'


# [part d]
def london_baseline(eval_corpus_path='birth_dev.tsv'):
    """(total, correct) when every prediction is "London".
    Helpers: files.read_lines(path) gives the file's lines, and
    utils.evaluate_places(path, predictions) the (total, correct) of a list of predictions."""
    return utils.evaluate_places(
        eval_corpus_path, ['London'] * len(files.read_lines(eval_corpus_path))
    )


def write_accuracy(total, correct, path=ACCURACY_FILE):
    files.atomic_write(path, lambda f: f.write(f"{correct / total * 100}\n".encode('utf-8')))


if __name__ == '__main__':
    try:
        # a bare name found in data/ here, so that the part's open(path) finds it too
        path = files.find_data_file(sys.argv[1] if len(sys.argv) > 1 else 'birth_dev.tsv')
        total, correct = london_baseline(path)
        if total == 0:
            raise files.UserError(f"{path} has no gold places to compare with")
    except files.UserError as e:
        sys.exit(files.report(e))
    print('Correct: {} out of {}: {}%'.format(correct, total, correct / total * 100))
    write_accuracy(total, correct)
