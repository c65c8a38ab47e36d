"""What the commands of many phases (reproduce.py, grid.py) share: each phase is a run.py
command run in this process; a JSON record beside the outputs keeps what each output
was made with (its settings, the md5 of the params it was made from, the code's commit),
so that the same command run again skips what exists and refuses, before any work, an
output made with other settings; and whatever stops the command ends it with one line.
A record that several processes write at once (grid.py's cluster jobs, or two commands
on one folder) is a SharedRecord: each saves its own entries under the file's lock.
"""

import import_paths  # noqa: F401 (first: src/ and tools/ on sys.path)

import contextlib
import json
import os
import shlex
import subprocess
import sys
import time

import run
from machinery import files, metrics, resume


def run_command(argv):
    """One run.py command (its arguments, the phase first) in this process, checked as
    run.py checks it: pretrain and finetune return their Trainer, evaluate (total, correct)."""
    args = run.parse_args(argv)
    run.check_args(args)
    return run.PHASES[args.function](args)


def read_record(path):
    """The JSON record of a folder's phases, their settings and results ({} at first)."""
    if not os.path.exists(path):
        return {}
    try:
        with open(path, encoding='utf-8') as f:
            return json.load(f)
    except ValueError:
        raise files.UserError(f"{path}: not JSON; move it away to start afresh") from None


def write_record(path, record):
    files.atomic_write(path, lambda f: f.write(json.dumps(record, indent=1).encode('utf-8')))


class SharedRecord(dict):
    """A JSON record (read_record's dict) that several processes write at once: grid.py's
    Slurm jobs, or two grid.py commands on one --outdir. Each process saves the entries it
    set (record[key] = ..., or entry(key) for one it goes on with) on top of what the file
    holds then, under the file's lock, and sees the others' entries as they were saved.
    Nothing one process saved is lost to another's save."""

    def __init__(self, path):
        super().__init__(read_record(path))
        self.path = path
        self.mine = set()

    def __setitem__(self, key, value):
        self.mine.add(key)
        super().__setitem__(key, value)

    def entry(self, key):
        """The entry of `key`, which this process goes on to write."""
        self.mine.add(key)
        return self[key]

    def save(self):
        with locked(self.path):
            self.reread()
            write_record(self.path, self)

    def reread(self):
        """The file's entries as now saved (each file written whole: write_record), with
        this process's own over them, the same objects as before."""
        saved = read_record(self.path)
        saved.update({key: self[key] for key in self.mine})
        super().clear()
        super().update(saved)


@contextlib.contextmanager
def locked(path):
    """`path` held for this process alone: an exclusive lock on PATH.lock beside it, which
    the system releases whatever ends the process. On a cluster's shared filesystem the
    lock is NFS's (and Lustre's mounted with flock); a filesystem without locks is one
    UserError line."""
    lock = path + '.lock'
    with open(lock, 'a+b') as f:
        try:
            if os.name == 'nt':
                import msvcrt

                while True:  # LK_LOCK itself gives up after ten seconds
                    try:
                        msvcrt.locking(f.fileno(), msvcrt.LK_LOCK, 1)
                        break
                    except PermissionError:
                        time.sleep(0.1)
            else:
                import fcntl

                fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        except OSError as e:
            raise files.UserError(
                f"{lock}: cannot be locked ({e.strerror}): several processes write {path}, "
                f"so its folder must be on a filesystem with locks"
            ) from None
        try:
            yield
        finally:
            if os.name == 'nt':
                f.seek(0)
                msvcrt.locking(f.fileno(), msvcrt.LK_UNLCK, 1)


def check_made_with(planned, record):
    """Refuses, before any work, outputs (or the states of their interrupted runs) that a
    command would skip or resume but that were made with other settings. planned: (record
    key, output file, the settings this command makes it with) for each output."""
    for key, output, made_with in planned:
        recorded = record.get(key, {}).get('made_with')
        found = [path for path in (output, output + '.resume') if os.path.exists(path)]
        if found and recorded is not None and recorded != made_with:
            raise files.UserError(
                f"{found[0]} was made with other settings: {differences(recorded, made_with)}. "
                f"Use another --outdir, or delete it to make it again with these settings"
            )


def differences(recorded, made_with):
    """'max_epochs 1 (this command: the handout's)' for each setting that differs; a
    setting that is a command line, by its flags."""
    if isinstance(recorded, list) and isinstance(made_with, list):
        recorded, made_with = flag_values(recorded), flag_values(made_with)
    show = lambda value: "the handout's" if value is None else value
    found = []
    for key in {**recorded, **made_with}:
        old, new = recorded.get(key), made_with.get(key)
        if old == new:
            continue
        if isinstance(old, list) and isinstance(new, list):
            found.append(differences(old, new))
        else:
            found.append(f"{key} {show(old)} (this command: {show(new)})")
    return ', '.join(found)


def flag_values(argv):
    """{'--flag': value} of a command line (the words before its first flag by position)."""
    values = {f'word {i + 1}': word for i, word in enumerate(argv) if not word.startswith('--')}
    for i, word in enumerate(argv):
        if word.startswith('--'):
            has_value = i + 1 < len(argv) and not argv[i + 1].startswith('--')
            values[word] = argv[i + 1] if has_value else 'on'
            values.pop(f'word {i + 2}', None)
    return values


OUTPUT_SUFFIXES = ('.json', '.csv', '.md', '.predictions', '.png')


def commit(folder=None):
    """The code's git commit (with '+changes' when the code differs from it: a changed
    file, or a new Python file that git does not ignore, such as a module not yet added;
    outputs, new or tracked ones rewritten, such as a grid's grid.json, are not changes),
    or None. folder: this file's repository by default."""
    here = folder or os.path.dirname(os.path.abspath(__file__))
    git = lambda *a: subprocess.run(['git', *a], cwd=here, capture_output=True, text=True)
    try:
        head, status = git('rev-parse', 'HEAD'), git('status', '--porcelain', '-uall')
    except OSError:
        return None
    if head.returncode != 0:
        return None
    changes = [
        line for line in status.stdout.splitlines()
        if line.rstrip('"').endswith('.py')
        or not (line.startswith('??') or line.rstrip('"').endswith(OUTPUT_SUFFIXES))
    ]  # fmt: skip
    return head.stdout.strip() + ('+changes' if changes else '')


@contextlib.contextmanager
def one_line_stops(script, argv, again=None):
    """What stops a command of many phases ends it with one line: a user's error as every
    script ends it (files.report, exit 2), a non-finite loss with 'error: ...' (exit 1),
    an interruption with the command that continues it (exit 130), or `again`."""
    try:
        yield
    except files.UserError as e:
        sys.exit(files.report(e))
    except metrics.NonFiniteLoss as e:
        sys.exit(f"error: {e}")
    except (resume.TrainingInterrupted, KeyboardInterrupt) as e:
        if again is None:
            again = shlex.join(['python', script] + (sys.argv[1:] if argv is None else argv))
        print(f"\n{str(e) or 'interrupted'}. To continue: {again}", file=sys.stderr)
        sys.exit(130)
