"""A training run's resumable state: what lets an interrupted run (Ctrl-C, a preempted
VM's SIGTERM, a session that ends) continue exactly where it stopped, to the same result
as a run that was never interrupted.

This module makes the trainer's state (state_of), writes it (save), restores it
(restore), reads its file, and catches the signals. load() checks, before anything is
restored, that the state is this run's: anything else is one UserError line, before any
step. The state holds tensors and plain values only (PARTS), so that it loads with
weights_only=True and cannot run code. The Stopper turns Ctrl-C and SIGTERM into a stop
after the current step, whose state the trainer saves.
"""

import math
import os
import random
import signal
import threading
import time

import numpy as np
import torch

from machinery import distributed, files, params_files

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
# Parts a state may lack (states saved before they existed), and the type of each.
OPTIONAL_PARTS = {
    'batch_seed': int,  # batches built ahead (batch_producer.py): the run's seed for them
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
    """Ctrl-C or SIGTERM (a preempted VM) during training asks the run to stop: asked() then
    says so, and the trainer saves its state after the step and stops. A second Ctrl-C
    stops at once, except under torchrun, which passes the terminal's Ctrl-C on to its
    processes a second time (and kills them itself if they linger). Used as a context
    manager around the training loop, where the signal handlers are installed, for a run
    that keeps a state (resume_path); on leaving it, a stop signal received is passed on
    to a handler of the caller's own that it replaced (pytest's, in the tests)."""

    def __init__(self, resume_path, distributed=False):
        self.enabled = resume_path is not None
        self.distributed = distributed
        self.signal = None  # the stop asked for (a signal's number), if any
        self.received = None  # the stop signal this one's handler received, if any
        self.handlers = {}

    def __enter__(self):
        self.received = None
        if self.enabled and threading.current_thread() is threading.main_thread():
            signals = (signal.SIGINT, signal.SIGTERM)
            self.handlers = {s: signal.signal(s, self.ask_to_stop) for s in signals}
        return self

    def __exit__(self, *exception):
        for signum, handler in self.handlers.items():
            signal.signal(signum, handler)
        # the state is saved: a handler of someone's own that this one replaced (a test
        # runner's, a program's that runs training inside it) hears of the stop too; Python's
        # default ones are left out, as the run's own stop has answered them
        replaced = self.handlers.get(self.received)
        if callable(replaced) and replaced is not signal.default_int_handler:
            replaced(self.received, None)

    def ask_to_stop(self, signum, frame):
        if self.signal is not None and not self.distributed:
            raise KeyboardInterrupt
        self.signal = self.received = signum

    def asked(self):
        return self.signal is not None


def kept(path):
    """What a run that stops on an error leaves to continue from."""
    if path and os.path.exists(path):
        return f"the last good state is kept in {path}"
    return "no earlier state had been saved yet"


def load(path, trainer):
    """Restore into `trainer` the state in `path`, after checking that it is this run's."""
    where = f"--resume: {path}"
    state = read_state(path, where)
    check_state_fits(state, settings_of(trainer), trainer.model.state_dict(), where)
    try:
        restore(trainer, state)
        check_optimizer(trainer.optimizer)
    except DAMAGE as e:
        detail = str(e).strip().split('\n')[0] or type(e).__name__
        raise files.UserError(f"{where}: damaged ({detail})")
    print(f"resuming from {path}: epoch {state['epoch'] + 1}, step {state['step']}")


def save(trainer):
    """The trainer's resumable state, written to its config.resume_path by process 0
    (under torchrun every process calls it, for its random state)."""
    state = state_of(trainer)
    if trainer.rank == 0:
        files.atomic_save(state, trainer.config.resume_path)


def settings_of(trainer):
    """What a run that resumes the trainer's state must share with it."""
    return {
        'config': {k: getattr(trainer.config, k) for k in SETTINGS},
        'dataset_len': len(trainer.train_dataset),
        'processes': trainer.world_size,
    }


def state_of(trainer):
    """Everything that continues the trainer's run exactly: the model, the optimizer,
    fp16's loss scale, where the run is, and every random state: Python's and numpy's (the
    span corruption) and each process's torch state (its dropout masks), and the seed of
    batches built ahead. Tensors and plain values only."""
    python_rng, numpy_rng = random_states()
    return {
        'model': params_files.cpu_state_dict(trainer.model),
        'optimizer': uncaptured(trainer.optimizer.state_dict()),
        'scaler': trainer.scaler.state_dict(),  # fp16's loss scale; empty otherwise
        'epoch': trainer.epoch,
        'step': trainer.step,
        'tokens': trainer.tokens,
        'elapsed': trainer.elapsed,
        **settings_of(trainer),
        'python_rng': python_rng,
        'numpy_rng': numpy_rng,
        'process_rngs': distributed.gather(torch_rng_state(trainer.device)),
        **({} if trainer.batch_seed is None else {'batch_seed': trainer.batch_seed}),
    }


def uncaptured(optimizer_state):
    """An optimizer's state_dict as an uncaptured run keeps it: the learning rate a number
    and not capturable (cuda_graphs.py makes them a device tensor and capturable), so that
    a state saved with --cuda_graph resumes without it, on any device."""
    for group in optimizer_state['param_groups']:
        if torch.is_tensor(group['lr']):
            group['lr'] = group['lr'].item()
        group['capturable'] = False
    return optimizer_state


def restore(trainer, state):
    """Puts the trainer where state_of(trainer) found it."""
    trainer.model.load_state_dict(state['model'])
    trainer.optimizer.load_state_dict(state['optimizer'])
    if state['scaler']:
        trainer.scaler.load_state_dict(state['scaler'])
    trainer.epoch, trainer.step = state['epoch'], state['step']
    trainer.tokens, trainer.elapsed = state['tokens'], state['elapsed']
    random.setstate(state['python_rng'])
    np.random.set_state(state['numpy_rng'])
    set_torch_rng_state(state['process_rngs'][trainer.rank], trainer.device)
    trainer.batch_seed = state.get('batch_seed')


def random_states():
    """Python's and numpy's random states: what span corruption draws from."""
    return random.getstate(), numpy_rng_state()


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
    for key, kind in {**PARTS, **OPTIONAL_PARTS}.items():
        missing_and_optional = key in OPTIONAL_PARTS and key not in state
        if not isinstance(state.get(key), kind) and not missing_and_optional:
            found = 'nothing' if key not in state else f"a {type(state[key]).__name__}"
            raise files.UserError(f"{where}: not a resumable state ({key!r} is {found})")
    return state


def check_state_fits(state, current, model_state, where):
    """The state was saved by a run with this run's settings (current: settings_of),
    stopped where this run can continue, with a model of model_state's shapes."""
    saved = {
        'finetune_method': 'full',  # states saved before there were other methods
        **state['config'],
        'examples': state['dataset_len'],
        'processes': state['processes'],
    }
    settings = {
        **current['config'],
        'examples': current['dataset_len'],
        'processes': current['processes'],
    }
    differ = [
        f"{k} {saved.get(k)} (this run: {v})" for k, v in settings.items() if saved.get(k) != v
    ]
    if differ:
        raise files.UserError(
            f"{where} was saved by a run with other settings: {', '.join(differ)}. "
            f"To continue that run, give it those settings again; to start afresh, "
            f"leave out --resume (or delete the file)"
        )
    config = current['config']
    steps_per_epoch = math.ceil(current['dataset_len'] / config['batch_size'])
    if not (0 <= state['epoch'] <= config['max_epochs'] and 0 <= state['step'] <= steps_per_epoch):
        raise files.UserError(
            f"{where}: damaged (epoch {state['epoch']}, step {state['step']} "
            f"do not exist in this run)"
        )
    shapes = {name: tensor.shape for name, tensor in model_state.items()}
    params_files.check_state_dict(state['model'], shapes, where, "this run's model")


def check_optimizer(optimizer):
    """Each moment the loaded optimizer holds has its parameter's shape: a damaged state
    can load and not fit."""
    for group in optimizer.param_groups:
        for p in group['params']:
            for name, value in optimizer.state[p].items():
                if torch.is_tensor(value) and value.dim() and value.shape != p.shape:
                    raise ValueError(
                        f"optimizer {name} of shape {tuple(value.shape)} for a parameter of "
                        f"shape {tuple(p.shape)}"
                    )


def torch_rng_state(device):
    """This process's torch random states (its dropout masks): the CPU's, every visible
    GPU's, and Apple's GPU's when it trains there."""
    rng = {
        'torch': torch.get_rng_state(),
        'cuda': torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }
    if device == 'mps':
        rng['mps'] = torch.mps.get_rng_state()
    return rng


def set_torch_rng_state(rng, device):
    torch.set_rng_state(rng['torch'])
    if rng['cuda'] and torch.cuda.is_available():
        # each GPU present that the state has one for: a machine with fewer (or more)
        # GPUs than the saving one resumes; a single process draws on its first only
        for index, state in enumerate(rng['cuda'][: torch.cuda.device_count()]):
            torch.cuda.set_rng_state(state, index)
    if 'mps' in rng and device == 'mps':
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
