"""The students' code runs as an unprivileged user wherever the grader runs as root
(Gradescope runs its autograders as root; so may a teacher's container):

    python grading/sandbox.py      # as root: adds the user (setup.sh runs it on Gradescope)

Each probe process (probe_runner.py) enters the sandbox before it imports a line of the
submission: it takes the user's uid and gid and no other groups, cannot gain privileges
again (no setuid programs), and works under limits on its processes, file sizes, CPU time
and core dumps; the kernel ends it first when memory runs out. The grader's files, data,
virtual environment and results stay root's and unwritable to it (lock_down); the answers
are read before any probe starts and exist only in the grader's memory, which another user
cannot read. While the probes run, a guard ends every process of the user once their files
eat more than DISK_BUDGET of a disk the grader writes to; after them, every process of the
user is ended and every file it left in the shared temporary folders removed, before the
grader writes its results.

Where the grader does not run as root (a student's laptop), none of this applies: the probes
run as the user who started the grader, as before. What is not guarded (the network, which
Gradescope decides; System V shared memory): docs/grading.md.
"""

import ctypes
import math
import os
import pwd
import resource
import shutil
import signal
import stat
import subprocess
import sys
import sysconfig
import threading
import time
import warnings
from pathlib import Path

USER = 'student-code'
SHARED_TEMP = ('/tmp', '/var/tmp', '/dev/shm')  # where any user may write
# A probe's processes, threads included (Linux counts each against the user): a probe uses a
# few, and the probes run four at once.
MAX_PROCESSES = 128
MAX_FILE_SIZE = 256 * 2**20  # bytes: the largest file a probe writes is a log of kilobytes
DISK_BUDGET = int(os.environ.get('GRADER_DISK_BUDGET', 2**30))  # bytes the user may fill
PR_SET_NO_NEW_PRIVS = 38


class Sandbox:
    """The unprivileged user the students' code runs as."""

    def __init__(self, entry):
        self.name, self.uid, self.gid = entry.pw_name, entry.pw_uid, entry.pw_gid

    def enter(self, folder, seconds):
        """Makes this process the user's, in `folder` (its working folder, the user's own),
        for a probe of at most `seconds`: called in the probe's process before anything of
        the submission runs; nothing of the grader's is left open in it."""
        self.become(seconds)
        os.closerange(3, resource.getrlimit(resource.RLIMIT_NOFILE)[0])
        os.environ['HOME'] = str(folder)
        os.umask(0o077)

    def become(self, seconds):
        """This process, root's, becomes the user's, within the limits (which root sets
        before, as the user could not raise its out-of-memory score)."""
        limit(seconds)
        os.setgroups([])
        os.setgid(self.gid)
        os.setuid(self.uid)  # real, effective and saved: there is no way back to root

    def command_options(self, seconds):
        """subprocess's options that run a command as the user, within the limits, for at
        most `seconds` of CPU time (subprocess's own user= would change it first)."""
        return dict(preexec_fn=lambda: self.become(seconds))

    def give(self, path):
        """Makes `path` (a file, or a folder and all in it) the user's."""
        os.chown(path, self.uid, self.gid, follow_symlinks=False)
        for top, folders, files in os.walk(path):
            for name in folders + files:
                os.chown(os.path.join(top, name), self.uid, self.gid, follow_symlinks=False)

    def clear(self):
        """Ends every process of the user, then removes the files it left."""
        self.end_processes()
        self.remove_files()

    def processes(self):
        """The pids of the processes running as the user (by any of their uids)."""
        found = []
        for entry in os.scandir('/proc'):
            if not entry.name.isdigit():
                continue
            try:
                with open(f"/proc/{entry.name}/status") as f:
                    uids = next(line for line in f if line.startswith('Uid:')).split()[1:]
            except (OSError, StopIteration):
                continue  # it ended while being read
            if str(self.uid) in uids:
                found.append(int(entry.name))
        return found

    def end_processes(self, seconds=10):
        """Ends every process of the user. kill(-1) from a process of the user reaches all its
        others at once, so a process that keeps forking new copies cannot slip between the
        kills; a process of the user forked from here does it, then the pids left are killed
        one by one until none is left."""
        deadline = time.monotonic() + seconds
        while True:
            self._kill_all_as_user()
            left = self.processes()
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            if not left:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"processes of {self.name} still run after {seconds} s: {left}")
            time.sleep(0.05)

    def _kill_all_as_user(self):
        with warnings.catch_warnings():  # the child only makes system calls, then exits
            warnings.simplefilter('ignore', DeprecationWarning)
            pid = os.fork()
        if pid == 0:
            try:
                os.setgroups([])
                os.setgid(self.gid)
                os.setuid(self.uid)
                os.kill(-1, signal.SIGKILL)  # all the user's processes but this one
            finally:
                os._exit(0)
        os.waitpid(pid, 0)

    def remove_files(self):
        """Removes what the user left in the shared temporary folders (its own folders
        inside the grader's work folder go with it)."""
        for top in SHARED_TEMP:
            if os.path.isdir(top):
                self._remove_owned(top)

    def _remove_owned(self, folder):
        try:
            entries = list(os.scandir(folder))
        except OSError:
            return
        for entry in entries:
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if info.st_uid == self.uid:
                if stat.S_ISDIR(info.st_mode):
                    shutil.rmtree(entry.path, ignore_errors=True)
                else:
                    os.unlink(entry.path)
            elif stat.S_ISDIR(info.st_mode):
                self._remove_owned(entry.path)  # a shared folder inside, as /tmp/.X11-unix


def limit(seconds):
    """This process's limits (and its children's): processes, file size, CPU time, no core
    dumps, first to be ended when memory runs out, and no gaining privileges by running a
    setuid program."""
    with open('/proc/self/oom_score_adj', 'w') as f:
        f.write('1000')  # out of memory, the kernel ends this process before the grader
    cpu = math.ceil(seconds) + 30  # a process of it that outlives the probe stops soon
    for kind, value in [
        (resource.RLIMIT_NPROC, MAX_PROCESSES),
        (resource.RLIMIT_FSIZE, MAX_FILE_SIZE),
        (resource.RLIMIT_CPU, cpu),
        (resource.RLIMIT_CORE, 0),
    ]:
        resource.setrlimit(kind, (value, value))
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")


def current():
    """The sandbox the students' code runs in here: None where the grader is not root (or
    not on Linux); else the user's, added where it is missing. Refuses a Python whose files
    the user cannot read (one under /root, say), in which its code could not run."""
    if not sys.platform.startswith('linux') or os.geteuid() != 0:
        return None
    for path in {sysconfig.get_paths()[key] for key in ('stdlib', 'platstdlib', 'purelib')}:
        closed = closed_to_others(path)
        if closed:
            raise RuntimeError(
                f"the students' code runs as {USER}, who cannot read {path} ({closed} is "
                "root's alone): grade with a Python installed where every user reads it, "
                "as setup.sh's virtual environment of the system's python3"
            )
    try:
        return Sandbox(pwd.getpwnam(USER))
    except KeyError:
        pass
    command = [
        'useradd', '--system', '--user-group', '--no-create-home', '--home-dir', '/nonexistent',
        '--shell', '/usr/sbin/nologin', USER,
    ]  # fmt: skip
    try:
        subprocess.run(command, check=True, capture_output=True, text=True)
    except (OSError, subprocess.CalledProcessError) as e:
        said = getattr(e, 'stderr', None) or str(e)
        raise RuntimeError(
            f"the grader runs as root and cannot add the user {USER} that the students' code "
            f"runs as: {' '.join(said.split())}"
        )
    return Sandbox(pwd.getpwnam(USER))


def closed_to_others(path):
    """The first folder on the way to `path` (or `path` itself) that users other than its
    owner cannot pass through or read; None where there is none."""
    path = os.path.realpath(path)
    for folder in [*reversed(Path(path).parents), Path(path)]:
        mode = os.stat(folder).st_mode
        if not mode & stat.S_IXOTH or (folder == Path(path) and not mode & stat.S_IROTH):
            return str(folder)
    return None


def lock_down(folders, secret_files=()):
    """Takes write access to `folders` (and all in them) from everyone but root, and read
    access to `secret_files` too."""
    for folder in folders:
        for top, names, files in os.walk(folder):
            for name in [top, *(os.path.join(top, n) for n in names + files)]:
                info = os.lstat(name)
                if not stat.S_ISLNK(info.st_mode) and info.st_mode & 0o022:
                    os.chmod(name, stat.S_IMODE(info.st_mode) & ~0o022)
    for path in secret_files:
        os.chmod(path, 0o600)


class DiskGuard:
    """While it is entered, ends every process of the sandbox's user once the disks the
    grader writes to (its work folder's, and the shared temporary folders') have lost more
    than DISK_BUDGET bytes since it started; `tripped` then says so in a line."""

    def __init__(self, box, folders, every=0.2):
        self.box, self.every, self.tripped = box, every, None
        by_device = {os.stat(f).st_dev: f for f in [*folders, *SHARED_TEMP] if os.path.isdir(f)}
        self.free = {f: shutil.disk_usage(f).free for f in by_device.values()}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.watch, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()

    def watch(self):
        while not self.stop.wait(self.every):
            for folder, free in self.free.items():
                if free - shutil.disk_usage(folder).free > DISK_BUDGET:
                    self.tripped = (
                        f"the submission's processes wrote more than {DISK_BUDGET // 2**20} MB "
                        "of files and were ended"
                    )
                    self.box.clear()  # the free space comes back; the guard goes on


if __name__ == '__main__':
    if os.geteuid() != 0:
        sys.exit("error: run as root: it adds the user the students' code runs as")
    try:
        box = current()
    except RuntimeError as e:
        sys.exit(f"error: {e}")
    print(f"the students' code runs as {box.name} (uid {box.uid})")
