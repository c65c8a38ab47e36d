"""The training loop: AdamW, gradient clipping, and the original's token-counted learning
rate schedule (linear warm-up, then cosine decay to 10%).

It computes what the original minGPT trainer computes (same batches, in the same order,
same schedule), faster: batches are built in this process (span corruption is cheap, and
it keeps runs reproducible and resumable) and the loss skips positions that cannot
affect it (GPT.packed_loss). Long runs can keep a resumable state (resume.py): Ctrl-C or
SIGTERM saves it and stops; `resume=True` continues exactly where the run stopped. A
finished run leaves its state in place: the caller removes it once the params are written.

Under torchrun (init_distributed), each process computes the loss of its share of every
batch's rows and DistributedDataParallel averages the gradients: the steps are those of one
process, and process 0 alone writes files.
"""

import csv
import math
import os
import signal
import threading
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
from tqdm import tqdm

import devices
import files
import params_files
import resume
from packing import Packing, target_lengths


class TrainerConfig:
    # optimization parameters
    max_epochs = 10
    batch_size = 64
    learning_rate = 3e-4
    betas = (0.9, 0.95)
    grad_norm_clip = 1.0
    weight_decay = 0.1  # applied to every parameter whose name lacks "bias", as in the original
    # learning rate decay params: linear warmup followed by cosine decay to 10% of original
    lr_decay = False
    warmup_tokens = 375e6  # these two numbers count every target position, PAD included
    final_tokens = 260e9
    # checkpoint settings
    ckpt_path = None  # the model's state_dict is saved here after every epoch
    num_workers = 0  # accepted for compatibility: batches are always built in this process
    # additions, all off by default
    precision = 'fp32'  # 'bf16' or 'fp16': autocast the forward pass (fp16 with a gradient scaler)
    device = 'auto'  # 'cuda', 'mps' or 'cpu'; auto: the first available (devices.pick_device)
    resume_path = None  # keep a resumable state here: on Ctrl-C/SIGTERM and every minute
    resume = False  # continue from the state in resume_path
    metrics_path = None  # a CSV row per step: epoch, step, loss, lr, tokens, seconds
    tensorboard_dir = (
        None  # train/loss and train/lr per step for TensorBoard, as the later editions log
    )
    save_every_s = 60  # how often (at an epoch's end) the resumable state is refreshed
    log_every = 10  # steps between progress updates; each one waits for the device

    def __init__(self, **kwargs):
        for k, v in kwargs.items():
            setattr(self, k, v)


class TrainingInterrupted(Exception):
    """Ctrl-C or SIGTERM stopped training after its resumable state was saved."""


class NonFiniteLoss(Exception):
    """The loss became inf or nan; nothing was saved after the last good state."""


class Trainer:
    def __init__(self, model, train_dataset, test_dataset, config):
        self.model = model
        self.train_dataset = train_dataset
        self.test_dataset = test_dataset
        self.config = config
        self.device = devices.pick_device(config.device)
        self.model = self.model.to(self.device)
        self.rank, self.world_size = (
            (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
        )
        self.ddp = None
        if self.world_size > 1:
            # DDP reduces gradients only for what runs through a module's forward; it also
            # copies process 0's parameters to every process here
            self.ddp = nn.parallel.DistributedDataParallel(
                PackedLoss(self.model),
                broadcast_buffers=False,  # the buffers are constant masks
                device_ids=[torch.cuda.current_device()] if self.device == 'cuda' else None,
            )
            if self.rank > 0:  # each process its own dropout masks
                torch.manual_seed((torch.initial_seed() + self.rank) % 2**63)
        # fp16's narrow range needs the loss scaled up so that small gradients do not
        # underflow; disabled, the scaler passes everything through unchanged
        self.scaler = torch.amp.GradScaler(self.device, enabled=config.precision == 'fp16')
        self.tokens = 0  # counter used for learning rate decay

    def save_checkpoint(self):
        if self.config.ckpt_path is not None and self.rank == 0:
            files.atomic_save(params_files.cpu_state_dict(self.model), self.config.ckpt_path)

    def lr_at(self, tokens):
        config = self.config
        if not config.lr_decay:
            return config.learning_rate
        if tokens < config.warmup_tokens:
            # linear warmup
            lr_mult = float(tokens) / float(max(1, config.warmup_tokens))
        else:
            # cosine learning rate decay; as in the original, past final_tokens it rises again
            progress = float(tokens - config.warmup_tokens) / float(
                max(1, config.final_tokens - config.warmup_tokens)
            )
            lr_mult = max(0.1, 0.5 * (1.0 + math.cos(math.pi * progress)))
        return config.learning_rate * lr_mult

    def make_optimizer(self):
        config = self.config
        named = list(self.model.named_parameters())
        # The original also lists "LayerNorm.weight", which no name here contains
        # (they are ln1/ln2/ln_f), so LayerNorm weights do decay, as they did there.
        decay = [p for n, p in named if 'bias' not in n]
        no_decay = [p for n, p in named if 'bias' in n]
        groups = [
            {"params": decay, "weight_decay": config.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ]
        return torch.optim.AdamW(
            groups, lr=config.learning_rate, betas=config.betas, fused=self.device == 'cuda'
        )

    def batch(self, dataset, step):
        """Batch number `step` of an epoch, on the CPU: the original loader's order (no
        shuffling). Every process builds the whole batch, with the same random spans."""
        bs = self.config.batch_size
        examples = [dataset[i] for i in range(step * bs, min((step + 1) * bs, len(dataset)))]
        x = torch.stack([x for x, _ in examples])  # (b, T)
        y = torch.stack([y for _, y in examples])  # (b, T)
        return x, y

    def to_device(self, *tensors):
        return [devices.to_device(t, self.device) for t in tensors]

    def loss(self, x, y):
        """The loss of the CPU batch x, y: the mean over its non-PAD targets, as
        forward() computes it. The packing is worked out on the CPU, before the batch
        moves, so that it costs the GPU no synchronisation; DDP is given the packing, not
        the lengths, which it would copy to the GPU. Under torchrun, this process takes
        every world_size-th row by length (so each gets a similar share of the work),
        sums its rows' losses and divides by the whole batch's count of targets, times
        world_size since DDP averages the processes' gradients."""
        lengths = target_lengths(y)  # (b,)
        if self.ddp is None:
            packing = Packing(lengths, device=self.device)
            x, y = self.to_device(x, y)
            with self.autocast():
                return self.model.packed_loss(x, y, packing)
        rows = lengths.argsort(descending=True, stable=True)[self.rank :: self.world_size]
        share = 1.0
        if len(rows) == 0:  # fewer rows than processes: still join the gradient reduction
            rows, share = rows.new_zeros(1), 0.0
        n_targets = int((y != 0).sum()) / self.world_size
        packing = Packing(lengths[rows], device=self.device)
        x, y = self.to_device(x[rows], y[rows])
        with self.autocast():
            return self.ddp(x, y, packing, n_targets) * share

    def autocast(self):
        dtype = {'bf16': torch.bfloat16, 'fp16': torch.float16}.get(self.config.precision)
        return torch.autocast(self.device, dtype=dtype or torch.bfloat16, enabled=dtype is not None)

    def train(self):
        model, config = self.model, self.config
        optimizer = self.make_optimizer()
        steps_per_epoch = math.ceil(len(self.train_dataset) / config.batch_size)
        start_epoch, start_step = 0, 0
        self.tokens, self.elapsed, self.resumed_elapsed = 0, 0.0, 0.0
        if config.resume:
            start_epoch, start_step = resume.load_state(self, optimizer)
            self.resumed_elapsed = self.elapsed
        log = MetricsLog(
            config.metrics_path if self.rank == 0 else None,
            append=config.resume,
            tensorboard_dir=config.tensorboard_dir if self.rank == 0 else None,
            first_step=start_epoch * steps_per_epoch + start_step,
            average=self.average,
        )
        total_steps = config.max_epochs * steps_per_epoch
        done = start_epoch * steps_per_epoch + start_step
        pbar = tqdm(
            total=total_steps,
            initial=done,
            unit='step',
            dynamic_ncols=True,
            smoothing=0.05,
            disable=total_steps == 0 or self.rank > 0,
        )
        self.stop_signal = None
        handlers = self.catch_stop_signals() if config.resume_path else {}
        start_time, first_done, last_save = time.time() - self.elapsed, done, time.time()
        try:
            for epoch in range(start_epoch, config.max_epochs):
                model.train()
                for it in range(start_step, steps_per_epoch):
                    x, y = self.batch(self.train_dataset, it)
                    loss = self.loss(x, y)
                    self.update(optimizer, loss)
                    # As in the original: the schedule moves after the step, counting every
                    # target position (PADs too), and the new rate applies from the next step.
                    self.tokens += y.numel()
                    lr = self.lr_at(self.tokens)
                    for param_group in optimizer.param_groups:
                        param_group['lr'] = lr
                    done += 1
                    log.add(epoch, done, loss.detach(), lr, self.tokens)
                    logged = done % config.log_every == 0 or it == steps_per_epoch - 1
                    if logged:
                        self.elapsed = time.time() - start_time
                        last_loss = log.flush(self.elapsed)
                        pbar.set_description(
                            f"epoch {epoch + 1} iter {it}: train loss {last_loss:.5f}. lr {lr:e}"
                        )
                        pbar.set_postfix_str(
                            f"{self.tokens_per_s(done - first_done, y.size(1)):,.0f} tok/s"
                        )
                        pbar.update(done - pbar.n)
                    # processes must stop after the same step: they agree where they log
                    if (logged or self.ddp is None) and self.any_process(
                        self.stop_signal is not None
                    ):
                        self.elapsed = time.time() - start_time
                        self.stop(epoch, it + 1, optimizer, log)
                start_step = 0
                if self.test_dataset is not None:
                    self.test_loss()
                self.elapsed = time.time() - start_time
                log.flush(self.elapsed)
                self.save_checkpoint()
                if config.resume_path and self.any_process(
                    time.time() - last_save >= config.save_every_s
                ):
                    resume.save_state(self, epoch + 1, 0, optimizer)
                    last_save = time.time()
        except NonFiniteLoss as e:
            kept = (
                f"the last good state is kept in {config.resume_path}"
                if config.resume_path and os.path.exists(config.resume_path)
                else "no earlier state had been saved yet"
            )
            hint = "--precision fp32 or " if config.precision == 'fp16' else ""
            raise NonFiniteLoss(
                f"{e}; stopped, {kept}; {hint}a lower learning rate may help"
            ) from None
        finally:
            pbar.close()
            log.close()
            for signum, handler in handlers.items():
                signal.signal(signum, handler)
        self.elapsed = time.time() - start_time
        self.steps_run = done - first_done
        self.final_loss = log.last_loss

    def any_process(self, flag):
        """Whether flag is true in any process; every process must ask at the same step."""
        if self.ddp is None:
            return flag
        flag = torch.tensor([float(flag)], device=self.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())

    def average(self, values):
        """values averaged over the processes (each process's loss is its share times world_size)."""
        if self.ddp is not None:
            values = values.to(self.device)
            dist.all_reduce(values)
            values = values / self.world_size
        return values

    def update(self, optimizer, loss):
        """One optimizer step on the gradient of loss, clipped to grad_norm_clip. With fp16,
        the gradients are unscaled before clipping, and a step whose gradients overflowed
        is skipped (the scaler then lowers its scale)."""
        self.model.zero_grad(set_to_none=True)
        self.scaler.scale(loss).backward()
        self.scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.grad_norm_clip)
        self.scaler.step(optimizer)
        self.scaler.update()

    def tokens_per_s(self, steps, T):
        """Target positions per second, counted like the schedule (batch x T per step)."""
        run_time = max(self.elapsed - self.resumed_elapsed, 1e-9)
        return steps * self.config.batch_size * T / run_time

    @torch.no_grad()
    def test_loss(self):
        self.model.eval()
        losses = []
        for it in range(math.ceil(len(self.test_dataset) / self.config.batch_size)):
            x, y = self.to_device(*self.batch(self.test_dataset, it))
            with self.autocast():
                losses.append(self.model.packed_loss(x, y).item())
        print("test loss: %f" % np.mean(losses))
        self.model.train()

    # --- Interruption and resumption -----------------------------------------------------

    def catch_stop_signals(self):
        """Ctrl-C and SIGTERM (a preempted VM) ask the loop to stop after the current step;
        a second Ctrl-C stops at once, except under torchrun, which passes the terminal's
        Ctrl-C on to its processes a second time (and kills them itself if they linger)."""
        if threading.current_thread() is not threading.main_thread():
            return {}

        def ask_to_stop(signum, frame):
            if self.stop_signal is not None and self.ddp is None:
                raise KeyboardInterrupt
            self.stop_signal = signum

        return {s: signal.signal(s, ask_to_stop) for s in (signal.SIGINT, signal.SIGTERM)}

    def stop(self, epoch, step, optimizer, log):
        log.flush(self.elapsed)
        resume.save_state(self, epoch, step, optimizer)
        raise TrainingInterrupted(
            f"interrupted at epoch {epoch + 1}, step {step}; state saved to {self.config.resume_path}"
        )


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


class PackedLoss(nn.Module):
    """model.packed_loss as a module's forward, for DistributedDataParallel to wrap."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, *args):
        return self.model.packed_loss(*args)


def init_distributed(device):
    """Under torchrun: join the other processes, one per GPU (nccl) or CPU processes (gloo)."""
    if device == 'cuda':
        torch.cuda.set_device(int(os.environ['LOCAL_RANK']))
    dist.init_process_group('nccl' if device == 'cuda' else 'gloo')
