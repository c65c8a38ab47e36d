"""A training run's per-step metrics: a CSV file beside the written params (one row per
step: epoch, step, loss, lr, tokens, seconds; plot.py draws it) and TensorBoard's
train/loss and train/lr, as the later editions log them; and the progress bars (Bar):
training's, moved every step, and evaluation's, over the questions. trainer.py writes them
through a Progress; shared_runs.py and decoding.py use a Bar.
"""

import csv
import io
import math
import os
import threading
import time

import torch
from tqdm import tqdm

from machinery import files


class NonFiniteLoss(Exception):
    """The loss became inf or nan; nothing was saved after the last good state."""


class MetricsLog:
    """Per-step metrics, kept on the device and written (one host sync) every few steps, to
    the CSV file and to TensorBoard. Refuses a non-finite loss, so nothing is saved after it."""

    FIELDS = ['epoch', 'step', 'loss', 'lr', 'tokens', 'seconds']

    def __init__(
        self, path, append, tensorboard_dir=None, first_step=0, average=lambda losses: losses
    ):
        self.rows, self.last_loss, self.average = [], float('nan'), average
        self.file = self.writer = self.tensorboard = None
        if tensorboard_dir:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                print(
                    "note: TensorBoard is not installed (pip install tensorboard); no logs in "
                    f"{tensorboard_dir}"
                )
            else:
                # a resumed run drops what an interrupted one logged after its saved state
                self.tensorboard = SummaryWriter(
                    tensorboard_dir, purge_step=first_step + 1 if append else None
                )
        if path:
            new = not (append and os.path.exists(path))
            if not new:
                keep_rows_to(path, first_step)  # what an interrupted run logged after its state
            self.file = open(path, 'w' if new else 'a', newline='', encoding='utf-8')
            self.writer = csv.writer(self.file)
            if new:
                self.writer.writerow(self.FIELDS)

    def add(self, epoch, step, loss, lr, tokens):
        self.rows.append((epoch + 1, step, loss, lr, tokens))

    def flush(self, seconds):
        if not self.rows:
            return self.last_loss
        losses = self.average(torch.stack([r[2] for r in self.rows]).float()).tolist()
        for (epoch, step, _, lr, tokens), loss in zip(self.rows, losses):
            if not math.isfinite(loss):
                raise NonFiniteLoss(f"the loss became {loss} at epoch {epoch}, step {step}")
            if self.writer:
                self.writer.writerow(
                    [epoch, step, f'{loss:.6f}', f'{lr:.6e}', tokens, f'{seconds:.1f}']
                )
            if self.tensorboard:
                self.tensorboard.add_scalar('train/loss', loss, step)
                self.tensorboard.add_scalar('train/lr', lr, step)
        if self.file:
            self.file.flush()
        if self.tensorboard:
            self.tensorboard.flush()
        self.rows, self.last_loss = [], losses[-1]
        return self.last_loss

    def close(self):
        if self.file:
            self.file.close()
        if self.tensorboard:
            self.tensorboard.close()


def keep_rows_to(path, step):
    """Rewrites a metrics CSV with its whole rows up to `step`, the saved state a resumed
    run starts from, under the header. A run that was killed (not stopped by a signal,
    which saves the state after the step it logged last) may have logged steps after its
    last saved state, which the resumed run makes again, and may have left a row, or the
    header, cut short."""
    with open(path, newline='', encoding='utf-8', errors='replace') as f:
        text = f.read()
    text = text[: text.rfind('\n') + 1]  # a last line without its end was cut short
    rows = list(csv.reader(io.StringIO(text.replace('\0', ''), newline='')))
    kept = [row for row in rows[1:] if whole_row(row) and int(row[1]) <= step]
    out = io.StringIO(newline='')
    csv.writer(out).writerows([MetricsLog.FIELDS, *kept])
    files.atomic_write(path, lambda f: f.write(out.getvalue().encode('utf-8')))


def whole_row(row):
    """Whether a CSV row is one MetricsLog wrote whole: its fields, each a number."""
    if len(row) != len(MetricsLog.FIELDS) or not row[1].isdecimal():
        return False
    try:
        return all(math.isfinite(float(field)) for field in row)
    except ValueError:
        return False


class Bar(tqdm):
    """A tqdm bar that also redraws itself from a thread of its own when it has not been
    drawn for tick_s seconds: its clock moves while a step takes longer than that."""

    def __init__(self, *args, tick_s=1.0, **kwargs):
        self.stop_ticking = threading.Event()
        self.ticker = None
        super().__init__(*args, **kwargs)
        if not self.disable:
            self.ticker = threading.Thread(
                target=self.tick, args=(tick_s,), name='progress bar', daemon=True
            )
            self.ticker.start()

    def tick(self, seconds):
        while not self.stop_ticking.wait(seconds):
            # tqdm draws under its lock, so a redraw here never interleaves with the
            # trainer's; update() keeps last_print_t, the time of its last drawing
            if time.time() - self.last_print_t >= seconds:
                self.refresh()

    def close(self):
        self.stop_ticking.set()
        if self.ticker is not None:
            self.ticker.join()  # before tqdm's close, which draws the bar a last time
            self.ticker = None
        super().close()


def question_bar(questions, shown=True):
    """Evaluation's bar over `questions` questions: silent when not shown, when there are
    none, and in torchrun's processes other than the first, as training's is."""
    main = int(os.environ.get('RANK', 0)) == 0
    return Bar(
        total=questions,
        unit='question',
        dynamic_ncols=True,
        disable=not (shown and questions and main),
    )


class Progress:
    """What a training run shows and logs as it goes: every step's loss and learning rate
    (a MetricsLog) and a progress bar, moved every step (no wait for the device), whose
    epoch, loss, learning rate and tokens/s are updated where the trainer logs. Process
    0's; the others' are silent."""

    def __init__(self, config, first_step, total_steps, main=True, average=None):
        self.log = MetricsLog(
            config.metrics_path if main else None,
            append=config.resume,
            tensorboard_dir=config.tensorboard_dir if main else None,
            first_step=first_step,
            average=average or (lambda losses: losses),
        )
        self.bar = Bar(
            total=total_steps,
            initial=first_step,
            unit='step',
            dynamic_ncols=True,
            smoothing=0.05,
            disable=total_steps == 0 or not main,
        )

    def add(self, epoch, done, loss, lr, tokens):
        """Step `done` of the run made: its loss, a device tensor, kept for the log (not
        read here), and the bar moved on to it."""
        self.log.add(epoch, done, loss, lr, tokens)
        self.bar.update(done - self.bar.n)

    def show(self, epoch, it, done, lr, seconds, tokens_per_s):
        """Step `it` of `epoch` done, the run's `done`-th; the log written up to it."""
        last_loss = self.log.flush(seconds)
        self.bar.set_description(
            f"epoch {epoch + 1} iter {it}: train loss {last_loss:.5f}. lr {lr:e}"
        )
        self.bar.set_postfix_str(f"{tokens_per_s:,.0f} tok/s")
        self.bar.update(done - self.bar.n)

    def close(self):
        self.bar.close()
        self.log.close()


def tensorboard_dir(args):
    """The later editions' TensorBoard folder, expt/{function}/{name}, under the folder of
    the written params (the current folder for the handouts' commands)."""
    name = f"{args.tb_expt_name}_{args.variant}"
    if args.variant == 'perceiver' or args.edition == '2023':  # the 2023 starter's name has it
        name += f"_{args.bottleneck_dim}"
    name += f"_pt_lr_{args.pretrain_lr:f}_ft_lr_{args.finetune_lr:f}"
    return os.path.join(os.path.dirname(args.writing_params_path), 'expt', args.function, name)
