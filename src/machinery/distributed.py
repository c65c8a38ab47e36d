"""Training in several processes under torchrun, one per GPU (or several on the CPU).

Each process computes the loss of its share of every batch's rows (shard_rows) and
DistributedDataParallel averages the gradients, so the steps are those of one process;
the processes agree on when to stop (any_process), and process 0 alone writes files.
trainer.py uses this; run.py checks the launch, joins the process group and ends with it.
"""

import inspect
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn import functional as F

from machinery import devices
from machinery.files import UserError
from machinery.packing import target_count, target_lengths

# How many processes share each batch (torchrun sets WORLD_SIZE; each runs the script).
PROCESSES = int(os.environ.get('WORLD_SIZE', 1))


def rank_and_size():
    """(this process's rank, the number of processes): (0, 1) outside torchrun."""
    return (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)


def check_launch(function, device):
    """Under torchrun: the phase and device must suit several processes."""
    if PROCESSES == 1:
        return
    if function == 'evaluate':
        raise UserError("evaluate runs in one process: use python, not torchrun")
    if device == 'mps':
        raise UserError(
            "torchrun: several processes need CUDA GPUs or the CPU (--device cpu), not MPS"
        )
    if device == 'cuda' and int(os.environ['LOCAL_RANK']) >= torch.cuda.device_count():
        raise UserError(
            f"torchrun started more processes per node than the "
            f"{torch.cuda.device_count()} GPUs here (--nproc_per_node)"
        )


def one_process(script):
    """A script of many runs (reproduce.py, grid.py) refuses torchrun at its start: each
    process would train every run and write the same files."""
    if PROCESSES > 1:
        raise UserError(
            f"{script} runs in one process; for several GPUs, run the handout's "
            "pretrain/finetune commands with torchrun (see README)"
        )


# DistributedDataParallel's switch for copying process 0's buffers before every forward:
# torch 2.13 names it forward_sync_buffers, and warns once a process about the old name
NO_BUFFER_SYNC = (
    'forward_sync_buffers'
    if 'forward_sync_buffers' in inspect.signature(nn.parallel.DistributedDataParallel).parameters
    else 'broadcast_buffers'
)


def wrap(model, device, rank):
    """The model under DistributedDataParallel, which also copies process 0's parameters to
    every process; then each process gets its own dropout masks."""
    ddp = nn.parallel.DistributedDataParallel(
        model,
        **{NO_BUFFER_SYNC: False},  # the buffers are constant masks
        device_ids=[torch.cuda.current_device()] if device == 'cuda' else None,
    )
    if rank > 0:
        torch.manual_seed((torch.initial_seed() + rank) % 2**63)
    return ddp


def shard_rows(lengths, rank, world_size):
    """This process's rows of a batch: every world_size-th by length, so that each process
    gets a similar share of the work, and its share of the loss (0 for a process left
    without rows, which still joins the gradient reduction with a stand-in row)."""
    rows = lengths.argsort(descending=True, stable=True)[rank::world_size]
    if len(rows) == 0:
        return rows.new_zeros(1), 0.0
    return rows, 1.0


def shard_loss(trainer, x, y):
    """The trainer's loss of the CPU batch x, y under torchrun: this process's rows' summed
    cross-entropy (GPT.forward's, summed) over the whole batch's count of targets, times
    world_size, as DDP averages the gradients."""
    lengths = target_lengths(y)  # (b,)
    rows, share = shard_rows(lengths, trainer.rank, trainer.world_size)
    n_targets = target_count(y) / trainer.world_size
    packing = trainer.packing(lengths[rows])
    x, y = trainer.to_device(x[rows], y[rows])
    with devices.autocast(trainer.device, trainer.config.precision):
        logits, _ = trainer.ddp(x, packing=packing)  # (N, vocab), or (b, T, vocab)
        targets = y.reshape(-1) if packing is None else packing.select(y)  # (N,)
        summed = F.cross_entropy(
            logits.reshape(-1, logits.size(-1)), targets, ignore_index=0, reduction='sum'
        )
        return summed / n_targets * share


def any_process(flag, device):
    """Whether flag is true in any process; every process must ask at the same step."""
    if not dist.is_initialized():
        return flag
    flag = torch.tensor([float(flag)], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def average(values, device):
    """values averaged over the processes (each one's loss is its share x world_size)."""
    if not dist.is_initialized():
        return values
    values = values.to(device)
    dist.all_reduce(values)
    return values / dist.get_world_size()


def gather(value):
    """[value of each process], in rank order: [value] outside torchrun."""
    if not dist.is_initialized():
        return [value]
    values = [None] * dist.get_world_size()
    dist.all_gather_object(values, value)
    return values


def init_distributed(device):
    """Under torchrun: join the other processes, one per GPU (nccl) or CPU processes (gloo)."""
    if device == 'cuda':
        torch.cuda.set_device(int(os.environ['LOCAL_RANK']))
    dist.init_process_group('nccl' if device == 'cuda' else 'gloo')


def finish(status):
    """End a process that joined a process group: leave the group, then exit with `status`
    at once, without the interpreter's shutdown. gloo's worker threads free each finished
    operation's tensors a moment after the operation returns, taking the GIL to do so; a
    shutdown under way by then ends such a thread, and the process aborts (SIGABRT,
    "terminate called without an active exception") after all its work is done. Outside a
    process group this returns, and the caller ends as usual."""
    if not dist.is_initialized():
        return
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
