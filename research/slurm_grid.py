"""research/grid.py --cluster slurm: the grid as the jobs of one Slurm job array, through
submitit. Each pretraining group (one variant's pretraining, or --share K of them, then each
run's finetunings and evaluations) and each --pretrained file with its runs is one job. A
job is grid.py itself, run on its node for its group alone: it writes the files a local run
writes, into the same --outdir on the cluster's shared filesystem, and its records into
the one grid.json, under the file's lock (records.SharedRecord).

Slurm stops a job for three reasons it comes back from: a preemption, `scontrol requeue`,
and the warning before the time limit (SIGUSR2, which the job answers by asking Slurm to
requeue it). Each ends in Slurm's SIGTERM, which every process of the job gets: each
pretraining or finetuning saves its resumable state after its step, as at Ctrl-C, and the
requeued job resumes it. The command follows its jobs until they end, and reports each one
that ended without its results by its log's path and last line; run again, it submits only
what is missing or failed, and says which jobs still run.

    python research/grid.py --pretrain vanilla synthesizer rope perceiver \\
        --pretrain_seeds 0 1 2 3 4 --seeds 0 1 2 --outdir results/seeds --precision bf16 \\
        --cluster slurm --slurm_partition gpu --slurm_setup 'module load cuda'
"""

import import_paths  # noqa: F401 (first: src/ and tools/ on sys.path)

import contextlib
import getpass
import io
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time

import grid
import records
from machinery import files

POLL_SECONDS = 15  # how often the command asks Slurm which of its jobs still run


def check_args(args):
    """What --cluster slurm needs, checked before anything is submitted; --device auto
    becomes the jobs' device (cuda with --slurm_gpus, else cpu)."""
    try:
        import submitit  # noqa: F401
    except ImportError:
        raise files.UserError("--cluster slurm: needs submitit (pip install submitit)") from None
    if shutil.which('sbatch') is None:
        raise files.UserError(
            "--cluster slurm: Slurm's sbatch is not on this machine's PATH: run the command "
            "where jobs are submitted (a login node)"
        )
    if args.jobs != 1:
        raise files.UserError("--jobs: processes at once here; on Slurm, --slurm_at_once")
    if args.precision == 'auto':
        raise files.UserError(
            "--cluster slurm: give --precision (bf16 on GPUs from Ampere on, else fp32): "
            "auto would be decided on each node, and a grid's runs share one"
        )
    if args.device == 'auto':
        args.device = 'cuda' if args.slurm_gpus else 'cpu'
    if args.device == 'mps':
        raise files.UserError("--device mps: Slurm's nodes have no Apple GPU")


def job_groups(args, record):
    """[(name, grid.py argv of its job, done(record): whether its runs are all done)]: a job
    per pretraining group (grid.group_runs), then one per --pretrained file. Outputs made
    with other settings are refused here, before any job is submitted."""
    pretrainings = grid.pretraining_runs(args)
    records.check_made_with([(key, out, made) for key, out, made, _ in pretrainings], record)
    made_with = {key: made for key, _, made, _ in pretrainings}
    jobs = []
    for group in grid.group_runs([(k, out, argv) for k, out, _, argv in pretrainings], args.share):
        variant = group[0][2][1]
        seeds = [argv[argv.index('--seed') + 1] for _, _, argv in group]
        argv = ['--pretrain', variant, '--pretrain_seeds', *seeds, *common_argv(args)]
        done = lambda record, group=group: all(
            grid.done_elsewhere(args, k, out, made_with[k], record) for k, out, _ in group
        )
        jobs.append((f"{variant}.s{'+'.join(seeds)}", argv, done))
    runs = grid.planned_runs(args)
    records.check_made_with([(key, out + '.params', made) for key, out, made, _ in runs], record)
    for path in args.pretrained:
        model = grid.model_of(path)
        done = lambda record, model=model: grid.runs_done(args, model, record)
        jobs.append((model[1], ['--pretrained', path, *common_argv(args)], done))
    return jobs


def common_argv(args):
    """grid.py's flags that every job passes on: all but which runs, and --cluster's."""
    argv = ['--methods', *(text for text, _ in args.methods), '--seeds', *map(str, args.seeds)]
    for name in ('outdir', 'pretrain_corpus_path', 'finetune_corpus_path', 'eval_corpus_path',
                 'test_corpus_path', 'pretrain_max_epochs', 'pretrain_batch_size',
                 'pretrain_edition', 'share', 'max_epochs', 'batch_size', 'finetune_lr',
                 'lora_alpha', 'device', 'precision'):  # fmt: skip
        if getattr(args, name) is not None:
            argv += [f'--{name}', str(getattr(args, name))]
    return argv


def run_all(args):
    """Submits the groups not done and not running, follows every job of the grid that is
    still in Slurm's queue until it ends, and returns the record; a job that ended without
    its results is reported, and then the command ends with one line (after the tables of
    what finished)."""
    os.makedirs(args.outdir, exist_ok=True)
    folder = os.path.join(args.outdir, 'slurm')
    record = records.SharedRecord(os.path.join(args.outdir, 'grid.json'))
    groups = job_groups(args, record)
    submitted = records.SharedRecord(os.path.join(folder, 'jobs.json'))  # {name: job id}
    queued = queued_jobs()
    to_submit, following = [], {}
    for name, argv, done in groups:
        job = submitted.get(name)
        if done(record):
            print(f"== {name}: done, skipped")
        elif job in queued:
            print(f"== {name}: still in Slurm as job {job} ({queued[job]})")
            following[name] = job
        else:
            if job:
                print(f"== {name}: Slurm job {job} ended without its results "
                      f"({last_words(folder, job)}): submitted again")  # fmt: skip
            to_submit.append((name, argv))
    if following and grid.finished(record):
        grid.write_tables(args, record)
        print(f"== the runs finished so far: {os.path.join(args.outdir, 'grid.md')}")
    if to_submit:
        jobs = submit(args, folder, [argv for _, argv in to_submit])
        for (name, _), job in zip(to_submit, jobs):
            print(f"== {name}: Slurm job {job}")
            following[name] = submitted[name] = job
        submitted.save()
    failed = follow(folder, record, following, {name: done for name, _, done in groups})
    if failed:
        if grid.finished(record):
            grid.write_tables(args, record)
        raise files.UserError(
            f"{len(failed)} Slurm job{'s' if len(failed) > 1 else ''} ended without "
            f"{'their' if len(failed) > 1 else 'its'} results ({', '.join(failed)}): the same "
            f"command submits again what is missing"
        )
    return record


def follow(folder, record, following, done):
    """Waits until the jobs {name: job id} have left Slurm's queue, saying how each ended
    (done: {name: done(record)}); returns the names of those that ended without their
    results."""
    waiting, failed = dict(following), []
    if waiting:
        print(f"== following {len(waiting)} Slurm job{'s' if len(waiting) > 1 else ''}: "
              f"their logs are in {shown(folder)}/ (Ctrl-C stops following, not the jobs)",
              flush=True)  # fmt: skip
    try:
        while waiting:
            queued = queued_jobs()
            ended = [name for name, job in waiting.items() if job not in queued]
            if ended:
                record.reread()
            for name in ended:
                job = waiting.pop(name)
                if done[name](record):
                    print(f"== {name}: done (Slurm job {job})", flush=True)
                else:
                    print(f"== {name}: Slurm job {job} ended without its results: "
                          f"{last_words(folder, job)}", flush=True)  # fmt: skip
                    failed.append(name)
            if waiting:
                time.sleep(POLL_SECONDS)
    except KeyboardInterrupt:
        raise KeyboardInterrupt("stopped following; the Slurm jobs go on") from None
    return failed


def submit(args, folder, argvs):
    """One job array, a job per grid.py argv; returns their job ids."""
    import submitit

    executor = submitit.SlurmExecutor(folder=folder)
    parameters = {
        'job_name': f"grid-{os.path.basename(os.path.abspath(args.outdir))}",
        'time': args.slurm_minutes,
        'cpus_per_task': args.slurm_cpus,
        'mem': f"{args.slurm_mem_gb}GB",
        # the jobs import research/ (run_group is pickled by its module's name)
        'setup': [
            f"export PYTHONPATH={shlex.quote(os.path.join(import_paths.ROOT, 'research'))}"
            "${PYTHONPATH:+:$PYTHONPATH}",
            *args.slurm_setup,
        ],  # fmt: skip
        'additional_parameters': {'requeue': True},
    }
    if args.slurm_partition:
        parameters['partition'] = args.slurm_partition
    if args.slurm_gpus:
        parameters['gpus_per_node'] = args.slurm_gpus
    if args.slurm_at_once:
        parameters['array_parallelism'] = args.slurm_at_once
    executor.update_parameters(**parameters)
    try:  # submitit prints a refusal's lines, and its error carries them: one line is ours
        with contextlib.redirect_stderr(io.StringIO()):
            jobs = executor.map_array(run_group, argvs)
    except Exception as e:
        detail = str(e).strip().splitlines()
        raise files.UserError(f"sbatch refused the jobs: {detail[-1] if detail else e}") from None
    return [job.job_id for job in jobs]


def queued_jobs():
    """{job id: state} of this user's jobs in Slurm's queue (pending, running, requeued),
    each element of an array by its own id (12_3)."""
    result = subprocess.run(['squeue', '--noheader', '--array', '--user', getpass.getuser(),
                             '--format', '%i|%T'], capture_output=True, text=True)  # fmt: skip
    if result.returncode != 0:
        raise files.UserError(f"squeue: {result.stderr.strip() or result.returncode}")
    return dict(line.split('|', 1) for line in result.stdout.split())


def last_words(folder, job):
    """'LOG: its last line' (srun's own lines left out), from the job's error log, else
    its output."""
    from submitit.core.utils import JobPaths

    paths = JobPaths(folder, job_id=job, task_id=0)
    for path in (paths.stderr, paths.stdout):
        if os.path.exists(path):
            with open(path, encoding='utf-8', errors='replace') as f:
                lines = [line.strip() for line in f if line.strip()]
            said = [line for line in lines if not line.startswith('srun: ')] or lines
            if said:
                return f"{shown(path)}: {said[-1]}"
    return f"{shown(paths.stderr)}: no log (the job never started?)"


def shown(path):
    """`path` as the command's user named its folder: relative where it lies below here."""
    relative = os.path.relpath(path)
    return str(path) if relative.startswith('..') else relative


# --- In the job -------------------------------------------------------------------------


def run_group(argv):
    """A job: research/grid.py for its group, on this node. It ends with grid.py's own exit
    status and last line, as the command would in a terminal."""
    grid.IN_SLURM_JOB = True
    job_process = os.getpid()

    def requeue_before_the_time_limit(signum, frame):
        # Slurm's warning (sbatch --signal, USR2 as submitit asks for it), which forked
        # workers hear too: the job asks to be requeued, and the requeue's SIGTERM stops it
        if os.getpid() == job_process:
            print("the time limit is near: this job asks Slurm to requeue it", flush=True)
            subprocess.run(['scontrol', 'requeue', this_job()])

    signal.signal(signal.SIGUSR2, requeue_before_the_time_limit)
    try:
        grid.main(argv)
    except SystemExit as e:
        if e.code not in (0, None):
            if isinstance(e.code, str):
                print(e.code, file=sys.stderr)
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(e.code if isinstance(e.code, int) else 1)  # not submitit's traceback


def this_job():
    """This job's id as scontrol takes it: an array's element as ARRAY_TASK (12_3), for its
    own number alone can be the array's, and requeue the whole array."""
    env = os.environ
    if 'SLURM_ARRAY_JOB_ID' in env:
        return f"{env['SLURM_ARRAY_JOB_ID']}_{env['SLURM_ARRAY_TASK_ID']}"
    return env['SLURM_JOB_ID']
