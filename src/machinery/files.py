"""Reading the user's files and writing ours, safely: input text checked and read as the
original's text-mode open() read it, bare file names found in data/ (the course's files
checked there, and fetched when absent: course_data.py), files written
whole or not at all, and torch files loaded without running anything in them. Every
problem is a UserError: one line for the user, no traceback; report prints it, as every
script does.
"""

import hashlib
import os
import pickle
import re
import secrets
import shlex
import sys
from pathlib import Path

import torch

DATA_DIR = Path(__file__).resolve().parents[2] / 'data'  # the repository's data/


class UserError(Exception):
    """A problem with the command line or an input file: reported as one line, no traceback."""


def report(error):
    """Every script's handler of a UserError: prints its one line, 'error: ...', on stderr
    and returns the exit status for it, 2 (argparse's for a bad command line)."""
    print(f"error: {error}", file=sys.stderr)
    return 2


def find_data_file(path, fetch=False):
    """`path` itself if it exists, else data/`path` for a bare file name, so that the
    handout's commands (`... wiki.txt ...`) work from the repo root. One of the course's
    files found there is checked first; with `fetch`, one that data/ lacks is fetched
    (course_data.py), as the reading of a file does."""
    from machinery import course_data  # it imports this module

    if os.path.exists(path) or os.path.dirname(path) != '':
        return path
    if path in course_data.FILES and (fetch or (DATA_DIR / path).exists()):
        return str(course_data.find(path))
    return str(DATA_DIR / path) if (DATA_DIR / path).exists() else path


def read_text(path):
    """The whole file as text, checked: exists, readable, non-empty, valid UTF-8. Line ends
    are normalised as the original's text-mode open() did (universal newlines: CRLF and a
    lone CR become LF), so a file checked out with Windows line ends reads the same."""
    found = find_data_file(path, fetch=True)
    try:
        with open(found, 'rb') as f:
            raw = f.read()
    except FileNotFoundError:
        hint = f' (nor in {DATA_DIR}/; see data/README.md)' if os.path.dirname(path) == '' else ''
        raise UserError(f'{path}: no such file{hint}')
    except OSError as e:
        raise UserError(f'{path}: cannot read: {e.strerror}')
    if not raw.strip():
        raise UserError(f'{found}: file is empty')
    try:
        return universal_newlines(raw.decode('utf-8'))
    except UnicodeDecodeError as e:
        line = universal_newlines(raw[: e.start].decode('utf-8')).count('\n') + 1
        raise UserError(f'{found}, line {line}: not valid UTF-8 (byte {raw[e.start]:#x})')


def universal_newlines(text):
    return text.replace('\r\n', '\n').replace('\r', '\n')


def read_lines(path):
    """read_text(path) split into lines, without the empty string after the final newline."""
    lines = read_text(path).split('\n')
    if lines[-1] == '':
        lines.pop()
    return lines


def atomic_write(path, write):
    """Call write(file_object) on a temporary file beside `path`, then rename it over
    `path`: an interrupted save never leaves a truncated file behind. The file gets the
    mode any new file of the user's gets (0666 less the umask), where tempfile's own
    temporary files would be private (0600)."""
    path = Path(path)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, 'O_BINARY', 0)
    while True:
        tmp = path.parent / f'.{path.name}.{secrets.token_hex(4)}.tmp'
        try:
            fd = os.open(tmp, flags, 0o666)
            break
        except FileExistsError:
            continue
    try:
        with os.fdopen(fd, 'wb') as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def md5(path):
    """The md5 of the file's bytes: what the records and the cards keep of a params file."""
    with open(path, 'rb') as f:
        return hashlib.md5(f.read()).hexdigest()


def atomic_save(obj, path):
    atomic_write(path, lambda f: torch.save(obj, f))


def load_weights_only(path, where, kind, if_trusted):
    """torch.load(path) with weights_only=True: only tensors and plain Python values (dicts,
    lists, tuples, numbers, strings) are rebuilt, so nothing in the file can run code, which
    any pickled object or function could. A file that needs more is refused with one line
    naming what it holds, followed by `if_trusted` (how a user who trusts it converts it).
    Other problems are one line too; `where` starts each line, `kind` names the file type."""
    try:
        return torch.load(path, map_location='cpu', weights_only=True)
    except FileNotFoundError:
        raise UserError(f"{where}: no such file")
    except IsADirectoryError:
        raise UserError(f"{where}: is a directory")
    except OSError as e:
        raise UserError(f"{where}: cannot read: {e.strerror}")
    except EOFError:
        raise UserError(f"{where}: not a {kind} (the file is empty or cut short)")
    except Exception as e:
        # torch's own test for a refused class or function (a pickle GLOBAL), as in its message
        found = isinstance(e, pickle.UnpicklingError) and re.search(r'GLOBAL (\S+)', str(e))
        if found:
            raise UserError(
                f"{where}: refused: it holds code or objects ({found.group(1)}), which "
                f"are never loaded because loading them can run code; only tensors and "
                f"plain values are. {if_trusted}"
            )
        raise UserError(f"{where}: not a {kind}, or a damaged one (torch.load: {type(e).__name__})")


def convert_command(expression, source, target):
    """A shell command that loads `source` in full (objects included: only for trusted files)
    and saves `expression`, a Python expression of the loaded object s, to `target`."""
    code = (
        "import sys, torch; s = torch.load(sys.argv[1], weights_only=False); "
        f"torch.save({expression}, sys.argv[2])"
    )
    return f"python -c {shlex.quote(code)} {shlex.quote(str(source))} {shlex.quote(str(target))}"
