"""A real one-node Slurm cluster for the tests of research/grid.py --cluster slurm: Debian's
slurm-wlm and munge (which .ci/run installs where it runs as root), started here with a
generated configuration: munged with a key of its own, slurmctld and slurmd on this host,
on free ports, CPUs only, state and logs in a temporary folder. The `slurm` fixture starts
it once for the session and stops it after; where it cannot be started (not root, the
packages missing, Windows) the tests that use it skip, saying why."""

import os
import shutil
import socket
import subprocess
import time

import pytest

import slurm_grid

DAEMONS = ('munged', 'slurmctld', 'slurmd')


def why_not():
    """Why no cluster can be started here, or None."""
    if os.name == 'nt':
        return "Slurm is Linux's"
    if os.geteuid() != 0:
        return "starting munged, slurmctld and slurmd needs root"
    missing = [d for d in (*DAEMONS, 'sbatch', 'squeue', 'scontrol') if not shutil.which(d)]
    if missing:
        return (f"{', '.join(missing)} not installed (.ci/run installs them as root: "
                f"apt-get install slurm-wlm munge)")  # fmt: skip
    try:
        import submitit  # noqa: F401
    except ImportError:
        return "submitit is not installed (pip install submitit)"
    return None


def free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def configuration(folder, host):
    """slurm.conf for one node, this host, every CPU and nine tenths of the memory."""
    memory_mb = os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') // 2**20 * 9 // 10
    return f"""\
ClusterName=testbed
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
AuthType=auth/munge
AuthInfo=socket={folder}/munge/socket
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/builtin
StateSaveLocation={folder}/state
SlurmdSpoolDir={folder}/spool
SlurmctldPidFile={folder}/slurmctld.pid
SlurmdPidFile={folder}/slurmd.pid
SlurmctldLogFile={folder}/slurmctld.log
SlurmdLogFile={folder}/slurmd.log
ReturnToService=2
MpiDefault=none
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
KillWait=30
NodeName={host} NodeAddr=127.0.0.1 CPUs={os.cpu_count()} RealMemory={memory_mb} State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


@pytest.fixture(scope='session')
def slurm(tmp_path_factory):
    """The cluster's environment: SLURM_CONF, which Slurm's commands read (os.environ has it
    while the session runs)."""
    reason = why_not()
    if reason:
        pytest.skip(f"no Slurm here: {reason}")
    folder = tmp_path_factory.mktemp('slurm')
    for sub in ('munge', 'state', 'spool'):
        (folder / sub).mkdir(mode=0o700)
    key = folder / 'munge' / 'munge.key'
    key.write_bytes(os.urandom(128))
    key.chmod(0o400)
    munge = folder / 'munge'
    subprocess.run(['munged', '--force', f'--socket={munge}/socket', f'--key-file={key}',
                    f'--log-file={munge}/log', f'--pid-file={munge}/pid',
                    f'--seed-file={munge}/seed'], check=True)  # fmt: skip
    host = socket.gethostname().split('.')[0]
    conf = folder / 'slurm.conf'
    conf.write_text(configuration(folder, host))
    before = os.environ.get('SLURM_CONF')
    os.environ['SLURM_CONF'] = str(conf)
    try:
        subprocess.run(['slurmctld', '-f', str(conf)], check=True)
        subprocess.run(['slurmd', '-f', str(conf), '-N', host], check=True)
        deadline = time.time() + 60
        while True:
            state = subprocess.run(['sinfo', '--noheader', '--format', '%T'],
                                   capture_output=True, text=True)  # fmt: skip
            if state.stdout.strip() == 'idle':
                break
            if time.time() > deadline:
                pytest.fail(f"the one-node Slurm never became idle: {state.stdout}{state.stderr}"
                            f"{(folder / 'slurmctld.log').read_text()[-2000:]}")  # fmt: skip
            time.sleep(0.5)
        yield dict(os.environ)
    finally:
        subprocess.run(['scancel', '--user', 'root'], capture_output=True)
        for pid_file in ('slurmd.pid', 'slurmctld.pid', 'munge/pid'):
            stop(folder / pid_file)
        if before is None:
            os.environ.pop('SLURM_CONF', None)
        else:
            os.environ['SLURM_CONF'] = before


def stop(pid_file):
    """Ends the daemon whose pid is in `pid_file`, waiting until it is gone."""
    try:
        pid = int(pid_file.read_text())
        os.kill(pid, 15)
    except (OSError, ValueError):
        return
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            os.kill(pid, 0)
        except OSError:
            return
        time.sleep(0.1)
    os.kill(pid, 9)


def start_now(job, seconds=180):
    """A requeued job started at once: Slurm holds a requeued job back two minutes."""
    deadline = time.time() + seconds
    while slurm_grid.queued_jobs().get(job) != 'PENDING':
        assert time.time() < deadline, f"job {job} never came back to the queue"
        time.sleep(0.2)
    subprocess.run(['scontrol', 'update', f'jobid={job}', 'StartTime=now'], check=True)
