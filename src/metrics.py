"""A training run's per-step metrics: a CSV file beside the written params (one row per
step: epoch, step, loss, lr, tokens, seconds; plot.py draws it) and TensorBoard's
train/loss and train/lr, as the later editions log them. trainer.py writes them.
"""

import csv
import math
import os

import torch


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


def tensorboard_dir(args):
    """The later editions' TensorBoard folder, expt/{function}/{name}, under the folder of
    the written params (the current folder for the handouts' commands)."""
    name = f"{args.tb_expt_name}_{args.variant}"
    if args.variant == 'perceiver' or args.edition == '2023':  # the 2023 starter's name has it
        name += f"_{args.bottleneck_dim}"
    name += f"_pt_lr_{args.pretrain_lr:f}_ft_lr_{args.finetune_lr:f}"
    return os.path.join(os.path.dirname(args.writing_params_path), 'expt', args.function, name)
