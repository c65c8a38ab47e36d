"""batch_producer.py: the batches that worker processes build ahead (CUDA's) are each
built from a seed of its own, as a direct computation builds them: the same for any
number of workers and from any point of a run, fixed by the random state the trainer
starts with, without drawing from it; a run trained on them resumes exactly. The CPU's
batches stay one stream of draws in the trainer's process."""

import hashlib
import multiprocessing
import os
import random
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset

import trainer
from conftest import ROOT
from machinery import batch_producer, resume
from test_trainer import tiny_setup


class DrawsEverywhere(Dataset):
    """A dataset drawing from Python's, numpy's and torch's CPU generators, as a
    student's span corruption may."""

    def __len__(self):
        return 21

    def __getitem__(self, i):
        x = torch.full((6,), random.randint(0, 99)) + torch.randint(0, 9, (6,))
        y = x + int(np.random.randint(0, 99))
        return x, y


def digest(batch):
    x, y = batch
    return hashlib.sha256(x.numpy().tobytes() + y.numpy().tobytes()).hexdigest()


def seeded_batches(dataset, batch_size, seed, first_epoch, first_step, epochs):
    """The batches the producer is to build, computed directly: batch k's generators
    seeded from (seed, k), then its examples in order."""
    steps = -(-len(dataset) // batch_size)
    batches = []
    for epoch in range(first_epoch, epochs):
        for step in range(first_step if epoch == first_epoch else 0, steps):
            batch_producer.seed_generators(seed, epoch * steps + step)
            indices = range(step * batch_size, min((step + 1) * batch_size, len(dataset)))
            batches.append(batch_producer.stack([dataset[i] for i in indices]))
    return batches


def produced(dataset, batch_size, seed, start, epochs, workers):
    producer = batch_producer.BatchProducer(
        dataset, batch_size, *start, epochs, seed=seed, workers=workers
    )
    got = [digest(b) for b in producer]
    producer.close()
    return got


@pytest.mark.parametrize('make_dataset', ['span_corruption', 'draws_everywhere'])
@pytest.mark.parametrize('start', [(0, 0), (1, 3)])  # a run's start; a resumed run's middle
def test_producer_builds_each_batch_from_its_own_seed(make_dataset, start):
    dataset = tiny_setup()[1] if make_dataset == 'span_corruption' else DrawsEverywhere()
    epochs, batch_size, seed = 4, 8, 12345
    expected = [digest(b) for b in seeded_batches(dataset, batch_size, seed, *start, epochs)]
    steps = -(-len(dataset) // batch_size)
    assert len(expected) == (epochs - start[0]) * steps - start[1]
    random.seed(5)
    before = random.getstate(), np.random.get_state()[1].tolist(), torch.get_rng_state()
    for workers in (1, 2):
        assert produced(dataset, batch_size, seed, start, epochs, workers) == expected
    # nothing was drawn here: the workers draw
    after = random.getstate(), np.random.get_state()[1].tolist(), torch.get_rng_state()
    assert before[:2] == after[:2] and torch.equal(before[2], after[2])
    assert len(set(expected)) == len(expected)  # every batch its own draws
    other = produced(dataset, batch_size, seed + 1, start, epochs, 2)
    assert not set(other) & set(expected)


def test_batch_seed_comes_from_pythons_state_without_drawing():
    random.seed(7)
    state = random.getstate()
    seed = batch_producer.batch_seed()
    assert random.getstate() == state and 0 <= seed < 2**63
    assert batch_producer.batch_seed() == seed
    random.seed(8)
    assert batch_producer.batch_seed() != seed


@pytest.mark.skipif(sys.platform == 'win32', reason="os.kill ends a process on Windows")
@pytest.mark.parametrize('signum', [signal.SIGINT, signal.SIGTERM])
def test_the_workers_outlive_ctrl_c_and_sigterm(signum):
    """They reach the workers too (a terminal's process group, a stopping VM); the
    trainer decides when to stop, so the workers go on building until they are closed."""
    dataset = tiny_setup()[1]
    expected = [digest(b) for b in seeded_batches(dataset, 8, 4, 0, 0, 6)]
    others = set(multiprocessing.active_children())
    producer = batch_producer.BatchProducer(dataset, 8, 0, 0, 6, seed=4, workers=2)
    # a batch from each worker: both have begun (a SIGTERM in torch's moment of a
    # worker's start still ends it, start_worker says)
    got = [digest(next(producer)), digest(next(producer))]
    workers = [p for p in multiprocessing.active_children() if p not in others]
    assert len(workers) == 2
    for worker in workers:
        os.kill(worker.pid, signum)
    time.sleep(0.2)
    got += [digest(b) for b in producer]
    assert all(w.exitcode in (None, 0) for w in workers)  # running, or ended as it closed
    producer.close()
    assert got == expected


LEFT_OPEN = """
import sys
sys.path[:0] = ['src', 'tests']
from machinery import batch_producer
from test_trainer import tiny_setup
producer = batch_producer.BatchProducer(tiny_setup()[1], 8, 0, 0, 6, seed=4, workers=2)
next(producer)
print('left open')
"""


def test_a_producer_left_open_lets_python_exit():
    """Its workers ignore the SIGTERM with which multiprocessing ends them at exit: the
    producer closes them first (a test that fails before close, a script)."""
    done = subprocess.run(
        [sys.executable, '-c', LEFT_OPEN], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and done.stdout.endswith('left open\n'), done.stderr
    assert 'Error' not in done.stderr, done.stderr


def test_run_batches_cover_every_remaining_step():
    batches = batch_producer.RunBatches(37, 8, 1, 3, 3)
    listed = list(batches)
    assert len(listed) == len(batches) == 2 + 5
    assert listed[0] == (5 + 3, list(range(24, 32))) and listed[1] == (9, list(range(32, 37)))
    assert listed[2] == (10, list(range(0, 8)))
    assert len(batch_producer.RunBatches(37, 8, 3, 0, 3)) == 0


def test_worker_count_leaves_cores_to_the_trainer(monkeypatch):
    for cores, workers in [(1, 1), (2, 1), (4, 1), (8, 3), (16, 6), (64, 6)]:
        monkeypatch.setattr(os, 'sched_getaffinity', lambda pid, n=cores: set(range(n)))
        assert batch_producer.worker_count() == workers


def train(interrupt_at=None, path=None, **overrides):
    """The tiny setup on the producer's batches (CPU dropout on); with interrupt_at=k,
    stopped during step k and resumed from scrambled random states. Returns the params
    and the trainer."""
    random.seed(0)
    gpt, ds, config = tiny_setup(batch_producer=True, resume_path=path, **overrides)
    t = trainer.Trainer(gpt, ds, None, config)
    if interrupt_at is None:
        t.train()
        return gpt.state_dict(), t
    step, calls = t.train_step, []

    def stopping_step(x, y):
        calls.append(1)
        if len(calls) == interrupt_at:
            t.stopper.signal = signal.SIGINT
        return step(x, y)

    t.train_step = stopping_step
    with pytest.raises(resume.TrainingInterrupted):
        t.train()
    random.seed(99)
    np.random.seed(99)
    gpt, ds, config = tiny_setup(batch_producer=True, resume_path=path, resume=True, **overrides)
    resumed = trainer.Trainer(gpt, ds, None, config)
    resumed.train()
    return gpt.state_dict(), resumed


def test_training_on_the_producers_batches_is_fixed_by_the_seed():
    """The run's batch seed comes from the random state training starts with (--seed's):
    two runs from the same seed end with the same params, bit for bit, and their batches
    are the direct computation's."""
    first, t = train()
    second, _ = train()
    for k in first:
        assert torch.equal(first[k], second[k]), k
    random.seed(0)
    assert t.batch_seed == batch_producer.batch_seed()


@pytest.mark.parametrize('interrupt_at', [3, 8])
def test_interrupted_run_on_the_producers_batches_resumes_exactly(tmp_path, interrupt_at):
    """The resumable state keeps the run's batch seed: the resumed run builds the batches
    the straight run built, whatever the random state it starts with."""
    straight, t = train()
    path = str(tmp_path / 'state.resume')
    resumed, r = train(interrupt_at, path)
    assert r.batch_seed == t.batch_seed
    for k in straight:
        assert torch.equal(straight[k], resumed[k]), k


def test_a_state_saved_without_a_batch_seed_resumes(tmp_path):
    """States saved before the seed was kept: the seed comes from the restored random
    state, as it came at the run's start."""
    path = str(tmp_path / 'state.resume')
    straight, _ = train()
    random.seed(0)
    gpt, ds, config = tiny_setup(batch_producer=True, resume_path=path)
    t = trainer.Trainer(gpt, ds, None, config)
    step, calls = t.train_step, []

    def stopping_step(x, y):
        calls.append(1)
        if len(calls) == 4:
            t.stopper.signal = signal.SIGINT
        return step(x, y)

    t.train_step = stopping_step
    with pytest.raises(resume.TrainingInterrupted):
        t.train()
    state = torch.load(path, weights_only=True)
    assert isinstance(state.pop('batch_seed'), int)
    torch.save(state, path)
    random.seed(99)
    gpt, ds, config = tiny_setup(batch_producer=True, resume_path=path, resume=True)
    trainer.Trainer(gpt, ds, None, config).train()
    for k, v in gpt.state_dict().items():
        assert torch.equal(v, straight[k]), k


def test_trainer_uses_the_producer_on_cuda(monkeypatch):
    gpt, ds, config = tiny_setup()
    t = trainer.Trainer(gpt, ds, None, config)
    assert isinstance(t.remaining_batches(), batch_producer.InProcess)
    made = []
    monkeypatch.setattr(batch_producer, 'BatchProducer', lambda *a, **k: made.append(a))
    t.device = 'cuda'  # what is chosen, not run
    t.test_dataset = ds  # a test set draws in this process, not from the batches' seeds
    random.seed(3)
    t.remaining_batches()
    assert made == [(ds, 8, 0, 0, 3, batch_producer.batch_seed())]
