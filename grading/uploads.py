"""What is graded, from what was uploaded: the folder holding src/ in a submission given as
a folder or a zip (unpacked), or in a Gradescope upload of either shape (find_submission);
and the edition it was written for, told from its files (guess_edition), or a refusal
where it is another edition's than the assignment's (check_edition).
"""

import re
import zipfile

from editions import EDITIONS, UserError


def unpacked(path, into):
    """The folder holding src/ in the submission `path` (a folder, or a zip unpacked into
    `into`)."""
    if path.is_file() and zipfile.is_zipfile(path):
        target = into / f"{len(list(into.iterdir()))}"
        with zipfile.ZipFile(path) as z:
            z.extractall(target)  # zipfile drops absolute paths and '..' from the names
        path = target
    elif not path.is_dir():
        raise UserError(f"{path}: neither a folder nor a zip file")
    if (path / 'src').is_dir():
        return path
    inner = [p for p in path.iterdir() if (p / 'src').is_dir()]
    if len(inner) == 1:
        return inner[0]
    raise UserError(f"{path}: no src/ folder in it (a submission holds src/ and the outputs)")


def guess_edition(path, submission):
    """The starter's edition (run.py's DEFAULT_EDITION), else the second variant's whose
    files are there, else 2021 (2024 for the 2024 zip's name)."""
    run_py = submission / 'src' / 'run.py'
    text = run_py.read_text(errors='replace') if run_py.is_file() else ''
    named = re.search(r"^DEFAULT_EDITION = '(\d{4})'", text, re.M)
    if named and named.group(1) in EDITIONS:
        return named.group(1)
    for edition_name in ('2021', '2023', '2024'):
        variant = EDITIONS[edition_name]['variant']
        if any(submission.glob(f"{variant}.*")):
            return edition_name
    return '2024' if path.name == 'assignment4_submission.zip' else '2021'


def find_submission(upload, into):
    """The folder holding src/ in what the student uploaded: the files loose (src/ at the
    top, or inside one folder), or one zip holding them (collect_submission.sh's)."""
    files = [p for p in upload.rglob('*') if p.is_file()] if upload.is_dir() else []
    if not files:
        raise UserError(
            "the upload is empty: upload the zip collect_submission.sh makes (src/ and the "
            "handout's outputs)"
        )
    try:
        return unpacked(upload, into)
    except UserError:
        pass
    zips = [p for p in upload.iterdir() if p.suffix.lower() == '.zip']
    if len(zips) != 1:
        raise UserError(
            "no src/ folder in the upload: upload the zip collect_submission.sh makes, or "
            "src/ and the handout's outputs"
        )
    if not zipfile.is_zipfile(zips[0]):
        raise UserError(
            f"{zips[0].name} is not a zip file: upload the zip collect_submission.sh makes"
        )
    try:
        return unpacked(zips[0], into)
    except (zipfile.BadZipFile, OSError) as e:
        raise UserError(f"{zips[0].name} cannot be unpacked: {e}")
    except UserError:
        raise UserError(
            f"no src/ folder in {zips[0].name}: upload the zip collect_submission.sh makes"
        )


def check_edition(submission, edition):
    """Refuses an upload of another edition: a starter of another edition (its run.py's
    DEFAULT_EDITION), or one with another variant's results and none of this one's."""
    variant = EDITIONS[edition]['variant']
    guessed = guess_edition(submission, submission)  # a starter's, else by the results
    theirs = EDITIONS[guessed]['variant']
    if theirs == variant:
        return
    run_py = submission / 'src' / 'run.py'
    text = run_py.read_text(errors='replace') if run_py.is_file() else ''
    a_starter_of_it = f"DEFAULT_EDITION = '{guessed}'" in text
    its_results_only = any(submission.glob(f"{theirs}.*")) and not any(
        submission.glob(f"{variant}.*")
    )
    if a_starter_of_it or its_results_only:
        raise UserError(
            f"this upload is of the {guessed} edition ({theirs}), and this assignment is the "
            f"{edition} edition's ({variant}): upload the zip `bash collect_submission.sh "
            f"{edition}` makes"
        )
