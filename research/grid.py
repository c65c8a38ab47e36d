"""Finetuning with error bars: every pretrained model x finetuning method x seed, finetuned
and evaluated one after another, and a table of dev accuracy as mean, standard deviation
and every run, with the trainable parameters and the finetuning time of each.

    python research/grid.py --pretrained vanilla.pretrain.params rope.pretrain.params \\
        --methods full lora:1 lora:4 lora:16 adapter --seeds 0 1 2 3 4 --outdir grid
    python research/grid.py --pretrained vanilla.pretrain.params --methods full lora:4 \\
        --seeds 0 1 --max_epochs 1 --outdir grid_quick      # a quick look
    python research/grid.py --outdir grid --plot grid.png       # the table and picture only

Each run is the handout's finetune command from the pretrained params, with
--finetune_method and --seed (a method is full, lora:RANK or adapter:SIZE, or lora and
adapter for the defaults), then evaluate on the dev set and on the test inputs. The
variant (and the perceiver's bottleneck) is read from each params file, and a model is
named for its file: perceiver.s1.pretrain.params is perceiver.s1.

With --pretrain, the variants named are first pretrained by the handout's pretrain
command, once per --pretrain_seeds, into --outdir as VARIANT.sSEED.pretrain.params
(every variant's first seed before any second), each then finetuned and evaluated as a
--pretrained file is, while the next pretrainings run; --jobs runs several pretraining
processes at once (on several GPUs each on one of its own, else sharing one), and --share
K puts K pretrainings of one variant in one process, stepping together
(machinery/shared_runs.py: each run's params its run alone's, within rounding):

    python research/grid.py --pretrain vanilla synthesizer rope perceiver \
        --pretrain_seeds 0 1 2 3 4 --seeds 0 1 2 --outdir results/seeds --jobs 2 \
        --share 5 --precision fp32              # shared runs train in fp32 only

With --cluster slurm each pretraining group (or --pretrained file) with its runs is one
job of a Slurm job array, preemptible and resumable (research/slurm_grid.py):

    python research/grid.py --pretrain vanilla rope --pretrain_seeds 0 1 2 --seeds 0 1 2 \
        --outdir results/seeds --precision bf16 --cluster slurm --slurm_partition gpu

Outputs go to --outdir: MODEL.METHOD.sSEED.params and its .dev/.test.predictions;
grid.json records each run's settings, the md5 of the params it started from, the code's
commit and its figures; grid.md holds the table, grid.csv every run. Models whose names
differ by a pretraining seed (perceiver, perceiver.s1, perceiver.s2) get a second table:
how far their means lie apart, against the finetuning seeds' spread within each. A run whose
predictions exist with the same settings is skipped, and an interrupted one resumes, so
after an interruption run the same command again; one made with other settings is
refused before any work. Params are not committed: on another machine, with grid.json and
the predictions committed, the same command skips each pretraining whose runs are all
done, and pretrains again (and runs again from) one whose runs are not. Several processes
may write one --outdir (Slurm's jobs, or two commands): each saves its own entries into
grid.json under its lock, and a run found without its entry is made again.
"""

import import_paths  # first: src/ and tools/ on sys.path

import machinery.cpu_libraries  # noqa: F401 (first: it sets up MKL and oneDNN before torch)

import argparse
import contextlib
import csv
import io
import math
import os
import re
import signal
import statistics
import subprocess
import sys
import time

import torch

import plot
import records
import run
from machinery import (
    checks,
    devices,
    distributed,
    files,
    finetune_methods,
    params_files,
    shared_runs,
)


def parse_method(text):
    """'full', 'lora', 'lora:RANK', 'adapter' or 'adapter:SIZE' -> (name, run.py flags)."""
    name, _, size = text.partition(':')
    flag = {'lora': '--lora_rank', 'adapter': '--adapter_size'}.get(name)
    if name not in finetune_methods.METHODS or (size and (flag is None or not size.isdigit())):
        raise argparse.ArgumentTypeError(
            f"{text!r}: a method is full, lora, lora:RANK, adapter or adapter:SIZE"
        )
    flags = ['--finetune_method', name] + ([flag, size] if size else [])
    return text, flags


def parse_args(argv):
    argp = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    argp.add_argument('--pretrained', nargs='+', default=[], help="pretrained params files")
    argp.add_argument(
        '--methods', nargs='+', type=parse_method, default=[parse_method('full')],
        help="finetuning methods: full, lora[:RANK], adapter[:SIZE] (default full)",
    )  # fmt: skip
    argp.add_argument('--seeds', nargs='+', type=int, default=[0], help="finetuning seeds")
    argp.add_argument('--outdir', default='grid', help="where the runs go (default grid)")
    argp.add_argument('--pretrain_corpus_path', default='wiki.txt')
    argp.add_argument('--finetune_corpus_path', default='birth_places_train.tsv')
    argp.add_argument('--eval_corpus_path', default='birth_dev.tsv')
    argp.add_argument('--test_corpus_path', default='birth_test_inputs.tsv')
    argp.add_argument(
        '--pretrain', nargs='+', default=[], choices=list(run.VARIANT_EDITION),
        help="variants to pretrain first, once per --pretrain_seeds, into --outdir",
    )  # fmt: skip
    argp.add_argument(
        '--pretrain_seeds', nargs='+', type=int, default=[0], help="pretraining seeds"
    )
    argp.add_argument(
        '--pretrain_max_epochs',
        type=run.positive(int),
        help="each pretraining's epochs (run.py's --max_epochs; default: the handout's)",
    )
    argp.add_argument(
        '--pretrain_batch_size',
        type=run.positive(int),
        help="each pretraining's batch (run.py's --batch_size; default: the handout's)",
    )
    argp.add_argument(
        '--pretrain_edition',
        choices=sorted(run.EDITIONS),
        help="each pretraining's handout edition, its schedule (run.py's --edition; "
        "default: each variant's own)",
    )
    argp.add_argument(
        '--jobs', type=run.positive(int), default=1,
        help="processes of pretraining at once, each on a GPU of its own where there are "
        "several (default 1)",
    )  # fmt: skip
    argp.add_argument(
        '--share', type=run.positive(int), default=1,
        help="pretrainings of one variant that step together in one process "
        "(machinery/shared_runs.py; default 1: each alone, as run.py)",
    )  # fmt: skip
    argp.add_argument('--max_epochs', type=run.positive(int), help="cap finetuning at this")
    argp.add_argument('--batch_size', type=run.positive(int), help="default: run.py's")
    argp.add_argument('--finetune_lr', type=run.positive(float), help="default: run.py's")
    argp.add_argument('--lora_alpha', type=run.positive(float), help="default: run.py's")
    devices.add_arguments(argp)
    argp.add_argument('--plot', help="also draw accuracy against trainable parameters here")
    cluster = argp.add_argument_group(
        'on a Slurm cluster (docs/research.md)', "--cluster slurm: each pretraining group "
        "(or --pretrained file) with its finetunings is one job of a job array (submitit)"
    )  # fmt: skip
    cluster.add_argument(
        '--cluster', choices=['local', 'slurm'], default='local',
        help="local: here (default); slurm: Slurm jobs, followed until they end",
    )  # fmt: skip
    cluster.add_argument('--slurm_partition', metavar='NAME', help="default: the cluster's")
    cluster.add_argument(
        '--slurm_gpus', type=non_negative, default=1, metavar='N', help="per job (default 1)"
    )
    cluster.add_argument('--slurm_cpus', type=run.positive(int), default=4, metavar='N',
                         help="per job (default 4)")  # fmt: skip
    cluster.add_argument('--slurm_mem_gb', type=run.positive(int), default=16, metavar='GB',
                         help="memory per job (default 16)")  # fmt: skip
    cluster.add_argument(
        '--slurm_minutes', type=run.positive(int), default=60, metavar='M',
        help="time limit per job (default 60); a job near it saves its state and is requeued",
    )  # fmt: skip
    cluster.add_argument('--slurm_at_once', type=run.positive(int), metavar='N',
                         help="jobs running at once (default: as Slurm allows)")  # fmt: skip
    cluster.add_argument(
        '--slurm_setup', action='append', default=[], metavar='LINE',
        help="a shell line each job runs first, e.g. 'module load cuda' (repeatable)",
    )  # fmt: skip
    return argp.parse_args(argv)


def non_negative(text):
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r}: not a whole number of 0 or more")
    return int(text)


def pretrained_model(path):
    """(name, variant, run.py flags for its shape) of a pretrained params file."""
    variant, bottleneck_dim = params_files.variant_and_bottleneck(path, flag='--pretrained')
    flags = ['--bottleneck_dim', str(bottleneck_dim)] if variant == 'perceiver' else []
    return model_name(path), variant, flags


def model_name(path):
    """A pretrained params file's model name: perceiver.s1.pretrain.params is perceiver.s1."""
    return os.path.basename(path).removesuffix('.params').removesuffix('.pretrain')


def pretrained_name(variant, seed):
    """The model name of --pretrain's pretraining of a variant with a seed: perceiver.s1."""
    return f"{variant}.s{seed}"


def output_prefix(outdir, model, method, seed):
    """Where a run's files go: PREFIX.params, PREFIX.dev.predictions, PREFIX.test.predictions."""
    return os.path.join(outdir, f"{model}.{method.replace(':', '')}.s{seed}")


def model_of(path):
    """(params path, name, variant, shape flags, md5) of a pretrained params file."""
    return (path, *pretrained_model(path), files.md5(path))


def planned_runs(args, models=None):
    """[(key, output prefix, settings to record, run.py argvs: finetune, evaluate dev and
    test)], one per model x method x seed. models: [model_of(...)], by default those of
    the --pretrained files."""
    if models is None:
        models = [model_of(path) for path in args.pretrained]
    runs = []
    for path, name, variant, shape, digest in models:
        for method, method_flags in args.methods:
            for seed in args.seeds:
                out = output_prefix(args.outdir, name, method, seed)
                common = [variant, args.pretrain_corpus_path, '--seed', str(seed), *shape,
                          '--device', args.device]  # fmt: skip
                finetune = ['finetune', *common, '--reading_params_path', path,
                            '--writing_params_path', out + '.params',
                            '--finetune_corpus_path', args.finetune_corpus_path,
                            *method_flags, *overrides(args)]  # fmt: skip
                evaluate = ['evaluate', *common, '--reading_params_path', out + '.params']
                dev = evaluate + ['--eval_corpus_path', args.eval_corpus_path,
                                  '--outputs_path', out + '.dev.predictions']  # fmt: skip
                test = evaluate + ['--eval_corpus_path', args.test_corpus_path,
                                   '--outputs_path', out + '.test.predictions']  # fmt: skip
                made_with = {'model': name, 'method': method, 'seed': seed,
                             'finetune': finetune[1:], 'pretrained_md5': digest}  # fmt: skip
                runs.append((f"{name} {method} s{seed}", out, made_with, [finetune, dev, test]))
    return runs


def overrides(args):
    """The flags passed on to every finetuning."""
    flags = []
    for name in ('max_epochs', 'batch_size', 'finetune_lr', 'lora_alpha'):
        if getattr(args, name) is not None:
            flags += [f'--{name}', str(getattr(args, name))]
    return flags + ['--precision', args.precision]


def run_all(args):
    """Every pretraining missing (--pretrain), and every run whose dev and test predictions
    are missing; returns the record."""
    os.makedirs(args.outdir, exist_ok=True)
    record = records.SharedRecord(os.path.join(args.outdir, 'grid.json'))
    save = record.save
    pretrainings = pretraining_runs(args)
    records.check_made_with([(key, out, made) for key, out, made, _ in pretrainings], record)
    to_make = []  # the pretrainings not skipped as done elsewhere (checked before any work)
    for key, out, made_with, argv in pretrainings:
        if not os.path.exists(out) and done_elsewhere(args, key, out, made_with, record):
            print(f"== {key}: its finetunings and evaluations are done (grid.json; its "
                  f"params stayed where it was made), skipped")  # fmt: skip
        else:
            to_make.append((key, out, made_with, argv))
    runs = planned_runs(args)
    records.check_made_with([(key, out + '.params', made) for key, out, made, _ in runs], record)
    finetune_all(args, runs, record, save)
    with contextlib.closing(pretrain_all(args, to_make, record, save)) as written:
        for params in written:  # its finetunings, while the next pretrainings run
            runs = planned_runs(args, [model_of(params)])
            records.check_made_with([(k, out + '.params', m) for k, out, m, _ in runs], record)
            finetune_all(args, runs, record, save)
    return record


def finetune_all(args, runs, record, save):
    """The planned_runs whose dev and test predictions are missing, one after another."""
    code, machine = records.commit(), devices.describe(args.device)
    for key, out, made_with, (finetune, dev, test) in runs:
        outputs = [out + '.params', out + '.dev.predictions', out + '.test.predictions']
        if all(os.path.exists(p) for p in outputs) and 'dev_correct' in record.get(key, {}):
            print(f"== {key}: {out}.* exist, skipped")
            continue
        print(f"== {key}")
        finetuning = not os.path.exists(out + '.params') or key not in record
        if finetuning:  # made now (again, if found without its record): its record begins
            record[key] = {'made_with': made_with, 'commit': code, 'machine': machine}
        entry = record.entry(key)
        save()  # before the work: a leftover .resume is then known to be this run's
        if finetuning:
            resuming = ['--resume'] if os.path.exists(out + '.params.resume') else []
            trainer = records.run_command(finetune + resuming)
            model = trainer.model
            entry['trainable'] = sum(p.numel() for p in model.parameters() if p.requires_grad)
            entry['parameters'] = sum(p.numel() for p in model.parameters())
            entry['finetune_seconds'] = trainer.elapsed
            save()
        entry['dev_total'], entry['dev_correct'] = records.run_command(dev)
        records.run_command(test)
        save()


# The flags each variant's handout passes to its commands (the perceiver's bottleneck).
VARIANT_FLAGS = {
    variant: flags for variant, flags in (s['second_variant'] for s in run.EDITIONS.values())
}


def pretraining_runs(args):
    """[(key, params file, settings to record, run.py argv)] of each --pretrain variant x
    --pretrain_seeds: the handout's pretrain command with --seed, every variant's first
    seed before any second (so that a run cut short has each variant's first seeds)."""
    runs = []
    for seed in args.pretrain_seeds:
        for variant in args.pretrain:
            name = pretrained_name(variant, seed)
            out = os.path.join(args.outdir, f"{name}.pretrain.params")
            argv = ['pretrain', variant, args.pretrain_corpus_path, '--seed', str(seed),
                    *VARIANT_FLAGS.get(variant, []), '--device', args.device,
                    '--precision', args.precision]  # fmt: skip
            if args.pretrain_max_epochs:
                argv += ['--max_epochs', str(args.pretrain_max_epochs)]
            if args.pretrain_batch_size:
                argv += ['--batch_size', str(args.pretrain_batch_size)]
            if args.pretrain_edition:
                argv += ['--edition', args.pretrain_edition]
            runs.append((f"{name} pretrain", out, {'model': name, 'pretrain': argv[1:]}, argv))
    return runs


def done_elsewhere(args, key, out, made_with, record):
    """Whether a pretraining whose params are not here (made on another machine: params
    are not committed, grid.json and the predictions are) has every finetuning and
    evaluation this command plans for it done with these settings. One that is not is
    pretrained again, and its runs made again from the new params."""
    entry = record.get(key, {})
    if 'params_md5' not in entry:
        return False
    if entry['made_with'] != made_with:
        raise files.UserError(
            f"{out} was made with other settings (grid.json): "
            f"{records.differences(entry['made_with'], made_with)}. Use another --outdir"
        )
    name, variant = made_with['model'], made_with['pretrain'][0]
    return runs_done(args, (out, name, variant, VARIANT_FLAGS.get(variant, []),
                            entry['params_md5']), record)  # fmt: skip


def runs_done(args, model, record):
    """Whether every finetuning and evaluation this command plans for `model` (model_of's
    tuple) is recorded with these settings, its predictions here."""
    for run_key, prefix, run_made_with, _ in planned_runs(args, [model]):
        run = record.get(run_key, {})
        if run.get('made_with') != run_made_with or 'dev_correct' not in run:
            return False
        if not all(os.path.exists(prefix + p) for p in ('.dev.predictions', '.test.predictions')):
            return False
    return True


def pretrain_all(args, pretrainings, record, save):
    """Runs the pretrainings whose params are missing, --jobs processes at once, each a
    group of up to --share runs of one variant (group_runs): one run as run.py, several as
    machinery/shared_runs.py, its output in a .log beside the params; yields each params
    file as it is written (those that existed first). On several GPUs each process gets
    a GPU of its own (gpu_for). A stop (Ctrl-C, SIGTERM) reaches the running ones once,
    from here (stop_process), and they save their resumable states; the same command then
    resumes them. One that ended before the stop reached it (while this generator waited
    on its caller) is recorded then, for the same command skips its params as written."""
    code, machine = records.commit(), devices.describe(args.device)
    missing = []
    for key, out, made_with, argv in pretrainings:
        if os.path.exists(out) and key in record:
            print(f"== {key}: {out} exists, skipped")
            yield out
        else:
            if os.path.exists(out):
                print(f"== {key}: {out} has no record in grid.json: pretrained again")
            record[key] = {'made_with': made_with, 'commit': code, 'machine': machine}
            missing.append((key, out, argv))
    save()
    waiting = group_runs(missing, args.share)
    gpus = visible_gpus(args.device)
    running = {}  # process -> (group, log, start, slot)

    def start_waiting():
        while waiting and len(running) < args.jobs:
            group = waiting.pop(0)
            slot = min(set(range(args.jobs)) - {r[3] for r in running.values()})
            command, log_path = group_command(group)
            env = gpu_for(slot, gpus)
            where = f" (GPU {env['CUDA_VISIBLE_DEVICES']})" if env else ""
            keys = ', '.join(key for key, _, _ in group)
            print(f"== {keys}{where}: {' '.join(command[1:])}", flush=True)
            log = open(log_path, 'w', encoding='utf-8')
            process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                       env={**os.environ, **env} if env else None,
                                       **process_options())  # fmt: skip
            running[process] = (group, log, time.time(), slot)

    try:
        start_waiting()
        while running:
            done = next((p for p in running if p.poll() is not None), None)
            if done is None:
                time.sleep(0.5)
                continue
            group, log, start, _ = running.pop(done)
            log.close()
            if done.returncode != 0:
                keys = ', '.join(key for key, _, _ in group)
                raise files.UserError(
                    f"{keys}: {'run.py' if len(group) == 1 else 'shared_runs.py'} ended with "
                    f"status {done.returncode}; its output is in {log.name}"
                )
            record_written(record, group, log.name, start, len(running) + 1)
            save()
            start_waiting()  # the next pretrainings go on while this one's are finetuned
            for _, out, _ in group:
                yield out
    finally:
        for process in running:
            stop_process(process)
        for process, (group, log, start, _) in running.items():
            try:
                process.wait(timeout=120)
            except subprocess.TimeoutExpired:
                process.kill()
            log.close()
            if process.returncode == 0:  # it ended before the stop: its params are written
                record_written(record, group, log.name, start, len(running))
                save()


def record_written(record, group, log, start, at_once):
    """Each of a group's entries given what its finished process wrote: its params' md5,
    its seconds (from its start to its log's last line), how many processes ran at once,
    how many runs shared its process and its final loss (its params' done line, run.py's
    or one of shared_runs.py's, in the log)."""
    with open(log, encoding='utf-8') as f:
        said = f.read()
    seconds = os.path.getmtime(log) - start
    for key, out, _ in group:
        entry = record[key]
        entry['params_md5'] = files.md5(out)
        entry['pretrain_seconds'] = seconds
        entry['at_once'] = at_once  # processes
        entry['shared'] = len(group)  # runs in its process
        loss = re.findall(rf'final loss ([\d.]+); params written to {re.escape(out)}$',
                          said, re.M)  # fmt: skip
        entry['final_loss'] = float(loss[-1]) if loss else None
        print(f"== {key}: written in {seconds:.0f} s", flush=True)


# Set in a job of research/slurm_grid.py, where Slurm itself signals every process of the
# job: a preemption's or a requeue's SIGTERM reaches each pretraining process directly.
IN_SLURM_JOB = False


def process_options():
    """How a pretraining process starts. In a session of its own, so that grid.py gives it
    the one stop it gets (stop_process): a terminal's Ctrl-C reaches the foreground
    process group only. In a Slurm job, in grid.py's group, where Slurm's signals reach
    it (whichever way the cluster tracks a job's processes), with the time limit's early
    warning (SIGUSR2, which slurm_grid.py answers by asking for a requeue) ignored."""
    if IN_SLURM_JOB:
        return {'preexec_fn': lambda: signal.signal(signal.SIGUSR2, signal.SIG_IGN)}
    return {'start_new_session': True}


def stop_process(process):
    """Ctrl-C for one pretraining process, which then saves its state after the step and
    ends. It runs in a session of its own (start_new_session), so this is the one stop it
    gets: a terminal's Ctrl-C, or `timeout -s INT`, signals grid.py's process group, and a
    run that gets a second Ctrl-C stops at once, without saving. In a Slurm job, Slurm has
    signalled it itself. On Windows a process has no SIGINT of its own, and the console's
    Ctrl-C has reached every process in it."""
    if process.poll() is None and os.name != 'nt' and not IN_SLURM_JOB:
        process.send_signal(signal.SIGINT)


@contextlib.contextmanager
def sigterm_as_ctrl_c():
    """SIGTERM (a preempted VM, a scheduler, `timeout`) stops grid.py as Ctrl-C does, so
    that its pretraining processes are told to save their states (stop_process)."""
    handler = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, handler)


def group_runs(pretrainings, share):
    """[(key, params file, run.py argv)] in groups of up to `share` runs of one variant, in
    the order their first runs come (every variant's first seeds before any later ones)."""
    groups, open_group = [], {}
    for item in pretrainings:
        variant = item[2][1]
        group = open_group.get(variant)
        if group is None or len(group) == share:
            group = open_group[variant] = []
            groups.append(group)
        group.append(item)
    return groups


def group_command(group):
    """(command, log file) of a group: run.py for one run, shared_runs.py for several
    (run.py's argv less --seed, with each run's seed and params file), --resume where a
    run left a state."""
    resuming = ['--resume'] if any(os.path.exists(out + '.resume') for _, out, _ in group) else []
    if len(group) == 1:
        _, out, argv = group[0]
        command = [sys.executable, os.path.join(import_paths.ROOT, 'src', 'run.py'), *argv,
                   '--writing_params_path', out, *resuming]  # fmt: skip
        return command, out.removesuffix('.params') + '.log'
    argv = group[0][2]
    at = argv.index('--seed')
    seeds = [a[2][at + 1] for a in group]
    outs = [out for _, out, _ in group]
    command = [sys.executable, os.path.join(import_paths.ROOT, 'src', 'machinery',
                                            'shared_runs.py'),
               *argv[:at], *argv[at + 2:], '--seeds', *seeds, '--writing_params_paths', *outs,
               *resuming]  # fmt: skip
    first = outs[0].removesuffix('.params').removesuffix('.pretrain')
    log = f"{first.rpartition('.s')[0]}.s{'+'.join(seeds)}.pretrain.log"
    return command, log


def visible_gpus(device):
    """The GPUs a process may be given: CUDA_VISIBLE_DEVICES's entries, else every GPU
    torch counts; none off CUDA."""
    if device != 'cuda':
        return []
    visible = os.environ.get('CUDA_VISIBLE_DEVICES')
    if visible is not None:
        return [g for g in visible.split(',') if g.strip()]
    return [str(i) for i in range(torch.cuda.device_count())]


def gpu_for(slot, gpus):
    """The environment of the process in --jobs slot `slot`: on several GPUs, one of its
    own (slots beyond the GPUs share them in turn); else nothing changed."""
    if len(gpus) < 2:
        return {}
    return {'CUDA_VISIBLE_DEVICES': gpus[slot % len(gpus)]}


# --- The report ---------------------------------------------------------------------------


def finished(record):
    """{(model, method): [entry, ...]} of the runs with a dev accuracy, a model's methods
    together, in record order."""
    groups = {}
    for entry in record.values():
        if 'dev_correct' in entry and entry.get('dev_total'):
            made_with = entry['made_with']
            groups.setdefault((made_with['model'], made_with['method']), []).append(entry)
    models = list(dict.fromkeys(model for model, _ in groups))
    return dict(sorted(groups.items(), key=lambda item: models.index(item[0][0])))


def pretraining_seeds(groups):
    """{(recipe, method): {model: [accuracy, ...]}} of the recipes pretrained with two or
    more seeds: models named RECIPE (the default seed) and RECIPE.sN, as perceiver,
    perceiver.s1 and perceiver.s2 are."""
    recipes = {}
    for (model, method), entries in groups.items():
        recipes.setdefault((recipe_of(model), method), {})[model] = [accuracy(e) for e in entries]
    return {key: models for key, models in recipes.items() if len(models) > 1}


def recipe_of(model):
    """perceiver.s1 -> perceiver: a model pretrained with another seed belongs to its recipe."""
    match = re.fullmatch(r'(.+)\.s\d+', model)
    return match.group(1) if match else model


def accuracy(entry):
    return 100 * entry['dev_correct'] / entry['dev_total']


def mean_sd(values, fmt='{:.1f}'):
    if len(values) < 2:
        return fmt.format(values[0]) if values else "-"
    return f"{fmt.format(statistics.mean(values))} ± {fmt.format(statistics.stdev(values))}"


def figure(value):
    return '-' if value is None else f'{value:.1f}'


def between_within(models):
    """(sd of the pretrainings' mean accuracies, sd of the finetuning seeds pooled over the
    pretrainings: sqrt(sum((n_i - 1) var_i) / sum(n_i - 1)), sd of the pretraining seed alone).

    The pretrainings' means differ by the pretraining seed and by finetuning noise, whose
    share of their variance is within^2 / n. The last figure takes it out, as a one-way
    random-effects analysis of variance does: sqrt(max(0, (MSB - MSW) / n0)), where
    MSB = sum(n_i (m_i - m)^2) / (k - 1) over the k pretrainings with means m_i about the mean
    m of all runs, MSW = within^2 and n0 = (N - sum(n_i^2) / N) / (k - 1), which is n when
    every pretraining has n runs. None without two runs of some pretraining."""
    means = [statistics.mean(values) for values in models.values()]
    between = statistics.stdev(means)
    spread = [(len(v) - 1, statistics.variance(v)) for v in models.values() if len(v) > 1]
    freedom = sum(n for n, _ in spread)
    if not freedom:
        return between, None, None
    within = math.sqrt(sum(n * var for n, var in spread) / freedom)
    sizes = [len(values) for values in models.values()]
    total, k = sum(sizes), len(sizes)
    grand = sum(n * m for n, m in zip(sizes, means)) / total
    msb = sum(n * (m - grand) ** 2 for n, m in zip(sizes, means)) / (k - 1)
    n0 = (total - sum(n * n for n in sizes) / total) / (k - 1)
    return between, within, math.sqrt(max(0.0, (msb - within**2) / n0))


def table(record):
    groups = finished(record)
    machines = sorted({e.get('machine', '?') for entries in groups.values() for e in entries})
    lines = [
        '# Finetuning grid',
        '',
        f"Machine: {'; '.join(machines)}. Dev accuracy in %: mean ± sample standard deviation "
        f"over the seeds, then every run as seed: accuracy. (The test inputs have no places: "
        f"their predictions are written, not scored.)",
        '',
        '| model | method | trainable parameters | runs | dev accuracy | every run '
        '| finetuning time |',
        '|---|---|---|---|---|---|---|',
    ]
    for (model, method), entries in groups.items():
        trainable = {e['trainable'] for e in entries if 'trainable' in e}
        seconds = [e['finetune_seconds'] for e in entries if 'finetune_seconds' in e]
        every = ', '.join(f"{e['made_with']['seed']}: {accuracy(e):.1f}" for e in entries)
        lines.append(
            f"| {model} | {method} | {', '.join(f'{t:,}' for t in sorted(trainable))} | "
            f"{len(entries)} | {mean_sd([accuracy(e) for e in entries])} | {every} | "
            f"{run.format_seconds(statistics.mean(seconds)) if seconds else '-'} |"
        )
    seeds = pretraining_seeds(groups)
    if seeds:
        lines += [
            '',
            '## Pretraining seed and finetuning seed',
            '',
            "Models pretrained by the same commands with other seeds (RECIPE.sN beside RECIPE). "
            "Between pretrainings: the sample standard deviation of each pretraining's mean; "
            "within: the finetuning seeds' standard deviation, pooled over the pretrainings; "
            "pretraining seed alone: the between figure less the finetuning noise the "
            "pretrainings' means carry (a one-way random-effects estimate).",
            '',
            '| recipe | method | pretrainings | runs | dev accuracy | sd between pretrainings '
            '| sd within (finetuning seeds) | sd of the pretraining seed alone |',
            '|---|---|---|---|---|---|---|---|',
        ]
        for (recipe, method), models in seeds.items():
            every = [a for values in models.values() for a in values]
            between, within, alone = between_within(models)
            lines.append(
                f"| {recipe} | {method} | {len(models)} | {len(every)} | {mean_sd(every)} | "
                f"{between:.1f} | {figure(within)} | {figure(alone)} |"
            )
    return '\n'.join(lines) + '\n'


CSV_COLUMNS = ['model', 'method', 'seed', 'trainable', 'parameters', 'dev_correct', 'dev_total',
               'dev_accuracy', 'finetune_seconds', 'commit']  # fmt: skip


def rows_csv(record):
    out = io.StringIO()
    writer = csv.writer(out, lineterminator='\n')
    writer.writerow(CSV_COLUMNS)
    for entries in finished(record).values():
        for e in entries:
            m = e['made_with']
            writer.writerow([m['model'], m['method'], m['seed'], e.get('trainable', ''),
                             e.get('parameters', ''), int(e['dev_correct']), int(e['dev_total']),
                             f"{accuracy(e):.1f}", f"{e.get('finetune_seconds', 0):.1f}",
                             e.get('commit') or ''])  # fmt: skip
    return out.getvalue()


def plot_grid(record, out):
    """Dev accuracy against trainable parameters: a point per run, a colour per recipe (its
    pretraining seeds together), a marker per kind of method, and a line per recipe through
    the means of LoRA's ranks and full finetuning (adapters are another kind: points only)."""
    plt = plot.pyplot('--plot')
    markers = {'lora': 'o', 'adapter': '^', 'full': 's'}
    by_recipe = {}
    for (model, method), entries in finished(record).items():
        entries = [e for e in entries if 'trainable' in e]
        if entries:
            by_recipe.setdefault(recipe_of(model), {}).setdefault(method, []).extend(entries)
    fig, ax = plt.subplots(figsize=(6.5, 4))
    kinds_run = set()  # the legend names the kinds of method that were run, no others
    for i, (recipe, methods) in enumerate(by_recipe.items()):
        color = f'C{i}'
        on_line = []
        for method, entries in methods.items():
            kind = method.split(':')[0]
            kinds_run.add(kind)
            accuracies = [accuracy(e) for e in entries]
            ax.scatter([e['trainable'] for e in entries], accuracies, s=14, alpha=0.6,
                       color=color, marker=markers.get(kind, 'x'))  # fmt: skip
            if kind != 'adapter':
                on_line.append((entries[0]['trainable'], statistics.mean(accuracies)))
        on_line.sort()
        xs, ys = zip(*on_line) if on_line else ((), ())
        ax.plot(xs, ys, color=color, label=recipe)
    for kind, marker in markers.items():
        if kind in kinds_run:
            ax.scatter([], [], color='gray', marker=marker, label=kind)
    ax.set_xscale('log')
    ax.set_xlabel('trainable parameters (log scale)')
    ax.set_ylabel('dev accuracy (%)')
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize='small', ncol=2)
    fig.tight_layout()
    fig.savefig(out, dpi=120)


def main(argv=None):
    args = parse_args(argv)
    # in a Slurm job the grid's own command (or Slurm's requeue) continues, not the job's
    again = "the grid's --cluster slurm command, which submits it again" if IN_SLURM_JOB else None
    with records.one_line_stops('research/grid.py', argv, again), sigterm_as_ctrl_c():
        distributed.one_process('grid.py')
        checks.check_reports(args, 'plot')
        if args.cluster == 'slurm':
            import slurm_grid

            slurm_grid.check_args(args)  # and --device and --precision as the jobs have them
        else:
            device = args.device = devices.pick_device(args.device)
            # recorded as what they are here, not as 'auto'
            args.precision = devices.training_precision(args.precision, device)
        if args.pretrain and args.share > 1 and args.precision != 'fp32':
            raise files.UserError(
                f"--share {args.share}: " + shared_runs.PRECISION_REFUSED.format(args.precision)
            )
        if not (args.pretrained or args.pretrain):
            record = records.read_record(os.path.join(args.outdir, 'grid.json'))
        elif args.cluster == 'slurm':
            record = slurm_grid.run_all(args)
        else:
            record = run_all(args)
        if not finished(record):
            raise files.UserError(
                f"{args.outdir}: no finished runs yet (give --pretrained or --pretrain)"
            )
        report = write_tables(args, record)
    print()
    print(report)


def write_tables(args, record):
    """grid.md, grid.csv (and --plot's picture) of the finished runs; returns grid.md."""
    report = table(record)
    files.atomic_write(os.path.join(args.outdir, 'grid.md'), lambda f: f.write(report.encode()))
    rows = rows_csv(record)
    files.atomic_write(os.path.join(args.outdir, 'grid.csv'), lambda f: f.write(rows.encode()))
    if args.plot:
        plot_grid(record, args.plot)
    return report


if __name__ == '__main__':
    main()
