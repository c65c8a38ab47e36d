"""The training loop: AdamW, gradient clipping, and the original's token-counted learning
rate schedule (linear warm-up, then cosine decay to 10%).

It computes what the original minGPT trainer computes (same batches, in the same order,
same schedule), faster: batches are built in this process (span corruption is cheap, and
it keeps runs reproducible and resumable) and the loss skips positions that cannot
affect it (GPT.packed_loss, packing.py). The machinery around the loop lives beside it:
resume.py keeps a resumable state and stops on Ctrl-C or SIGTERM (a finished run leaves
its state in place: the caller removes it once the params are written), metrics.py logs
every step, and distributed.py shares each batch between processes under torchrun.
"""

import math
import time

import numpy as np
import torch
from tqdm import tqdm

import devices
import distributed
import files
import metrics
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
    ckpt_path = None  # the params are written here after every save_every-th epoch;
    save_every = 1  # '{epoch}' in ckpt_path becomes the epoch's number (from 1)
    num_workers = 0  # accepted for compatibility: batches are always built in this process
    # additions, all off by default
    precision = 'fp32'  # 'bf16' or 'fp16': autocast the forward pass (fp16 with a gradient scaler)
    device = 'auto'  # 'cuda', 'mps' or 'cpu'; auto: the first available (devices.pick_device)
    resume_path = None  # keep a resumable state here: on Ctrl-C/SIGTERM and every minute
    resume = False  # continue from the state in resume_path
    metrics_path = None  # a CSV row per step: epoch, step, loss, lr, tokens, seconds
    # train/loss and train/lr per step for TensorBoard, as the later editions log
    tensorboard_dir = None
    save_every_s = 60  # how often (at an epoch's end) the resumable state is refreshed
    log_every = 10  # steps between progress updates; each one waits for the device
    finetune_method = 'full'  # which weights train (finetune_methods.describe): checked on resume

    def __init__(self, **kwargs):
        for k, v in kwargs.items():
            setattr(self, k, v)


class Trainer:
    def __init__(self, model, train_dataset, test_dataset, config):
        self.model = model
        self.train_dataset = train_dataset
        self.test_dataset = test_dataset
        self.config = config
        self.device = devices.pick_device(config.device)
        self.model = self.model.to(self.device)
        self.rank, self.world_size = distributed.rank_and_size()
        self.ddp = None
        if self.world_size > 1:
            self.ddp = distributed.wrap(self.model, self.device, self.rank)
        # fp16's narrow range needs the loss scaled up so that small gradients do not
        # underflow; disabled, the scaler passes everything through unchanged
        self.scaler = torch.amp.GradScaler(self.device, enabled=config.precision == 'fp16')
        self.tokens = 0  # counter used for learning rate decay

    def save_checkpoint(self, epoch):
        config = self.config
        if config.ckpt_path is None or self.rank > 0 or (epoch + 1) % config.save_every:
            return
        path = config.ckpt_path.format(epoch=epoch + 1)
        files.atomic_save(params_files.written_params(self.model), path)

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
        # only the weights that train: all, unless a finetune_methods method froze most
        named = [(n, p) for n, p in self.model.named_parameters() if p.requires_grad]
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
        the lengths, which it would copy to the GPU. Under torchrun, this process sums
        its rows' losses and divides by the whole batch's count of targets, times
        world_size since DDP averages the processes' gradients."""
        lengths = target_lengths(y)  # (b,)
        if self.ddp is None:
            packing = Packing(lengths, device=self.device)
            x, y = self.to_device(x, y)
            with self.autocast():
                return self.model.packed_loss(x, y, packing)
        rows, share = distributed.shard_rows(lengths, self.rank, self.world_size)
        n_targets = int((y != 0).sum()) / self.world_size
        packing = Packing(lengths[rows], device=self.device)
        x, y = self.to_device(x[rows], y[rows])
        with self.autocast():
            return self.ddp(x, y, packing, n_targets) * share

    def autocast(self):
        dtype = {'bf16': torch.bfloat16, 'fp16': torch.float16}.get(self.config.precision)
        return torch.autocast(self.device, dtype=dtype or torch.bfloat16, enabled=dtype is not None)

    def train(self):
        """config.max_epochs epochs of training; with config.resume, from the saved state."""
        config = self.config
        optimizer = self.make_optimizer()
        self.steps_per_epoch = math.ceil(len(self.train_dataset) / config.batch_size)
        first_epoch, first_step = self.start(optimizer)
        self.done = self.first_done = first_epoch * self.steps_per_epoch + first_step
        self.log, self.progress = self.open_logs()
        self.start_time = time.time() - self.elapsed
        self.stopper = resume.Stopper(self, optimizer)
        try:
            with self.stopper:
                for epoch in range(first_epoch, config.max_epochs):
                    self.run_epoch(optimizer, epoch, first_step if epoch == first_epoch else 0)
                    self.end_epoch(epoch)
        except metrics.NonFiniteLoss as e:
            hint = "--precision fp32 or " if config.precision == 'fp16' else ""
            raise metrics.NonFiniteLoss(
                f"{e}; stopped, {self.stopper.kept()}; {hint}a lower learning rate may help"
            ) from None
        finally:
            self.progress.close()
            self.log.close()
        self.elapsed = time.time() - self.start_time
        self.steps_run = self.done - self.first_done
        self.final_loss = self.log.last_loss

    def start(self, optimizer):
        """(epoch, step) to start from: (0, 0), or where the resumed run stopped."""
        self.tokens, self.elapsed, self.resumed_elapsed = 0, 0.0, 0.0
        if not self.config.resume:
            return 0, 0
        epoch, step = resume.load_state(self, optimizer)
        self.resumed_elapsed = self.elapsed
        return epoch, step

    def open_logs(self):
        """The metrics log and the progress bar (process 0's; the others' are silent)."""
        config, main = self.config, self.rank == 0
        log = metrics.MetricsLog(
            config.metrics_path if main else None,
            append=config.resume,
            tensorboard_dir=config.tensorboard_dir if main else None,
            first_step=self.done,
            average=self.average,
        )
        total_steps = config.max_epochs * self.steps_per_epoch
        progress = tqdm(
            total=total_steps,
            initial=self.done,
            unit='step',
            dynamic_ncols=True,
            smoothing=0.05,
            disable=total_steps == 0 or not main,
        )
        return log, progress

    def run_epoch(self, optimizer, epoch, first_step):
        self.model.train()
        for it in range(first_step, self.steps_per_epoch):
            x, y = self.batch(self.train_dataset, it)
            loss = self.loss(x, y)
            self.update(optimizer, loss)
            # As in the original: the schedule moves after the step, counting every
            # target position (PADs too), and the new rate applies from the next step.
            self.tokens += y.numel()
            lr = self.lr_at(self.tokens)
            for param_group in optimizer.param_groups:
                param_group['lr'] = lr
            self.done += 1
            self.log.add(epoch, self.done, loss.detach(), lr, self.tokens)
            logged = self.done % self.config.log_every == 0 or it == self.steps_per_epoch - 1
            if logged:
                self.show_progress(epoch, it, lr, y.size(1))
            self.stopper.after_step(epoch, it + 1, logged)

    def show_progress(self, epoch, it, lr, T):
        self.elapsed = time.time() - self.start_time
        last_loss = self.log.flush(self.elapsed)
        self.progress.set_description(
            f"epoch {epoch + 1} iter {it}: train loss {last_loss:.5f}. lr {lr:e}"
        )
        tokens_per_s = self.tokens_per_s(self.done - self.first_done, T)
        self.progress.set_postfix_str(f"{tokens_per_s:,.0f} tok/s")
        self.progress.update(self.done - self.progress.n)

    def end_epoch(self, epoch):
        if self.test_dataset is not None:
            self.test_loss()
        self.elapsed = time.time() - self.start_time
        self.log.flush(self.elapsed)
        self.save_checkpoint(epoch)
        self.stopper.after_epoch(epoch)

    def any_process(self, flag):
        """Whether flag is true in any process; every process must ask at the same step."""
        return flag if self.ddp is None else distributed.any_process(flag, self.device)

    def average(self, values):
        """values averaged over the processes (each one's loss is its share x world_size)."""
        if self.ddp is None:
            return values
        return distributed.average(values, self.device, self.world_size)

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
