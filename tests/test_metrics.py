"""metrics.py: a resumed run's TensorBoard log replaces the steps logged after its saved
state."""

import itertools
import types

import pytest
import torch

from machinery import metrics


def tensorboard_scalars(folder):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder))
    events.Reload()
    return {
        tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()['scalars']
    }


def test_tensorboard_log_of_a_resumed_run_replaces_the_steps_after_its_state(tmp_path, monkeypatch):
    # TensorBoard reads the event files in name order, and names them for the second they
    # were opened, then the process's count of files, as text ('10' before '9'): two opened
    # in one second by this process may be read in the wrong order. A resumed run opens its
    # file in another process, seconds later; so do these, on a clock of their own.
    from tensorboard.summary.writer import event_file_writer

    clock = itertools.count(1_000_000_000, 10)
    monkeypatch.setattr(event_file_writer, 'time', types.SimpleNamespace(time=lambda: next(clock)))

    def log(first_step, losses, append):
        steps = metrics.MetricsLog(
            tmp_path / 'm.csv',
            append=append,
            tensorboard_dir=tmp_path / 'tb',
            first_step=first_step,
        )
        for step, loss in enumerate(losses, first_step + 1):
            steps.add(0, step, torch.tensor(loss), 0.1 * step, 10 * step)
        steps.flush(1.0)
        steps.close()

    # interrupted after step 5, state saved at step 3
    log(0, [5.0, 4.0, 3.0, 2.5, 2.0], append=False)
    log(3, [2.9, 2.7], append=True)
    scalars = tensorboard_scalars(tmp_path / 'tb')
    assert scalars['train/loss'] == [
        (1, 5.0),
        (2, 4.0),
        (3, 3.0),
        (4, pytest.approx(2.9)),
        (5, pytest.approx(2.7)),
    ]
    assert [s for s, _ in scalars['train/lr']] == [1, 2, 3, 4, 5]
