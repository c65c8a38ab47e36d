"""metrics.py: a resumed run's TensorBoard log and CSV replace the steps logged after its
saved state; the progress bars move every step and, during a slow one, redraw on their own."""

import csv
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
    with open(tmp_path / 'm.csv', newline='', encoding='utf-8') as f:
        rows = list(csv.DictReader(f))
    assert [(r['step'], r['loss']) for r in rows] == [
        ('1', '5.000000'), ('2', '4.000000'), ('3', '3.000000'), ('4', '2.900000'), ('5', '2.700000'),
    ]  # fmt: skip


HEADER = 'epoch,step,loss,lr,tokens,seconds\r\n'
KEPT = '1,1,5.0,0.1,10,1.0\r\n2,2,4.0,0.2,20,2.0\r\n'


@pytest.mark.parametrize(
    'left, expected',
    [
        (HEADER + KEPT + '2,3,3.0,0.3,30,3.0\r\n2,4,2.5,0.4,40,4.0\r\n2,5,2.', HEADER + KEPT),
        (HEADER + KEPT[:-3], HEADER + KEPT[:20]),  # cut in the saved step's row
        (HEADER + KEPT[:15], HEADER),  # in the first row
        (HEADER + KEPT + '2,3,3.0,0.3,3\xff', HEADER + KEPT),  # in a byte of its last row
        (HEADER + KEPT + '\x00\x00\x00\r\n', HEADER + KEPT),  # a lost machine's zeros
        ('epoch,st', HEADER),  # in the header
        ('', HEADER),
    ],
    ids=['after', 'cut-at-state', 'cut-first-row', 'bad-byte', 'zeros', 'header', 'empty'],
)
def test_a_resumed_run_keeps_the_whole_csv_rows_to_its_state(tmp_path, left, expected):
    """A run killed after its state was saved at step 2: the resumed run's CSV is the
    header, the whole rows up to step 2, then its own."""
    path = tmp_path / 'm.csv'
    path.write_bytes(left.encode('latin-1'))
    steps = metrics.MetricsLog(path, append=True, first_step=2)
    steps.add(1, 3, torch.tensor(2.75), 0.3, 30)
    steps.flush(2.5)
    steps.close()
    assert path.read_bytes().decode() == expected + '2,3,2.750000,3.000000e-01,30,2.5\r\n'


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
