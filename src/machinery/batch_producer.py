"""Training's batches built ahead in a producer process, the same batches in the same
order as the trainer builds them itself, bit for bit.

The span corruption draws from Python's and numpy's random generators (a student's may
draw from torch's CPU generator too), so the batches of a run form one stream of draws
that no second builder can share. One process builds them all, in order: a torch
DataLoader with a single worker, which starts from this process's random states instead
of its own seeds and builds every remaining batch of the run (all its epochs) without a
pause. Each batch comes with the random states after it was built, so that the
resumable state names exactly where the draws stand (adopt_states). The trainer copies
each batch to the GPU from pinned memory (devices.to_device).

The trainer uses it on CUDA, where a training step is shorter than building its batch
in the same process (devices.builds_batches_ahead), and only where nothing else draws
from those generators between batches (no test set).
"""

import functools
import math
import random
import signal

import numpy as np
import torch
from torch.utils.data import DataLoader

from machinery import resume

PREFETCH = 8  # batches built ahead of the one training takes


class RunBatches:
    """The example indices of every batch left in a run: batch `first_step` of
    `first_epoch` to the end of epoch max_epochs - 1, each epoch in the original loader's
    order (no shuffling), its last batch the shorter one."""

    def __init__(self, n_examples, batch_size, first_epoch, first_step, max_epochs):
        self.n, self.batch_size = n_examples, batch_size
        self.steps_per_epoch = math.ceil(n_examples / batch_size)
        self.first_epoch, self.first_step, self.max_epochs = first_epoch, first_step, max_epochs

    def steps(self):
        """The number, within its epoch, of each batch left."""
        for epoch in range(self.first_epoch, self.max_epochs):
            first = self.first_step if epoch == self.first_epoch else 0
            yield from range(first, self.steps_per_epoch)

    def __iter__(self):
        bs = self.batch_size
        for step in self.steps():
            yield list(range(step * bs, min((step + 1) * bs, self.n)))

    def __len__(self):
        epochs = max(0, self.max_epochs - self.first_epoch)
        return max(0, epochs * self.steps_per_epoch - self.first_step)


def random_states():
    """The generators a dataset draws from: Python's, numpy's and torch's on the CPU (as
    bytes, which pass between processes as they are, where a tensor would take a new
    block of shared memory)."""
    return (*resume.random_states(), torch.get_rng_state().numpy().tobytes())


def set_random_states(states, torch_too=True):
    python_rng, numpy_rng, torch_rng = states
    random.setstate(python_rng)
    np.random.set_state(numpy_rng)
    if torch_too:
        torch.set_rng_state(torch.frombuffer(bytearray(torch_rng), dtype=torch.uint8))


def start_worker(states, worker_id):
    """The worker's start: the trainer's random states, and Ctrl-C and SIGTERM left to the
    trainer (they reach the worker too, from a terminal or a VM that stops: the trainer
    finishes its step and saves its state, then ends the worker; a worker that died of
    them would stop the trainer at once instead)."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)
    set_random_states(states)


def stack_examples(examples):
    """A batch of (x, y) examples as the trainer stacks it, with the random states after
    it was built (in the worker, where the draws happen). The batch goes to the trainer
    as numpy arrays, through the worker's pipe, which measured faster than tensors in
    shared memory (a new block for each)."""
    x = torch.stack([x for x, _ in examples])  # (b, T)
    y = torch.stack([y for _, y in examples])  # (b, T)
    return x.numpy(), y.numpy(), random_states()


class BatchProducer:
    """Iterates over the (x, y) batches that remain of a run, built in a worker process
    from this process's random states as they are now; adopt_states() then puts this
    process's random states where building the batches taken so far leaves them.

    torch's CPU generator is the batches' where the model trains on a GPU; on the CPU,
    dropout draws from it too (between the batches), so there it stays this process's
    (a dataset that draws from it cannot be built ahead for CPU training)."""

    def __init__(self, dataset, batch_size, first_epoch, first_step, max_epochs, torch_rng=True):
        self.states, self.torch_rng = random_states(), torch_rng
        batches = RunBatches(len(dataset), batch_size, first_epoch, first_step, max_epochs)
        self.loader = DataLoader(
            dataset,
            batch_sampler=batches,
            num_workers=1,
            collate_fn=stack_examples,
            worker_init_fn=functools.partial(start_worker, self.states),
            prefetch_factor=PREFETCH,
            # its own generator: the loader's seeds are not drawn from torch's global one
            generator=torch.Generator(),
        )
        self.iterator = iter(self.loader) if len(batches) else iter(())

    def __iter__(self):
        return self

    def __next__(self):
        x, y, self.states = next(self.iterator)
        return torch.from_numpy(x), torch.from_numpy(y)

    def adopt_states(self):
        """This process's random states as building the batches taken so far leaves them."""
        set_random_states(self.states, torch_too=self.torch_rng)

    def close(self):
        """Stops the worker (and the batches it built ahead)."""
        shutdown = getattr(self.iterator, '_shutdown_workers', None)
        if shutdown is not None:
            shutdown()  # now, rather than when the iterator is collected
        self.iterator = iter(())


class InProcess:
    """The batches built in this process, one as training takes it (Trainer.batch)."""

    def __init__(self, trainer, first_epoch, first_step, max_epochs):
        dataset = trainer.train_dataset
        run = RunBatches(
            len(dataset), trainer.config.batch_size, first_epoch, first_step, max_epochs
        )
        self.batches = (trainer.batch(dataset, step) for step in run.steps())

    def __iter__(self):
        return self.batches

    def __next__(self):
        return next(self.batches)

    def adopt_states(self):
        """Nothing to do: the draws happened here."""

    def close(self):
        pass
