"""batch_producer.py: the batches built ahead in a producer process are the trainer's own,
bit for bit (every batch of several epochs hashed both ways, from a run's start and from
the middle of one), and leave the random states where building them here would; a run
trained on them ends with the same params and random states, interrupted or not."""

import hashlib
import multiprocessing
import os
import random
import signal
import sys
import time

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset

import trainer
from machinery import batch_producer
from test_resume import train_to_end
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


def trainer_of(dataset, batch_size):
    """A trainer of `dataset` (its model drawn now, before the tests seed the generators)."""
    config = trainer.TrainerConfig(batch_size=batch_size, device='cpu')
    return trainer.Trainer(torch.nn.Linear(1, 1), dataset, None, config)


def seed_everything(seed):
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def same_states(a, b):
    """Whether two batch_producer.random_states() are the same."""
    return a == b


@pytest.mark.parametrize('make_dataset', ['span_corruption', 'draws_everywhere'])
@pytest.mark.parametrize('start', [(0, 0), (1, 3)])  # a run's start; a resumed run's middle
def test_producer_batches_are_the_trainers_bit_for_bit(make_dataset, start):
    dataset = tiny_setup()[1] if make_dataset == 'span_corruption' else DrawsEverywhere()
    epochs, batch_size = 4, 8
    t = trainer_of(dataset, batch_size)
    seed_everything(5)
    expected = [digest(b) for b in batch_producer.InProcess(t, *start, epochs)]
    states_after = batch_producer.random_states()
    seed_everything(5)
    before = batch_producer.random_states()
    producer = batch_producer.BatchProducer(dataset, batch_size, *start, epochs)
    got = [digest(b) for b in producer]
    producer.close()
    steps = -(-len(dataset) // batch_size)
    assert len(got) == len(expected) == (epochs - start[0]) * steps - start[1]
    assert got == expected
    # the draws happened in the worker: this process's states move only when adopted
    assert same_states(batch_producer.random_states(), before)
    producer.adopt_states()
    assert same_states(batch_producer.random_states(), states_after)
    assert not same_states(before, states_after)


def test_adopted_states_stand_after_the_batches_taken():
    dataset = tiny_setup()[1]
    seed_everything(2)
    producer = batch_producer.BatchProducer(dataset, 8, 0, 0, 3)
    taken = [next(producer) for _ in range(7)]  # the worker builds more ahead
    producer.adopt_states()
    after_seven = batch_producer.random_states()
    producer.close()
    t = trainer_of(dataset, 8)
    seed_everything(2)
    here = batch_producer.InProcess(t, 0, 0, 3)
    assert [digest(next(here)) for _ in range(7)] == [digest(b) for b in taken]
    assert same_states(batch_producer.random_states(), after_seven)


@pytest.mark.skipif(sys.platform == 'win32', reason="os.kill ends a process on Windows")
@pytest.mark.parametrize('signum', [signal.SIGINT, signal.SIGTERM])
def test_the_worker_outlives_ctrl_c_and_sigterm(signum):
    """They reach the worker too (a terminal's process group, a stopping VM); the trainer
    decides when to stop, so the worker goes on building until it is closed."""
    dataset = tiny_setup()[1]
    t = trainer_of(dataset, 8)
    seed_everything(4)
    expected = [digest(b) for b in batch_producer.InProcess(t, 0, 0, 6)]
    seed_everything(4)
    producer = batch_producer.BatchProducer(dataset, 8, 0, 0, 6)
    got = [digest(next(producer))]
    (worker,) = multiprocessing.active_children()
    os.kill(worker.pid, signum)
    time.sleep(0.2)
    got += [digest(b) for b in producer]
    assert worker.exitcode in (None, 0)  # still running, or ended as the producer closed
    producer.close()
    assert got == expected


def test_run_batches_cover_every_remaining_step():
    batches = batch_producer.RunBatches(37, 8, 1, 3, 3)
    listed = list(batches)
    assert len(listed) == len(batches) == 2 + 5
    assert listed[0] == list(range(24, 32)) and listed[1] == list(range(32, 37))
    assert listed[2] == list(range(0, 8))
    assert len(batch_producer.RunBatches(37, 8, 3, 0, 3)) == 0


def train(**overrides):
    random.seed(0)
    gpt, ds, config = tiny_setup(**overrides)
    trainer.Trainer(gpt, ds, None, config).train()
    return gpt.state_dict(), batch_producer.random_states()


@pytest.mark.parametrize('precision', ['fp32', 'bf16'])
def test_training_on_the_producers_batches_is_the_same(precision):
    """On the CPU with dropout on (it draws from torch's CPU generator, which the batches'
    worker leaves alone): the same params, bit for bit, and the same random states."""
    here, states_here = train(precision=precision, batch_producer=False)
    ahead, states_ahead = train(precision=precision, batch_producer=True)
    for k in here:
        assert torch.equal(here[k], ahead[k]), k
    assert same_states(states_here, states_ahead)


@pytest.mark.parametrize('interrupt_at', [3, 8])
def test_interrupted_run_on_the_producers_batches_resumes_exactly(
    tmp_path, monkeypatch, interrupt_at
):
    """The resumable state's random states are those after the batches trained on, not
    after those the worker built ahead: the resumed run rebuilds the rest the same."""
    straight = train_to_end(tmp_path)
    monkeypatch.setattr(trainer.TrainerConfig, 'batch_producer', True)
    resumed = train_to_end(tmp_path, interrupt_at)
    for k in straight:
        assert torch.equal(straight[k], resumed[k]), k


def test_trainer_uses_the_producer_on_cuda_only_without_a_test_set(monkeypatch):
    gpt, ds, config = tiny_setup()
    t = trainer.Trainer(gpt, ds, None, config)
    assert isinstance(t.remaining_batches(), batch_producer.InProcess)
    made = []
    monkeypatch.setattr(batch_producer, 'BatchProducer', lambda *a, **k: made.append(k))
    t.device = 'cuda'  # what is chosen, not run
    t.remaining_batches()
    assert made == [{'torch_rng': True}]
    t.test_dataset = ds  # whose batches would draw between the producer's
    assert isinstance(t.remaining_batches(), batch_producer.InProcess)
