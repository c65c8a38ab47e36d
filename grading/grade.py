"""The assignment's autograder, run locally: what the course's public grader checked, for
every edition, and what it left out.

    python grading/grade.py SUBMISSION                # a folder with src/, or the zip
    python grading/grade.py SUBMISSION --edition 2024 --json results.json
    python grading/grade.py a.zip b.zip c/ --csv grades.csv     # a class at once

SUBMISSION is a folder holding src/ and the handout's outputs (params and predictions),
or the zip collect_submission.sh makes. The data comes from data/ (--data). Each check
of the submission's code runs in a process of its own (probes.py), in a copy of its
files, with a time limit: an exception, a hang or a crash fails that test with a
one-line reason, and the submission itself is only read. Configs are taken by running
the submission's own run.py commands with training intercepted, never by training.

The code is checked against direct computations of the handout's equations with given
weights, under the starter's names; span corruption by its spec's properties on drawn
examples (seeded; the margins are in part_e.py's span_examples); the results by the
edition's accuracy floors. The test-set floors need the answers (--answers), which we do
not ship.

This file is the command line; the grader's other files, each named for what it holds:

    editions.py      what the editions differ in (variant, flags, floors) and the data files
    uploads.py       the folder holding src/ in an upload (a folder or a zip), its edition
    marking.py       one submission marked: its probes run, then its edition's tests
    suite.py         how a test is written (the test decorator, Fail), the shared checks
    part_c.py ...    the tests, a file per handout part: part_c.py to part_g.py
    references.py    what the tests compare with: the handout's equations, computed
                     directly, and the given weights and inputs
    probe_runner.py  each probe in a process of its own, with a time limit
    probes.py        what runs inside that process, of the submission's code
"""

import argparse
import csv
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import sandbox
from editions import EDITIONS, UserError, check_data, read_answers
from marking import grade
from uploads import find_submission, guess_edition

ROOT = Path(__file__).resolve().parent.parent


def table(rows, title, seconds):
    out = io.StringIO()
    print(title, file=out)
    for name, score, points, reason in rows:
        print(f"  {score:>2}/{points:<2}  {name}", file=out)
        if reason:
            print(f"          {reason}", file=out)
    score = sum(r[1] for r in rows)
    points = sum(r[2] for r in rows)
    print(f"  total {score}/{points}  ({seconds:.1f} s)", file=out)
    return out.getvalue()


def results_json(rows, after_published=(), seconds=None):
    """Gradescope's results.json: the tests named in `after_published` (the test-set
    floors) are shown once the grades are published; `seconds`, the grading's time."""
    results = {
        'score': sum(r[1] for r in rows),
        'tests': [
            dict(
                name=name, score=score, max_score=points,
                status='passed' if reason is None else 'failed',
                output=reason or 'passed',
                visibility='after_published' if name in after_published else 'visible',
            )
            for name, score, points, reason in rows
        ],
    }  # fmt: skip
    if seconds is not None:
        results['execution_time'] = round(seconds)
    return results


def parse_args(argv):
    argp = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    argp.add_argument('submissions', nargs='+', type=Path, help="folders or zip files")
    argp.add_argument('--edition', choices=sorted(EDITIONS), help="default: told from the files")
    argp.add_argument('--data', type=Path, default=ROOT / 'data', help="the data files' folder")
    argp.add_argument('--answers', type=Path, help="birth_test_inputs.tsv with the places")
    argp.add_argument('--json', type=Path, help="write Gradescope's results.json here")
    argp.add_argument('--csv', type=Path, help="write a row per submission here")
    argp.add_argument('--timeout', type=float, default=60, help="seconds per probe (60)")
    argp.add_argument('--jobs', type=int, help="probes run at once (default: up to 4)")
    argp.add_argument(
        '--learning_check',
        action='store_true',
        help="also run learning_check.py's few minutes of training (a row of no points)",
    )
    return argp.parse_args(argv)


def learning_row(submission, edition_name, data, box=None):
    """learning_check.py's training stages on the submission, as a row of no points (the
    grader's checks it starts from are the table's own, so it leaves them out). It runs
    in a process of its own, as its command line: the row's line is the report it prints
    between its first line and its verdict. `box`: the sandbox it runs in, on copies of the
    submission and the data that the sandbox's user owns."""
    variant = EDITIONS[edition_name]['variant']
    with tempfile.TemporaryDirectory(prefix='learning-') as work:
        options = {}
        if box:
            os.chmod(work, 0o711)
            copy = Path(work) / 'check'
            shutil.copytree(submission, copy / 'submission')
            shutil.copytree(data, copy / 'data')
            box.give(copy)
            submission, data = copy / 'submission', copy / 'data'
            options = box.command_options(seconds=3 * 3600)
        command = [
            sys.executable, str(Path(__file__).with_name('learning_check.py')), str(submission),
            '--edition', edition_name, '--seed', '0', '--data', str(data), '--skip_code_checks',
        ]  # fmt: skip
        environment = dict(os.environ, PYTHONIOENCODING='utf-8')  # a report may quote any text
        try:
            done = subprocess.run(
                command, capture_output=True, text=True, encoding='utf-8', errors='replace',
                env=environment, **options,
            )  # fmt: skip
        finally:
            if box:
                box.clear()
    printed = [line for line in done.stdout.split('\n') if line]
    trains = "trains as a correct one does"
    name = f"learning check (optional, no points): the {variant} model {trains}"
    if done.returncode == 0:
        return name, 0, 0, None
    if len(printed) < 2 or not printed[-1].startswith('Your pipeline '):  # it stopped early
        said = [line.strip() for line in (done.stderr + done.stdout).split('\n') if line.strip()]
        return name, 0, 0, f"learning_check.py stopped: {said[-1] if said else 'no output'}"
    return name, 0, 0, ' '.join(line.strip() for line in printed[1:-1])


def main(argv=None):
    args = parse_args(argv)
    try:
        check_data(args.data)
        if args.json and len(args.submissions) > 1:
            raise UserError(
                "--json takes one submission (results.json is Gradescope's, per student)"
            )
        answers = read_answers(args.answers, args.data)
        box = sandbox.current()  # as root: the submissions' code runs as another user
    except (UserError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    graded, status = [], 0
    with tempfile.TemporaryDirectory(prefix='submissions-') as unpack:
        for path in args.submissions:
            try:
                submission, note = find_submission(path, Path(unpack), str(path))
            except UserError as e:  # one unreadable submission; the others are still graded
                print(f"error: {e}", file=sys.stderr)
                graded.append((path, None, [], str(e)))
                status = 2
                continue
            edition = args.edition or guess_edition(path, submission)
            start = time.perf_counter()
            rows = grade(submission, edition, args.data, answers, args.timeout, args.jobs, box=box)
            if args.learning_check:
                rows.append(learning_row(submission, edition, args.data, box))
            seconds = time.perf_counter() - start
            guessed = '' if args.edition else ', told from its files; --edition to choose'
            noted = f"; {note}" if note else ''
            print(table(rows, f"{path} ({edition} edition{guessed}{noted})", seconds))
            graded.append((path, edition, rows, ''))
    if args.json and graded[0][2]:
        args.json.write_text(json.dumps(results_json(graded[0][2]), indent=2) + '\n')
    if args.csv:
        write_csv(args.csv, graded)
    return status


def write_csv(path, graded):
    """A row per submission: its edition, score and each test's points (the columns are
    every test any of them had), or why it could not be read."""
    names = list(dict.fromkeys(row[0] for _, _, rows, _ in graded for row in rows))
    with open(path, 'w', newline='', encoding='utf-8') as f:
        writer = csv.writer(f)
        writer.writerow(['submission', 'edition', 'score', 'max_score', 'note'] + names)
        for submission, edition, rows, note in graded:
            scores = {r[0]: r[1] for r in rows}
            total, points = sum(r[1] for r in rows), sum(r[2] for r in rows)
            cells = [scores.get(n, '') for n in names]
            writer.writerow([str(submission), edition or '', total, points, note] + cells)


if __name__ == '__main__':
    sys.exit(main())
