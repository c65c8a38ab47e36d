"""The assignment's four data files: fetched once into data/ from the course's starter
archive, and each checked against the md5 sum recorded here before a run uses it.

A handout command that names an absent data file (`... wiki.txt ...`) fetches all four
once, saying so in one line; `python tools/get_data.py` does the same on demand, and
`--from` takes an address, a zip or a folder the user has. A file in data/ that is not
the course's (another file, a truncated copy) is named and never used. The course's
files are its own (Wikipedia's text, CC BY-SA), never committed here: data/README.md
says where they come from. The test set's places are not among them, nor fetched.
"""

import hashlib
import http.client
import io
import os
import re
import sys
import urllib.error
import urllib.request
import zipfile
from pathlib import Path

from machinery import files

# name: (md5, bytes) of the files the course's 2021 starter ships, which every reference
# run read
FILES = {
    'wiki.txt': ('800df4c4e255d7988b1656b30fde7143', 419253),
    'birth_places_train.tsv': ('a13c3e5d107778ab1a7e1d65ead5b9d0', 79923),
    'birth_dev.tsv': ('b38257100a128b922506666b4e7c7866', 20041),
    'birth_test_inputs.tsv': ('f6c94faa64f4a6a9b2e1c47973dc4fcb', 13880),
}
# the course's starter archives, tried in order (each edition's as the course published
# it; none could be reached from the machines this project is built on). A space-separated
# COURSE_DATA_SOURCES replaces them: a class's own copy, or a test's local server
ARCHIVE = 'https://web.stanford.edu/class/archive/cs/cs224n'
SOURCES = [
    f'{ARCHIVE}/cs224n.1214/assignments/a5.zip',  # 2021
    f'{ARCHIVE}/cs224n.1234/assignments/a5.zip',  # 2023
    f'{ARCHIVE}/cs224n.1244/assignments/a5_student_code.zip',  # winter 2024
    f'{ARCHIVE}/cs224n.1246/assignments/a4_spr24_student_code.zip',  # spring 2024
]
TIMEOUT_S = 30  # a download's wait for each answer of the server
MANUAL = (
    "copy wiki.txt, birth_places_train.tsv, birth_dev.tsv and birth_test_inputs.tsv from "
    "the course's starter into data/ by hand (data/README.md)"
)


def sources():
    given = os.environ.get('COURSE_DATA_SOURCES')
    return SOURCES if given is None else given.split()


def recorded(name):
    """(md5, bytes or None) of the course's `name`: FILES's, or a class's own data's
    (COURSE_DATA_MD5, space-separated NAME=MD5 pairs, which the tests' tiny corpora use)."""
    own = {}
    for pair in os.environ.get('COURSE_DATA_MD5', '').split():
        name_given, _, sum_given = pair.partition('=')
        if name_given not in FILES or not re.fullmatch(r'[0-9a-f]{32}', sum_given):
            raise files.UserError(
                f"COURSE_DATA_MD5: {pair!r} is not NAME=MD5 for one of {', '.join(FILES)}"
            )
        own[name_given] = (sum_given, None)
    return own.get(name, FILES[name])


def md5(data):
    return hashlib.md5(data).hexdigest()


def problem(name, data):
    """Why `data` is not the course's `name`, or None when it is. The 2024 starter's
    wiki.txt lacks the final newline: that copy is named as such."""
    expected, size = recorded(name)
    if md5(data) == expected:
        return None
    if name == 'wiki.txt' and md5(data + b'\n') == expected:
        return "the 2024 starter's copy, without the final newline the other editions' has"
    if size is not None and len(data) < size:
        return f"cut short: {len(data):,} bytes, where the course's has {size:,}"
    return f"not the course's file (md5 {md5(data)}, expected {expected})"


CHECKED = set()  # (path, mtime, size) of the files found right


def checked(path):
    """`path`, one of the course's files, after checking its bytes (once per version of the
    file); a UserError names it otherwise."""
    path = Path(path)
    stat = path.stat()
    key = (str(path), stat.st_mtime_ns, stat.st_size)
    if key not in CHECKED:
        why = problem(path.name, path.read_bytes())
        if why:
            raise files.UserError(
                f"{path}: {why}; never used. Remove it and run the command again to fetch "
                f"the course's, or get it with python tools/get_data.py --from STARTER_ZIP"
            )
        CHECKED.add(key)
    return path


def find(name, folder=None):
    """data/`name` (or `folder`/`name`), checked, fetching the four files first when it is
    absent."""
    folder = Path(folder or files.DATA_DIR)
    if not (folder / name).exists():
        fetch(sources(), folder)
    return checked(folder / name)


def fetch(where, folder):
    """The four files into `folder` from the first of `where` (addresses, zips or folders)
    that holds them all, each checked before it is written; the ones already there and
    right are kept. A UserError says what every source lacked."""
    folder = Path(folder)
    missing = [name for name in FILES if not (folder / name).exists()]
    for name in FILES:
        if name not in missing:
            checked(folder / name)
    if not missing:
        return []
    failures = {}  # why: [the sources that failed so]
    for source in where:
        print(
            f"{folder}/: fetching the course's data files from {source}",
            file=sys.stderr,
            flush=True,
        )
        try:
            found = read_source(source, missing)
        except files.UserError as e:
            failures.setdefault(str(e).removeprefix(f'{source}: '), []).append(source)
            continue
        folder.mkdir(parents=True, exist_ok=True)
        for name in missing:
            files.atomic_write(folder / name, lambda f, data=found[name]: f.write(data))
        print(
            f"{folder}/: {', '.join(missing)} fetched from {source} and checked (md5)",
            file=sys.stderr,
            flush=True,
        )
        return missing
    tried = '; '.join(
        f"{failed[0]}: {why}" if len(failed) == 1 else f"{len(failed)} addresses: {why}"
        for why, failed in failures.items()
    )
    raise files.UserError(
        f"{folder}/ lacks {', '.join(missing)}, and the course's data could not be fetched "
        f"({tried or 'COURSE_DATA_SOURCES names no source'}). "
        f"With the course's starter zip at hand: python tools/get_data.py --from STARTER_ZIP; "
        f"or {MANUAL}"
    )


def read_source(source, names):
    """{name: bytes} of each of `names` in `source`, each the course's; a UserError naming
    the source and the file otherwise."""
    if os.path.isdir(source):
        members = {
            str(Path(root, n).relative_to(source)): Path(root, n)
            for root, _, found in os.walk(source)
            for n in found
        }
        read = lambda member: members[member].read_bytes()  # noqa: E731
    else:
        archive = open_archive(source)
        members = {info.filename: info for info in archive.infolist() if not info.is_dir()}
        read = lambda member: read_member(archive, member, source)  # noqa: E731
    found = {}
    for name in names:
        candidates = [
            m for m in members if Path(m).name == name and '__MACOSX' not in Path(m).parts
        ]
        if not candidates:
            raise files.UserError(f"{source}: no {name} in it")
        contents = {m: with_final_newline(name, read(m)) for m in candidates}
        whys = {m: problem(name, data) for m, data in contents.items()}
        good = [m for m, why in whys.items() if why is None]
        if not good:
            member, why = next(iter(whys.items()))
            raise files.UserError(f"{source}: {member}: {why}")
        found[name] = contents[good[0]]
    return found


def with_final_newline(name, data):
    """The 2024 starter's wiki.txt is the others' without its final newline: given it
    back, it is the file every reference run read."""
    if name == 'wiki.txt' and data and not data.endswith(b'\n'):
        return data + b'\n'
    return data


def read_member(archive, member, source):
    try:
        return archive.read(member)
    except (zipfile.BadZipFile, OSError, EOFError) as e:
        raise files.UserError(f"{source}: {member}: damaged ({e})")


def open_archive(source):
    """A ZipFile over the local zip or the address's download."""
    if '://' not in source:
        try:
            data = Path(source).read_bytes()
        except OSError as e:
            raise files.UserError(f"{source}: cannot read: {e.strerror}")
    else:
        data = download(source)
    try:
        return zipfile.ZipFile(io.BytesIO(data))
    except zipfile.BadZipFile:
        raise files.UserError(f"{source}: not a zip archive, or a damaged or cut short one")


def download(url):
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as answer:
            data = answer.read()
            length = answer.headers.get('Content-Length')
    except urllib.error.HTTPError as e:
        raise files.UserError(f"{url}: HTTP {e.code} {e.reason}")
    except http.client.IncompleteRead as e:
        raise files.UserError(f"{url}: cut short ({len(e.partial):,} bytes arrived)")
    except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as e:
        reason = getattr(e, 'reason', e)
        raise files.UserError(f"{url}: could not be reached ({reason})")
    if length is not None and len(data) != int(length):
        raise files.UserError(f"{url}: cut short ({len(data):,} of {int(length):,} bytes)")
    return data
