"""A training run's resumable state: what lets an interrupted run (Ctrl-C, a preempted
VM's SIGTERM, a session that ends) continue exactly where it stopped, to the same result
as a run that was never interrupted.

The state holds the model and the optimizer (with fp16's loss scale), where the run
stopped, the schedule's token count, and every random state: Python's and numpy's (the
span corruption) and each process's torch state (its dropout masks). It holds tensors and
plain Python values only, so that it loads with weights_only=True and cannot run code.
Before anything is restored, load_state checks that the state is this run's: anything
else is one UserError line, before any step.
"""

import math
import random

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
    config = run.config
    where = f"--resume: {config.resume_path}"
    if_trusted = (
        "If you trust the file (an earlier version of this code wrote it), convert it "
        "in place with: "
        + files.convert_command(UPGRADE_OLD_STATE, config.resume_path, config.resume_path)
    )
    state = files.load_weights_only(config.resume_path, where, 'resumable state', if_trusted)
    if not isinstance(state, dict):
        raise files.UserError(f"{where}: not a resumable state (it holds a {type(state).__name__})")
    for key, kind in PARTS.items():
        if not isinstance(state.get(key), kind):
            found = 'nothing' if key not in state else f"a {type(state[key]).__name__}"
            raise files.UserError(f"{where}: not a resumable state ({key!r} is {found})")
    saved = {**state['config'], 'examples': state['dataset_len'], 'processes': state['processes']}
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
    try:
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
    except (
        ValueError,
        TypeError,
        RuntimeError,
        KeyError,
        IndexError,
        AttributeError,
        OverflowError,
    ) as e:
        detail = str(e).strip().split('\n')[0] or type(e).__name__
        raise files.UserError(f"{where}: damaged ({detail})")
    run.model.load_state_dict(state['model'])
    run.tokens, run.elapsed = state['tokens'], state['elapsed']
    print(f"resuming from {config.resume_path}: epoch {state['epoch'] + 1}, step {state['step']}")
    return state['epoch'], state['step']


def numpy_rng_state():
    """numpy's global random state as plain values: the legacy tuple with its key array as a
    list of ints (np.random.set_state takes either)."""
    name, keys, pos, has_gauss, cached_gaussian = np.random.get_state()
    return name, keys.tolist(), pos, has_gauss, cached_gaussian
