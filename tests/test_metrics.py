"""metrics.py: a resumed run's TensorBoard log replaces the steps logged after its saved
state; the progress bars move every step and, during a slow one, redraw on their own."""

import io
import itertools
import time
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


def test_the_training_bar_moves_every_step_between_the_logged_ones(monkeypatch):
    import trainer
    from test_trainer import tiny_setup

    bars = []

    class Kept(metrics.Progress):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            bars.append(self.bar)

    monkeypatch.setattr(metrics, 'Progress', Kept)
    gpt, ds, config = tiny_setup(max_epochs=2, log_every=1000)  # logged at the epochs' ends
    run = trainer.Trainer(gpt, ds, None, config)
    step, seen = run.train_step, []

    def watched(x, y):
        seen.append(bars[0].n)  # the steps the bar shows as this one starts
        return step(x, y)

    run.train_step = watched
    run.train()
    assert run.steps_per_epoch > 2
    assert seen == list(range(2 * run.steps_per_epoch))


def draws(text):
    return text.count('\r')  # tqdm starts each drawing of the bar with one


def test_a_bar_redraws_itself_during_a_slow_step_and_stops_when_closed():
    out = io.StringIO()
    bar = metrics.Bar(total=3, file=out, tick_s=0.1)
    bar.update(1)
    before = draws(out.getvalue())
    time.sleep(0.65)  # a slow step: six ticks
    during = draws(out.getvalue()) - before
    bar.close()
    closed = out.getvalue()
    time.sleep(0.25)
    assert during >= 3  # a loaded machine may delay a tick or two
    assert bar.ticker is None and out.getvalue() == closed


def test_a_bar_drawn_by_its_updates_is_not_redrawn_by_its_ticks():
    out = io.StringIO()
    bar = metrics.Bar(total=100, file=out, tick_s=0.2, mininterval=0)
    for _ in range(50):  # fast steps, each drawing the bar
        bar.update(1)
        time.sleep(0.01)
    assert draws(out.getvalue()) == 51  # the first drawing, then one a step
    bar.close()


def test_the_question_bar_is_silent_without_questions_or_off_the_first_process(monkeypatch):
    def disabled(*args, **kwargs):
        with metrics.question_bar(*args, **kwargs) as bar:  # closed: its ticking stops
            return bar.disable

    assert not disabled(5)
    assert disabled(0)
    assert disabled(5, shown=False)
    monkeypatch.setenv('RANK', '1')
    assert disabled(5)
