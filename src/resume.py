"""A training run's resumable state: what lets an interrupted run (Ctrl-C, a preempted
VM's SIGTERM, a session that ends) continue exactly where it stopped, to the same result
as a run that was never interrupted.

The state holds the model and the optimizer (with fp16's loss scale), where the run
stopped, the schedule's token count, and every random state: Python's and numpy's (the
span corruption) and each process's torch state (its dropout masks). It holds tensors and
plain Python values only, so that it loads with weights_only=True and cannot run code.
Before anything is restored, load_state checks that the state is this run's: anything
else is one UserError line, before any step. The trainer's Stopper decides when the state
is saved: at an epoch's end once save_every_s has passed, and when Ctrl-C or SIGTERM asks
the run to stop.
"""

import math
import os
import random
import signal
import threading
import time

import numpy as np
import torch
import torch.distributed as dist

import files
import params_files

# What must match between an interrupted run and the run that resumes it.
SETTINGS = (
    'max_epochs',
    'batch_size',
    'learning_rate',
    'betas',
    'grad_norm_clip',
    'weight_decay',
    'lr_decay',
    'warmup_tokens',
    'final_tokens',
    'precision',
    'finetune_method',
)

# The parts of a resumable state, and the type of each.
PARTS = {
    'model': dict,
    'optimizer': dict,
    'scaler': dict,
    'epoch': int,
    'step': int,
    'tokens': int,
    'elapsed': (int, float),
    'config': dict,
    'dataset_len': int,
    'processes': int,
    'python_rng': tuple,
    'numpy_rng': tuple,
    'process_rngs': list,
}
# For a state refused for holding objects: states saved before PARTS kept numpy's random
# state as an ndarray, and torch's random state beside it; this turns them into what PARTS holds.
UPGRADE_OLD_STATE = (
    '{**s, "numpy_rng": tuple(getattr(x, "tolist", lambda: x)() for x in s["numpy_rng"]), '
    '"scaler": {}, "processes": 1, '
    '"process_rngs": [{"torch": s["torch_rng"], "cuda": s["cuda_rng"]}]}'
)


class TrainingInterrupted(Exception):
    """Ctrl-C or SIGTERM stopped training after its resumable state was saved."""


class Stopper:
    """When a run (a Trainer) with a resume_path saves its state: at an epoch's end once
    save_every_s has passed since the last save, and after the step during which Ctrl-C
    or SIGTERM (a preempted VM) arrived, before it stops with TrainingInterrupted. A second
    Ctrl-C stops at once, except under torchrun, which passes the terminal's Ctrl-C on to
    its processes a second time (and kills them itself if they linger). Used as a context
    manager: the signal handlers are installed for the duration of the training loop."""

    def __init__(self, run, optimizer):
        self.run, self.optimizer = run, optimizer
        self.enabled = run.config.resume_path is not None
        self.signal = None  # the stop signal received, if any
        self.last_save = time.time()
        self.handlers = {}

    def __enter__(self):
        if self.enabled and threading.current_thread() is threading.main_thread():
            signals = (signal.SIGINT, signal.SIGTERM)
            self.handlers = {s: signal.signal(s, self.ask_to_stop) for s in signals}
        return self

    def __exit__(self, *exception):
        for signum, handler in self.handlers.items():
            signal.signal(signum, handler)

    def ask_to_stop(self, signum, frame):
        if self.signal is not None and self.run.ddp is None:
            raise KeyboardInterrupt
        self.signal = signum

    def after_step(self, epoch, step, logged):
        """Save and stop if a signal asked to; processes agree where they log."""
        run = self.run
        if (logged or run.ddp is None) and run.any_process(self.signal is not None):
            run.elapsed = time.time() - run.start_time
            run.log.flush(run.elapsed)
            save_state(run, epoch, step, self.optimizer)
            raise TrainingInterrupted(
                f"interrupted at epoch {epoch + 1}, step {step}; "
                f"state saved to {run.config.resume_path}"
            )

    def after_epoch(self, epoch):
        """Refresh the saved state if save_every_s has passed since the last save."""
        overdue = time.time() - self.last_save >= self.run.config.save_every_s
        if self.enabled and self.run.any_process(overdue):
            save_state(self.run, epoch + 1, 0, self.optimizer)
            self.last_save = time.time()

    def kept(self):
        """What a run that stops on an error leaves to continue from."""
        path = self.run.config.resume_path
        if path and os.path.exists(path):
            return f"the last good state is kept in {path}"
        return "no earlier state had been saved yet"


def save_state(run, epoch, step, optimizer):
    """Write the state of `run` (a Trainer) and its optimizer to run.config.resume_path,
    to continue at `step` of `epoch`. Under torchrun every process calls it, for its random
    state, and process 0 writes it."""
    config = run.config
    rng = {
        'torch': torch.get_rng_state(),
        'cuda': torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }
    if run.device == 'mps':
        rng['mps'] = torch.mps.get_rng_state()
    process_rngs = [rng]
    if run.ddp is not None:
        process_rngs = [None] * run.world_size
        dist.all_gather_object(process_rngs, rng)
    if run.rank > 0:
        return
    state = {
        'model': params_files.cpu_state_dict(run.model),
        'optimizer': optimizer.state_dict(),
        'scaler': run.scaler.state_dict(),  # fp16's loss scale; empty otherwise
        'epoch': epoch,
        'step': step,
        'tokens': run.tokens,
        'elapsed': run.elapsed,
        'config': {k: getattr(config, k) for k in SETTINGS},
        'dataset_len': len(run.train_dataset),
        'python_rng': random.getstate(),
        'numpy_rng': numpy_rng_state(),
        'processes': run.world_size,
        'process_rngs': process_rngs,  # each process's torch random state: its dropout stream
    }
    files.atomic_save(state, config.resume_path)


def load_state(run, optimizer):
    """Restore into `run` (a Trainer) and `optimizer` what save_state saved, after checking
    that it is this run's state. Returns the (epoch, step) to continue from."""
    where = f"--resume: {run.config.resume_path}"
    state = read_state(run.config.resume_path, where)
    check_state_fits(state, run, where)
    try:
        restore(state, run, optimizer)
    except DAMAGE as e:
        detail = str(e).strip().split('\n')[0] or type(e).__name__
        raise files.UserError(f"{where}: damaged ({detail})")
    run.model.load_state_dict(state['model'])
    run.tokens, run.elapsed = state['tokens'], state['elapsed']
    print(
        f"resuming from {run.config.resume_path}: epoch {state['epoch'] + 1}, step {state['step']}"
    )
    return state['epoch'], state['step']


# What restoring a damaged state raises (torch's and Python's own checks).
DAMAGE = (ValueError, TypeError, RuntimeError, KeyError, IndexError, AttributeError, OverflowError)


def read_state(path, where):
    """The state in `path`, loaded without running anything in it, with every part of PARTS."""
    if_trusted = (
        "If you trust the file (an earlier version of this code wrote it), convert it "
        "in place with: " + files.convert_command(UPGRADE_OLD_STATE, path, path)
    )
    state = files.load_weights_only(path, where, 'resumable state', if_trusted)
    if not isinstance(state, dict):
        raise files.UserError(f"{where}: not a resumable state (it holds a {type(state).__name__})")
    for key, kind in PARTS.items():
        if not isinstance(state.get(key), kind):
            found = 'nothing' if key not in state else f"a {type(state[key]).__name__}"
            raise files.UserError(f"{where}: not a resumable state ({key!r} is {found})")
    return state


def check_state_fits(state, run, where):
    """The state was saved by a run with this run's settings, stopped where this run can
    continue, with a model of this run's shapes."""
    config = run.config
    saved = {
        'finetune_method': 'full',  # states saved before there were other methods
        **state['config'],
        'examples': state['dataset_len'],
        'processes': state['processes'],
    }
    current = {
        **{k: getattr(config, k) for k in SETTINGS},
        'examples': len(run.train_dataset),
        'processes': run.world_size,
    }
    differ = [
        f"{k} {saved.get(k)} (this run: {v})" for k, v in current.items() if saved.get(k) != v
    ]
    if differ:
        raise files.UserError(
            f"{where} was saved by a run with other settings: {', '.join(differ)}. "
            f"To continue that run, give it those settings again; to start afresh, "
            f"leave out --resume (or delete the file)"
        )
    steps_per_epoch = math.ceil(len(run.train_dataset) / config.batch_size)
    if not (0 <= state['epoch'] <= config.max_epochs and 0 <= state['step'] <= steps_per_epoch):
        raise files.UserError(
            f"{where}: damaged (epoch {state['epoch']}, step {state['step']} "
            f"do not exist in this run)"
        )
    shapes = {name: tensor.shape for name, tensor in run.model.state_dict().items()}
    params_files.check_state_dict(state['model'], shapes, where, "this run's model")


def restore(state, run, optimizer):
    """The optimizer, the loss scale and every random state, as they were saved."""
    optimizer.load_state_dict(state['optimizer'])
    for group in optimizer.param_groups:
        for p in group['params']:
            for name, value in optimizer.state[p].items():
                if torch.is_tensor(value) and value.dim() and value.shape != p.shape:
                    raise ValueError(
                        f"optimizer {name} of shape {tuple(value.shape)} for a "
                        f"parameter of shape {tuple(p.shape)}"
                    )
    if state['scaler']:
        run.scaler.load_state_dict(state['scaler'])
    random.setstate(state['python_rng'])
    np.random.set_state(state['numpy_rng'])
    rng = state['process_rngs'][run.rank]  # this process's dropout stream
    torch.set_rng_state(rng['torch'])
    if rng['cuda'] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng['cuda'])
    if 'mps' in rng and run.device == 'mps':
        torch.mps.set_rng_state(rng['mps'])


def numpy_rng_state():
    """numpy's global random state as plain values: the legacy tuple with its key array as a
    list of ints (np.random.set_state takes either)."""
    name, keys, pos, has_gauss, cached_gaussian = np.random.get_state()
    return name, keys.tolist(), pos, has_gauss, cached_gaussian


def what_is_kept(path, continue_command):
    """What a run stopped at once (a second Ctrl-C) leaves behind, and how to go on."""
    if path and os.path.exists(path):
        saved = time.strftime('%H:%M:%S', time.localtime(os.path.getmtime(path)))
        return (
            f"interrupted; {path} keeps the state saved at {saved}. To continue from it: "
            f"{continue_command}"
        )
    return "interrupted; no resumable state was saved"
