"""tools/first_batches.py: what a CUDA pretraining starts from, built on the CPU, is what a
run on CUDA's batch path trains on."""

import hashlib
import json
import subprocess
import sys

import pytest

import run
import trainer
from conftest import ROOT, main
from machinery import batch_producer, devices


@pytest.mark.slow
def test_the_first_batches_and_weights_are_those_a_seeded_run_trains_on(tiny, monkeypatch):
    wiki = str(tiny / 'wiki.txt')
    argv = ['pretrain', 'vanilla', wiki, '--seed', '3', '--batch_size', '16']
    done = subprocess.run(
        [sys.executable, ROOT / 'tools' / 'first_batches.py', *argv, '--batches', '0', '1', '2'],
        capture_output=True, text=True, cwd=tiny,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    told = json.loads(done.stdout)
    # the run itself, on CUDA's batch path here, its batches and starting weights recorded
    taken, weights = [], []
    built = batch_producer.BatchProducer.__next__
    monkeypatch.setattr(devices, 'builds_batches_ahead', lambda device: True)
    monkeypatch.setattr(batch_producer.BatchProducer, '__next__',
                        lambda self: taken.append(built(self)) or taken[-1])  # fmt: skip
    starts = trainer.Trainer.train
    monkeypatch.setattr(trainer.Trainer, 'train', lambda self: weights.append(
        b''.join(v.numpy().tobytes() for v in self.model.state_dict().values())) or starts(self))  # fmt: skip
    assert main(*argv, '--max_epochs', 1, '--writing_params_path', 'v.params', cwd=tiny) == 0
    steps = -(-len(run.files.read_text(wiki).split('\n')) // 16)
    assert len(taken) == steps >= 3
    for k in range(3):
        x, y = taken[k]
        assert (
            told[f'batch {k}'] == hashlib.md5(x.numpy().tobytes() + y.numpy().tobytes()).hexdigest()
        )
    assert told['initial_weights_md5'] == hashlib.md5(weights[0]).hexdigest()
    assert told['batch_seed'] == json.loads((tiny / 'v.params.json').read_text())['batch_seed']
