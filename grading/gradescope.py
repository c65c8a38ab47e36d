"""Gradescope's autograder for one handout edition, made in one command, and what it runs
there for each student's upload.

    python grading/gradescope.py --edition 2021 --out autograder.zip
    python grading/gradescope.py --edition 2024 --out autograder.zip \\
        --answers birth_test_inputs_with_places.tsv     # the test-set floors count too

The zip is what Gradescope's "zip file upload" takes: setup.sh (a virtual environment with
the grader's packages, made once when Gradescope builds the image), run_autograder, the
grader (GRADER_FILES: grade.py and the modules it imports, probes.py, architectures.json
and this file), the data files, and the test answers where given. For each upload,
run_autograder runs this file with --run: it finds the student's files in
$AUTOGRADER_ROOT/submission (default /autograder; uploads.py), grades them as grade.py
does (marking.py), prints grade.py's table and writes results/results.json. An upload
that cannot be graded (empty, no src/, another edition's, a zip that is not one) gets a
score of 0 and one line saying why. docs/grading.md ("Using it on Gradescope") has the
teacher's steps.
"""

import argparse
import json
import os
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import grade
import marking
import sandbox
from editions import DATA_FILES, EDITIONS, UserError, check_data, read_answers
from uploads import check_edition, find_submission

HERE = Path(__file__).resolve().parent
SOURCE = HERE.parent  # on Gradescope, /autograder/source: the zip's contents
# the grader: grade.py and every module of ours it imports, the probes' probes.py, and this
# file (tests/test_gradescope.py checks that none is missing)
GRADER_FILES = (
    'grade.py', 'editions.py', 'uploads.py', 'marking.py', 'suite.py', 'part_c.py',
    'part_d.py', 'part_e.py', 'part_f.py', 'part_g.py', 'references.py', 'probe_runner.py',
    'probes.py', 'sandbox.py', 'architectures.json', 'gradescope.py',
)  # fmt: skip
ANSWERS_FILE = 'birth_test_answers.tsv'  # the answers' name in the zip's data/
TORCH = '2.13.0'  # the release the project's tests run on

# Gradescope runs setup.sh once, as root, when it builds the image; the install step is the
# two pip lines, and BASE_PYTHON, VENV and TORCH_INDEX change what they use (a test runs
# them here, where only PyPI is reached)
SETUP_SH = """\
#!/usr/bin/env bash
# The grader's packages in a virtual environment, made from the image's python3 (3.10 or
# newer: Ubuntu 22.04's is 3.10); run once by Gradescope, as root, when it builds the image.
set -euo pipefail
ROOT="${AUTOGRADER_ROOT:-/autograder}"
VENV="${VENV:-$ROOT/venv}"
BASE_PYTHON="${BASE_PYTHON:-python3}"
TORCH_INDEX="${TORCH_INDEX-https://download.pytorch.org/whl/cpu}"  # empty: PyPI's
if [ -z "${SKIP_APT:-}" ] && command -v apt-get >/dev/null; then
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3 python3-venv python3-pip
fi
if ! "$BASE_PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 10))'; then
    echo "error: the grader needs Python 3.10 or newer; $BASE_PYTHON is older" >&2
    exit 1
fi
"$BASE_PYTHON" -m venv "$VENV"
"$VENV/bin/pip" install -q --no-cache-dir torch==%(torch)s \\
    ${TORCH_INDEX:+--index-url "$TORCH_INDEX"}
"$VENV/bin/pip" install -q --no-cache-dir 'numpy<3' tqdm
"$VENV/bin/python" -c 'import numpy, torch, tqdm; print("torch", torch.__version__)'
if [ "$(id -u)" = 0 ]; then  # the unprivileged user the students' code runs as
    "$VENV/bin/python" "$(dirname "$0")/grading/sandbox.py"
fi
"""

RUN_AUTOGRADER = """\
#!/usr/bin/env bash
# Gradescope runs this for each upload: grading/gradescope.py --run grades
# $AUTOGRADER_ROOT/submission and writes results/results.json, a score of 0 with its reason
# where the upload cannot be graded; this script writes that too if Python cannot start.
ROOT="${AUTOGRADER_ROOT:-/autograder}"
VENV="${VENV:-$ROOT/venv}"
export AUTOGRADER_ROOT="$ROOT"
rm -f "$ROOT/results/results.json"
cd "$ROOT/source" && "$VENV/bin/python" grading/gradescope.py --run
if [ ! -s "$ROOT/results/results.json" ]; then
    mkdir -p "$ROOT/results"
    echo '{"score": 0, "execution_time": 0, "stdout_visibility": "hidden", "tests": [],' \\
        '"output": "the autograder could not start Python; tell the course staff"}' \\
        > "$ROOT/results/results.json"
fi
exit 0
"""


# --- The teacher's command: the zip ------------------------------------------------------


def build(edition, out, data, answers_path=None):
    """Writes the autograder's zip for `edition` to `out`."""
    check_data(data)
    read_answers(answers_path, data)  # one line for a file that is not the answers
    config = dict(edition=edition, answers=answers_path is not None)
    with zipfile.ZipFile(out, 'w', zipfile.ZIP_DEFLATED) as z:
        executable(z, 'setup.sh', SETUP_SH % dict(torch=TORCH))
        executable(z, 'run_autograder', RUN_AUTOGRADER)
        z.writestr('gradescope.json', json.dumps(config, indent=2) + '\n')
        for name in GRADER_FILES:
            z.write(HERE / name, f"grading/{name}")
        for name in DATA_FILES:
            z.write(data / name, f"data/{name}")
        if answers_path is not None:
            z.write(answers_path, f"data/{ANSWERS_FILE}")


def executable(z, name, text):
    info = zipfile.ZipInfo(name, time.localtime()[:6])
    info.external_attr = 0o755 << 16
    info.compress_type = zipfile.ZIP_DEFLATED
    z.writestr(info, text)


# --- On Gradescope: one upload graded ----------------------------------------------------


def graded(root, config):
    """results.json's contents for the upload in root/submission; prints grade.py's table."""
    start = time.perf_counter()
    edition = config['edition']
    data = SOURCE / 'data'
    answers = None
    box = sandbox.current()  # as root, as on Gradescope: the students' code runs as another user
    if box:
        sandbox.lock_down([root, Path(sys.prefix)])
    if config['answers']:
        answers = read_answers(data / ANSWERS_FILE, data)
        (data / ANSWERS_FILE).unlink()  # the answers live on in this process's memory alone
    with tempfile.TemporaryDirectory(prefix='upload-') as unpack:
        submission, note = find_submission(root / 'submission', Path(unpack))
        check_edition(submission, edition)
        rows = marking.grade(submission, edition, data, answers, box=box)
    seconds = time.perf_counter() - start
    noted = f"; {note}" if note else ''
    print(grade.table(rows, f"the upload ({edition} edition{noted})", seconds))
    after_published = {name for name, t in marking.tests_for(edition, True) if t.answers}
    results = grade.results_json(rows, after_published, seconds)
    if note:  # which of the uploaded files were graded, for the student to see
        results['output'] = note[0].upper() + note[1:] + '.'
    return results


def run(root):
    """Grades root/submission into root/results/results.json, whatever the upload."""
    start = time.perf_counter()
    try:
        config = json.loads((SOURCE / 'gradescope.json').read_text())
        results = graded(root, config)
    except UserError as e:
        results = refused(str(e), start)
    except Exception as e:  # a score of 0 with the reason, never a crashed autograder
        results = refused(f"the autograder failed: {type(e).__name__}: {e}", start)
    results['stdout_visibility'] = 'hidden'  # the table shows the test-set floors' lines
    (root / 'results').mkdir(parents=True, exist_ok=True)
    (root / 'results' / 'results.json').write_text(json.dumps(results, indent=2) + '\n')


def refused(reason, start):
    reason = ' '.join(reason.split())
    print(f"not graded: {reason}")
    seconds = round(time.perf_counter() - start)
    return dict(score=0, execution_time=seconds, output=reason, tests=[])


def parse_args(argv):
    argp = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    argp.add_argument('--edition', choices=sorted(EDITIONS), help="the handout's edition")
    argp.add_argument('--out', type=Path, help="the zip to write (autograder.zip)")
    argp.add_argument('--answers', type=Path, help="birth_test_inputs.tsv with the places")
    argp.add_argument('--data', type=Path, default=grade.ROOT / 'data', help="the data files")
    argp.add_argument(
        '--run', action='store_true', help="on Gradescope: grade $AUTOGRADER_ROOT/submission"
    )
    args = argp.parse_args(argv)
    if not args.run and (args.edition is None or args.out is None):
        argp.error("--edition and --out are needed to make the zip")
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.run:
        run(Path(os.environ.get('AUTOGRADER_ROOT', '/autograder')))
        return 0
    try:
        build(args.edition, args.out, args.data, args.answers)
    except (UserError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    points, course_points = (
        sum(t.points for _, t in marking.tests_for(args.edition, args.answers is not None, ours))
        for ours in (True, False)
    )
    print(
        f"wrote {args.out}: the {args.edition} edition's autograder for Gradescope, {points} points"
    )
    print(
        f"  ({course_points} for an upload made from the course's own starter: it has no "
        f"src/machinery, so the {points - course_points}-point check of what our starter's "
        "machinery does with the student's code is left out)"
    )
    return 0


if __name__ == '__main__':
    sys.exit(main())
