"""What is graded, from what was uploaded (find_submission): the zip collect_submission.sh
makes, that zip inside a folder or beside other files, src/ at any depth, or the handout's
files dragged in one by one (the upload form Gradescope shows first), placed as
collect_submission.sh places them;
and the edition it was written for, told from its files (guess_edition), or a refusal
where it is another edition's than the assignment's (check_edition).
"""

import re
import shutil
import zipfile

from editions import EDITIONS, UserError

# what uploads hold besides a submission: Macs' __MACOSX/ and .DS_Store, byte code, and
# editors' and tools' folders (virtual environments are told by their pyvenv.cfg)
PASSED_OVER = {'__MACOSX', '.DS_Store', '__pycache__', '.git', '.idea', '.vscode',
               '.ipynb_checkpoints', 'node_modules'}  # fmt: skip
UPLOAD_IT = "upload the zip collect_submission.sh makes"
ONE = f"upload one, {UPLOAD_IT.removeprefix('upload ')}"
LISTED = 4  # the files a refusal names at most
MAX_UNPACKED = 2**30  # bytes: a submission with its three params unpacks to about 40 MB


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


def find_submission(path, into, name='the upload'):
    """(the folder holding the submission's src/, a note or None) in `path`, a folder or a
    zip file, called `name` in messages. The submission is the one src/ folder in it at any
    depth, else the handout's files uploaded loose (a folder holding run.py and model.py),
    placed as collect_submission.sh places them. A zip in the folder, at any depth, is
    looked into the same way, and one that holds a submission is graded before the files
    beside it: the note says so. Zips are unpacked, and loose files placed, in `into`."""
    if path.is_file() and zipfile.is_zipfile(path):
        found = submissions(unzipped(path, into, path.name), into)
        if not found:
            raise UserError(f"no src/ folder in {path.name}: {UPLOAD_IT}")
        return only(found, path.name), None
    if not path.is_dir():
        raise UserError(f"{path}: neither a folder nor a zip file")
    files = listed(path)
    if not files:
        raise UserError(f"{name} is empty: {UPLOAD_IT} (src/ and the handout's outputs)")
    zips = [f for f in files if f.suffix.lower() == '.zip']
    loose = submissions(path, into)
    zipped = {}
    for z in zips:
        zip_name = z.relative_to(path).as_posix()
        if not zipfile.is_zipfile(z):
            if loose or len(zips) > 1:
                continue  # beside a submission, a file of another kind named .zip
            raise UserError(f"{zip_name} is not a zip file: {UPLOAD_IT}")
        found = submissions(unzipped(z, into, zip_name), into)
        if found:
            zipped[zip_name] = found
    if len(zipped) > 1:
        raise UserError(f"{len(zipped)} zips hold a submission ({', '.join(zipped)}): {ONE}")
    if zipped:
        ((zip_name, found),) = zipped.items()
        if files == [path / zip_name] and '/' not in zip_name:
            return only(found, zip_name), None  # the zip alone: nothing to tell
        beside = "; the files beside it were not" if loose else ''
        return only(found, zip_name), f"graded {zip_name}{beside}"
    if loose:
        return only(loose, name), None
    if zips:
        names = ' or '.join(z.relative_to(path).as_posix() for z in zips)
        raise UserError(f"no src/ folder in {names}: {UPLOAD_IT}")
    raise UserError(
        f"no src/ folder in {name}, nor the handout's files (run.py, model.py, ...): it "
        f"holds {described(files, path)}: {UPLOAD_IT}, or src/ and the handout's outputs"
    )


def listed(folder):
    """The files in `folder` at any depth, less what PASSED_OVER names, links and virtual
    environments."""
    found = []
    for path in sorted(folder.iterdir()):
        if path.name in PASSED_OVER or path.is_symlink():
            continue
        if path.is_dir() and not (path / 'pyvenv.cfg').is_file():
            found += listed(path)
        elif path.is_file():
            found.append(path)
    return found


def submissions(folder, into):
    """The submissions in `folder`, as (the folder holding src/, its name): each src/ folder
    of Python files that is in no other, else each folder of the handout's files loose
    (placed in `into`)."""
    files = [f for f in listed(folder) if f.suffix.lower() != '.zip']
    code = sorted({f.parent for f in files if f.suffix == '.py'})
    sources = [
        s for s in code
        if s.name == 'src' and 'src' not in s.relative_to(folder).parts[:-1]
    ]  # fmt: skip
    if sources:
        return [(s.parent, s.relative_to(folder).as_posix()) for s in sources]
    loose = [c for c in code if (c / 'run.py').is_file() and (c / 'model.py').is_file()]
    return [(placed(c, into), (c.relative_to(folder) / '*.py').as_posix()) for c in loose]


def only(found, where):
    """The one submission `found` in `where`, else a refusal naming each."""
    if len(found) > 1:
        names = ', '.join(name for _, name in found)
        raise UserError(f"{len(found)} submissions in {where} ({names}): {ONE}")
    return found[0][0]


def placed(code, into):
    """The handout's files uploaded loose in `code`, placed as collect_submission.sh places
    them: the Python files (and the packages among the folders) in src/, london_baseline.py
    and the outputs beside it."""
    target = into / f"{len(list(into.iterdir()))}"
    (target / 'src').mkdir(parents=True)
    for path in sorted(code.iterdir()):
        if path.name in PASSED_OVER or path.is_symlink():
            continue
        if path.is_file() and path.suffix == '.py' and path.name != 'london_baseline.py':
            shutil.copy2(path, target / 'src' / path.name)
        elif path.is_file():
            shutil.copy2(path, target / path.name)
        elif (path / '__init__.py').is_file():  # a package of the code, as machinery/
            shutil.copytree(path, target / 'src' / path.name)
    return target


def unzipped(path, into, name):
    """`path` unpacked in a folder of its own in `into`."""
    target = into / f"{len(list(into.iterdir()))}"
    try:
        with zipfile.ZipFile(path) as z:
            size = sum(info.file_size for info in z.infolist())
            if size > MAX_UNPACKED:  # unpacked as root, before any limit on the student
                raise UserError(
                    f"{name} unpacks to {size / 2**30:.1f} GB, more than a submission's "
                    f"{MAX_UNPACKED // 2**30} GB: {UPLOAD_IT}"
                )
            z.extractall(target)  # zipfile drops absolute paths and '..' from the names
    except (zipfile.BadZipFile, OSError, ValueError) as e:
        raise UserError(f"{name} cannot be unpacked: {e}")
    return target


def described(files, folder):
    """'3 files (a, b, c)', naming the first few."""
    names = [f.relative_to(folder).as_posix() for f in files]
    more = f" and {len(names) - LISTED} more" if len(names) > LISTED else ''
    return f"{len(names)} file{'s' * (len(names) != 1)} ({', '.join(names[:LISTED])}{more})"


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
