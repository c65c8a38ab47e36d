"""grading/uploads.py: every shape of upload students make is graded as the zip
collect_submission.sh makes: the handout's files dragged in one by one (no src/), src/ two
folders down, a Mac's zip (__MACOSX/, .DS_Store) with an editor's folder, the zip inside a
folder, and the zip beside loose files (the note says which was graded). Each shape's
submission, as find_submission places it, holds the zip's files byte for byte; run_autograder
grades the loose files and the zip beside them as the zip. An upload that holds two
submissions, or none, gets one line naming what it found."""

import hashlib
import re
import shutil
import sys
import zipfile

import pytest

from conftest import ROOT
from test_gradescope import (  # noqa: F401 (fixtures)
    ZIPS,
    answers,
    bundles,
    gradescope_tree,
    ours,
    run_autograder,
)

sys.path.insert(0, str(ROOT / 'grading'))
import uploads  # noqa: E402
from editions import UserError  # noqa: E402
from uploads import PASSED_OVER, find_submission  # noqa: E402


def unpack(archive, folder):
    with zipfile.ZipFile(archive) as z:
        z.extractall(folder)
    return folder


def graded_files(submission):
    """What grading reads of a submission: src/ and the files beside it, byte for byte (not
    what uploads.py passes over: a Mac's .DS_Store, an editor's folder)."""
    return {
        p.relative_to(submission).as_posix(): hashlib.md5(p.read_bytes()).hexdigest()
        for p in sorted(submission.rglob('*'))
        if p.is_file() and not PASSED_OVER & set(p.relative_to(submission).parts)
    }


def loose(zipped, folder):
    """The zip's files dragged in one by one: src/'s files at the top beside the outputs
    (a package of src/, as machinery/, dragged in as its folder)."""
    folder.mkdir(parents=True)
    for path in sorted(zipped.iterdir()):
        if path.name == 'src':
            for inner in sorted(path.iterdir()):
                move = shutil.copytree if inner.is_dir() else shutil.copy2
                move(inner, folder / inner.name)
        else:
            shutil.copy2(path, folder / path.name)
    return folder


def shape(name, archive, upload):
    """`upload` (a folder) made as a student of shape `name` makes it from the zip."""
    zipped = unpack(archive, upload.parent / 'zipped')
    if name == 'loose files':
        loose(zipped, upload)
    elif name == 'src/ two folders down':
        shutil.copytree(zipped, upload / 'assignment' / 'a5')
    elif name == "a Mac's zip, with an editor's folder":
        inner = upload / 'a5'
        shutil.copytree(zipped, inner)
        (upload / '__MACOSX' / 'a5' / 'src').mkdir(parents=True)
        (upload / '__MACOSX' / 'a5' / 'src' / '._model.py').write_bytes(b'\0\5\26\7')
        (upload / '__MACOSX' / 'a5' / 'src' / '._run.py').write_bytes(b'\0\5\26\7')
        for folder in (upload, inner, inner / 'src'):
            (folder / '.DS_Store').write_bytes(b'\0\0\0\1Bud1')
        (inner / '.idea').mkdir()
        (inner / '.idea' / 'workspace.xml').write_text('<project/>\n')
    elif name == 'the zip in a folder':
        (upload / 'handin').mkdir(parents=True)
        shutil.copy(archive, upload / 'handin' / ZIPS['2021'])
    elif name == 'the zip beside loose files':
        loose(zipped, upload)
        shutil.copy(archive, upload / ZIPS['2021'])
        (upload / 'model.py').write_text('# an older copy\n')
    shutil.rmtree(zipped)
    return upload


SHAPES = {
    'loose files': None,
    'src/ two folders down': None,
    "a Mac's zip, with an editor's folder": None,
    'the zip in a folder': 'graded handin/assignment5.zip',
    'the zip beside loose files': 'graded assignment5.zip; the files beside it were not',
}


@pytest.mark.parametrize('name', SHAPES)
def test_each_shape_holds_the_zips_files(ours, tmp_path, name):  # noqa: F811
    archive = ours / '2021.zip'
    upload = shape(name, archive, tmp_path / 'upload')
    (tmp_path / 'into').mkdir()
    submission, note = find_submission(upload, tmp_path / 'into')
    assert note == SHAPES[name]
    assert graded_files(submission) == graded_files(unpack(archive, tmp_path / 'zip'))


@pytest.mark.parametrize('name', ['loose files', 'the zip beside loose files'])
@pytest.mark.slow
def test_run_autograder_grades_a_shape_as_its_zip(ours, bundles, grader_python, tmp_path, name):  # noqa: E501,F811
    results = {}
    for upload in ('zip', name):
        root = gradescope_tree(tmp_path / upload, bundles['2021'])
        if upload == 'zip':
            shutil.copy(ours / '2021.zip', root / 'submission' / ZIPS['2021'])
        else:
            shutil.rmtree(root / 'submission')
            shape(name, ours / '2021.zip', root / 'submission')
        results[upload] = run_autograder(root, grader_python)
    assert results['zip']['tests'] == results[name]['tests']
    assert (
        results['zip']['score']
        == results[name]['score']
        == sum(t['max_score'] for t in results['zip']['tests'])
    )
    assert results[name].get('output') == (SHAPES[name] and SHAPES[name].capitalize() + '.')


@pytest.mark.parametrize(
    'layout, reason',
    [
        ({'a/src/run.py': 'x', 'b/src/run.py': 'x'},
         r"^2 submissions in the upload \(a/src, b/src\): upload one, the zip "
         r"collect_submission\.sh makes$"),
        ({'a5/run.py': 'x', 'a5/model.py': 'x', 'old/run.py': 'x', 'old/model.py': 'x'},
         r"^2 submissions in the upload \(a5/\*\.py, old/\*\.py\): upload one"),
        ({'one.zip': {'src/run.py': 'x'}, 'two.zip': {'a5/src/run.py': 'x'}},
         r"^2 zips hold a submission \(one\.zip, two\.zip\): upload one"),
        ({'vanilla.pretrain.dev.predictions': 'Paris\n', 'notes.txt': 'x', '__MACOSX/._a': 'x'},
         r"^no src/ folder in the upload, nor the handout's files \(run\.py, model\.py, \.\.\.\): "
         r"it holds 2 files \(notes\.txt, vanilla\.pretrain\.dev\.predictions\): upload the zip "
         r"collect_submission\.sh makes, or src/ and the handout's outputs$"),
        ({'handin/a5.zip': {'notes.txt': 'x'}},
         r"^no src/ folder in handin/a5\.zip: upload the zip collect_submission\.sh makes$"),
        ({'__MACOSX/._src': 'x', '.DS_Store': 'x'}, r"^the upload is empty: "),
    ],
)  # fmt: skip
def test_an_upload_it_cannot_grade_gets_a_line_naming_what_it_found(tmp_path, layout, reason):
    upload = tmp_path / 'upload'
    for name, content in layout.items():
        (upload / name).parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, dict):
            with zipfile.ZipFile(upload / name, 'w') as z:
                for inner, text in content.items():
                    z.writestr(inner, text)
        else:
            (upload / name).write_text(content)
    (tmp_path / 'into').mkdir()
    with pytest.raises(UserError) as refused:
        find_submission(upload, tmp_path / 'into')
    assert re.search(reason, str(refused.value)), str(refused.value)


def test_a_zip_that_unpacks_past_the_bound_is_refused_before_unpacking(tmp_path, monkeypatch):
    """A zip bomb would fill the disk as root, before any limit on the student's code."""
    monkeypatch.setattr(uploads, 'MAX_UNPACKED', 2**20)
    upload = tmp_path / 'upload'
    upload.mkdir()
    with zipfile.ZipFile(upload / 'a5.zip', 'w', zipfile.ZIP_DEFLATED) as z:
        z.writestr('src/run.py', '\0' * (2**20 + 1))
    (tmp_path / 'into').mkdir()
    with pytest.raises(UserError, match=r"^a5\.zip unpacks to 0\.0 GB, more than a submission's"):
        find_submission(upload, tmp_path / 'into')
    assert list((tmp_path / 'into').iterdir()) == []
