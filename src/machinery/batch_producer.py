"""Training's batches: built in the trainer's process, one stream of draws as the original
builds them (InProcess, the CPU's), or built ahead by worker processes, each batch from a
seed of its own (BatchProducer, CUDA's).

On a GPU a training step takes a few milliseconds, less than building its batch (span
corruption of 128 documents, in Python), so several workers build batches at once. A
batch's examples draw from Python's, numpy's and torch's CPU generators (a student's span
corruption may use any of them), and one stream of draws cannot be shared between
builders: so batch k of a run is built after those three generators are seeded from
(the run's batch seed, k). Any worker can then build any batch, the batches do not
depend on how many workers there are, and a resumed run builds the same batches from
where it stopped. The run's batch seed comes from the random state the trainer starts
with (which --seed fixes), without drawing from it, and the resumable state keeps it.

These are not the CPU's batches: the same documents in the same order, with other
random spans. The CPU keeps the original's single stream, bit for bit.
"""

import atexit
import contextlib
import hashlib
import math
import os
import random
import signal
import threading

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

PREFETCH = 8  # batches each worker builds ahead
MAX_WORKERS = 6


class RunBatches:
    """The batches left in a run, as (k, example indices): batch `first_step` of
    `first_epoch` to the end of epoch max_epochs - 1, each epoch in the original loader's
    order (no shuffling), its last batch the shorter one; k counts the run's batches from
    its first (epoch * steps_per_epoch + step)."""

    def __init__(self, n_examples, batch_size, first_epoch, first_step, max_epochs):
        self.n, self.batch_size = n_examples, batch_size
        self.steps_per_epoch = math.ceil(n_examples / batch_size)
        self.first_epoch, self.first_step, self.max_epochs = first_epoch, first_step, max_epochs

    def steps(self):
        """(epoch, step) of each batch left."""
        for epoch in range(self.first_epoch, self.max_epochs):
            first = self.first_step if epoch == self.first_epoch else 0
            for step in range(first, self.steps_per_epoch):
                yield epoch, step

    def __iter__(self):
        bs = self.batch_size
        for epoch, step in self.steps():
            k = epoch * self.steps_per_epoch + step
            yield k, list(range(step * bs, min((step + 1) * bs, self.n)))

    def __len__(self):
        epochs = max(0, self.max_epochs - self.first_epoch)
        return max(0, epochs * self.steps_per_epoch - self.first_step)


def batch_seed():
    """A run's batch seed: 63 random bits from a copy of Python's random state, which is
    left as it is."""
    copy = random.Random()
    copy.setstate(random.getstate())
    return copy.getrandbits(63)


def seed_generators(seed, k):
    """Python's, numpy's and torch's CPU generators seeded for batch k of the run whose
    batch seed is `seed`."""
    digest = hashlib.blake2b(f'{seed} {k}'.encode(), digest_size=8).digest()
    value = int.from_bytes(digest, 'little')  # 64 bits
    random.seed(value)
    np.random.seed([value & 0xFFFFFFFF, value >> 32])
    torch.manual_seed(value)


def stack(examples):
    """(x, y) examples stacked into a batch of rows: (b, T) each."""
    x = torch.stack([x for x, _ in examples])  # (b, T)
    y = torch.stack([y for _, y in examples])  # (b, T)
    return x, y


class SeededBatches(Dataset):
    """The batches of a dataset, each built from its own seed: item (k, indices) is the
    batch of those examples, built after seed_generators(seed, k). It goes to the trainer
    as numpy arrays, through the worker's pipe, which measured faster than tensors in
    shared memory (a new block for each)."""

    def __init__(self, dataset, seed):
        self.dataset, self.seed = dataset, seed

    def __getitem__(self, key):
        k, indices = key
        seed_generators(self.seed, k)
        x, y = stack([self.dataset[i] for i in indices])
        return x.numpy(), y.numpy()


def as_is(batch):
    return batch


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def start_worker(worker_id):
    """Ctrl-C and SIGTERM reach the workers too (a terminal's process group, a VM that
    stops); they are left to the trainer, which finishes its step, saves its state and
    then ends the workers (a worker that died of them would stop the trainer at once).
    torch's worker loop sets a SIGTERM handler of its own just before this runs: a
    SIGTERM in that moment of a worker's start still ends it."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)


@contextlib.contextmanager
def stop_signals_ignored():
    """Ctrl-C and SIGTERM ignored while the workers start: forked ones then ignore them
    from their first instruction, not from start_worker on (spawned ones still start with
    Python's own handlers until then)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    handlers = {signum: signal.signal(signum, signal.SIG_IGN) for signum in STOP_SIGNALS}
    try:
        yield
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)


def worker_count():
    """Workers for a machine: half its cores less one (the trainer's thread needs one, and
    a GPU's driver another), at least one and at most MAX_WORKERS."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 2
    return max(1, min(MAX_WORKERS, cores // 2 - 1))


class BatchProducer:
    """Iterates over the (x, y) batches that remain of a run, built ahead by `workers`
    worker processes, each batch from its own seed (SeededBatches). Nothing here draws
    from this process's generators."""

    def __init__(
        self, dataset, batch_size, first_epoch, first_step, max_epochs, seed, workers=None
    ):
        batches = RunBatches(len(dataset), batch_size, first_epoch, first_step, max_epochs)
        self.loader = DataLoader(
            SeededBatches(dataset, seed),
            batch_size=None,  # each item is a whole batch
            sampler=batches,
            num_workers=workers or worker_count(),
            collate_fn=as_is,
            worker_init_fn=start_worker,
            prefetch_factor=PREFETCH,
            # its own generator: the loader's seeds are not drawn from torch's global one
            generator=torch.Generator(),
        )
        with stop_signals_ignored():  # forked workers start ignoring them
            self.iterator = iter(self.loader) if len(batches) else iter(())
        # A producer left open ends its workers at exit, before torch stops shutting down
        # its iterators and multiprocessing ends its children with a SIGTERM they ignore.
        atexit.register(self.close)

    def __iter__(self):
        return self

    def __next__(self):
        x, y = next(self.iterator)
        return torch.from_numpy(x), torch.from_numpy(y)

    def close(self):
        """Stops the workers (and the batches they built ahead)."""
        atexit.unregister(self.close)
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
        self.batches = (trainer.batch(dataset, step) for _, step in run.steps())

    def __iter__(self):
        return self.batches

    def __next__(self):
        return next(self.batches)

    def close(self):
        pass
