"""The training loop (minGPT's Trainer): AdamW, gradient clipping, and the original's
token-counted learning-rate schedule (linear warm-up, then cosine decay to 10%).

It trains on what the original trains on (the same batches in the same order, the same
schedule), through GPT.forward. The machinery beside it: packing.py (the loss computed on
only the positions that can change it), resume.py (the resumable state: made, written,
checked and restored; Ctrl-C or SIGTERM), metrics.py (every step's loss and learning
rate), distributed.py (torchrun: each process's share of the loss), devices.py (where,
and in what precision), batch_producer.py (on CUDA, batches built ahead by worker
processes) and cuda_graphs.py (on CUDA, the step compiled and replayed from CUDA graphs).
"""

import functools
import math
import time

import numpy as np
import torch

from machinery import (
    batch_producer,
    checks,
    cuda_graphs,
    devices,
    distributed,
    dropout,
    files,
    metrics,
    params_files,
    resume,
)
from machinery.packing import Packing, target_lengths


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
    # run.py's flags; on CUDA it replays from graphs unless --eager (devices.training_paths)
    compile = False  # torch.compile the model first (CUDA only: devices.compile_model)
    cuda_graph = False  # replay each step from a CUDA graph (cuda_graphs.py)
    # build the batches ahead in worker processes, each from its own seed
    # (batch_producer.py); None: on CUDA
    batch_producer = None

    def __init__(self, **kwargs):
        for k, v in kwargs.items():
            setattr(self, k, v)


class Trainer:
    """Trains `model` as it is when given: a finetuning method is applied before (the
    optimizer takes the parameters that train then)."""

    def __init__(self, model, train_dataset, test_dataset, config):
        self.train_dataset = train_dataset
        self.test_dataset = test_dataset
        self.config = config
        self.device = devices.pick_device(config.device)
        self.model = model.to(self.device)
        # around the handout's code: its nn.Dropout draws faster on the CPU (dropout.py)
        dropout.use_in(model)
        # [2024] and RoPE rotates in fp32 under autocast (a complex-number one has no bf16)
        devices.rotate_in_fp32(model)
        if config.compile:
            devices.compile_model(model, self.device)
        self.rank, self.world_size = distributed.rank_and_size()
        # under torchrun: the model in DistributedDataParallel, which averages the gradients
        self.ddp = distributed.wrap(model, self.device, self.rank) if self.world_size > 1 else None
        self.optimizer = self.make_optimizer()
        # only the positions that can change the loss (packing.py) on the CPU; the whole
        # padded batch on GPUs (devices.packs_batches)
        self.packs = devices.packs_batches(self.device)
        # fp16's narrow range needs the loss scaled up so that small gradients do not
        # underflow; disabled, the scaler passes everything through unchanged
        self.scaler = torch.amp.GradScaler(self.device, enabled=config.precision == 'fp16')
        self.stopper = resume.Stopper(config.resume_path, self.ddp is not None)  # Ctrl-C, SIGTERM
        self.steps_per_epoch = math.ceil(len(train_dataset) / config.batch_size)
        self.tokens = 0  # target positions trained on: the learning-rate schedule's clock
        self.epoch, self.step = 0, 0  # where training goes on: batch `step` of `epoch`
        self.elapsed = 0.0  # seconds of training, an interrupted run's included
        self.resumed_elapsed = 0.0  # the interrupted run's share of elapsed
        self.start_time = time.time()  # when training started, less the elapsed time
        self.steps_before = 0  # steps an interrupted run made before this one resumed it
        self.steps_run = 0  # steps this run made
        self.final_loss = float('nan')  # the last logged loss
        self.batches = None  # the run's remaining batches, as train() takes them
        self.batch_seed = None  # the seed of batches built ahead (batch_producer.py)
        # one training step on a CPU batch: its loss (the model updated)
        self.graphed = cuda_graphs.GraphedStep(self) if config.cuda_graph else None
        self.train_step = self.eager_step if self.graphed is None else self.graphed
        if config.compile:  # a model the compiler cannot take trains as written
            self.train_step = devices.falls_back_uncompiled(self.train_step, model)

    def make_optimizer(self):
        config = self.config
        # only the weights that train: all, unless a finetune_methods method froze most
        named = [(n, p) for n, p in self.model.named_parameters() if p.requires_grad]
        # The original also lists "LayerNorm.weight", which no name here contains
        # (they are ln1/ln2/ln_f), so LayerNorm weights do decay, as they did there.
        groups = [
            {
                "params": [p for n, p in named if 'bias' not in n],
                "weight_decay": config.weight_decay,
            },
            {"params": [p for n, p in named if 'bias' in n], "weight_decay": 0.0},
        ]
        fused = devices.fused_adamw(self.device)
        return torch.optim.AdamW(groups, lr=config.learning_rate, betas=config.betas, fused=fused)

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

    def train(self):
        """config.max_epochs epochs of training; with config.resume, what is left of them."""
        config = self.config
        checks.check_examples(self.train_dataset)  # a bad line stops the run now, not later
        if config.resume:
            resume.load(config.resume_path, self)
            self.resumed_elapsed = self.elapsed
        self.steps_before = self.epoch * self.steps_per_epoch + self.step
        self.start_time, last_save = time.time() - self.elapsed, time.time()
        self.batches = self.remaining_batches()
        total_steps = config.max_epochs * self.steps_per_epoch
        average = functools.partial(distributed.average, device=self.device)  # over processes
        progress = metrics.Progress(config, self.steps_before, total_steps, self.rank == 0, average)
        try:
            with self.stopper:
                for epoch in range(self.epoch, config.max_epochs):
                    self.run_epoch(epoch, progress)
                    if self.test_dataset is not None:
                        self.test_loss()
                    progress.log.flush(self.clock())
                    self.save_checkpoint(epoch)
                    overdue = time.time() - last_save >= config.save_every_s
                    if config.resume_path and distributed.any_process(overdue, self.device):
                        self.save_state()
                        last_save = time.time()
        except metrics.NonFiniteLoss as e:
            hint = "--precision fp32 or " if config.precision == 'fp16' else ""
            raise metrics.NonFiniteLoss(
                f"{e}; stopped, {resume.kept(config.resume_path)}; {hint}a lower learning "
                f"rate may help"
            ) from None
        finally:
            progress.close()
            self.batches.close()
        self.clock()
        self.steps_run = self.epoch * self.steps_per_epoch + self.step - self.steps_before
        self.final_loss = progress.log.last_loss

    def remaining_batches(self):
        """The batches left in the run, in order: built in this process, as the original
        builds them, or on CUDA ahead by worker processes, each batch from a seed of its
        own (batch_producer.py; the run's batch seed is kept in the resumable state)."""
        config, device = self.config, self.device
        ahead = config.batch_producer
        if ahead is None:
            ahead = devices.builds_batches_ahead(device)
        if not ahead:
            return batch_producer.InProcess(self, self.epoch, self.step, config.max_epochs)
        if self.batch_seed is None:
            self.batch_seed = batch_producer.batch_seed()
        return batch_producer.BatchProducer(
            self.train_dataset,
            config.batch_size,
            self.epoch,
            self.step,
            config.max_epochs,
            self.batch_seed,
        )

    def run_epoch(self, epoch, progress):
        """The rest of the epoch: from batch self.step to its end."""
        self.model.train()
        for step, (x, y) in zip(range(self.step, self.steps_per_epoch), self.batches):
            loss = self.train_step(x, y)
            # as in the original: the schedule moves after the step, counting every target
            # position (PADs too), and the new rate applies from the next step
            self.tokens += y.numel()
            lr = self.lr_at(self.tokens)
            self.set_lr(lr)
            self.epoch, self.step = epoch, step + 1
            done = epoch * self.steps_per_epoch + step + 1
            progress.add(epoch, done, loss.detach(), lr, self.tokens)
            logged = done % self.config.log_every == 0 or step == self.steps_per_epoch - 1
            if logged:
                seconds = self.clock()
                speed = self.tokens_per_s(done - self.steps_before, y.size(1))
                progress.show(epoch, step, done, lr, seconds, speed)
            # processes agree on a stop where they log (a collective operation)
            stop = self.stopper.asked()
            if (logged or self.ddp is None) and distributed.any_process(stop, self.device):
                progress.log.flush(self.clock())
                self.save_state()
                raise resume.TrainingInterrupted(
                    f"interrupted at epoch {epoch + 1}, step {step + 1}; "
                    f"state saved to {self.config.resume_path}"
                )
        self.epoch, self.step = epoch + 1, 0

    def clock(self):
        """Seconds of training so far (an interrupted run's included), kept in elapsed."""
        self.elapsed = time.time() - self.start_time
        return self.elapsed

    def batch(self, dataset, step):
        """Batch number `step` of an epoch, on the CPU: the original loader's order (no
        shuffling). Every process builds the whole batch, with the same random spans."""
        bs = self.config.batch_size
        examples = [dataset[i] for i in range(step * bs, min((step + 1) * bs, len(dataset)))]
        x = torch.stack([x for x, _ in examples])  # (b, T)
        y = torch.stack([y for _, y in examples])  # (b, T)
        return x, y

    def loss(self, x, y):
        """GPT.forward's loss of the CPU batch x, y; on the CPU, on only the positions that
        can change it (packing.py, worked out before the batch moves). Under torchrun,
        this process's share of it (distributed.shard_loss)."""
        if self.ddp is not None:
            return distributed.shard_loss(self, x, y)
        packing = self.packing(target_lengths(y))
        x, y = self.to_device(x, y)
        with devices.autocast(self.device, self.config.precision):
            return self.model(x, y, packing=packing)[1]

    def eager_step(self, x, y):
        """One training step on the CPU batch (x, y), as written here: its loss."""
        loss = self.loss(x, y)
        self.update(loss)
        return loss

    def packing(self, lengths):
        """The Packing of rows with these target lengths where training packs (the CPU),
        else None: the whole padded batch (devices.packs_batches)."""
        return Packing(lengths, device=self.device) if self.packs else None

    def update(self, loss):
        """One optimizer step on the gradient of loss, clipped to grad_norm_clip. With fp16,
        the gradients are unscaled before clipping, and a step whose gradients overflowed
        is skipped (the scaler then lowers its scale)."""
        self.model.zero_grad(set_to_none=True)
        self.scaler.scale(loss).backward()
        self.scaler.unscale_(self.optimizer)
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.grad_norm_clip)
        self.scaler.step(self.optimizer)
        self.scaler.update()

    def set_lr(self, lr):
        """The learning rate of the next steps: a rate held as a device tensor (a CUDA
        graph's, cuda_graphs.py) is written in place."""
        for param_group in self.optimizer.param_groups:
            if torch.is_tensor(param_group['lr']):
                param_group['lr'].fill_(lr)
            else:
                param_group['lr'] = lr

    def to_device(self, *tensors):
        return [devices.to_device(t, self.device) for t in tensors]

    def tokens_per_s(self, steps, T):
        """Target positions per second, counted like the schedule (batch x T per step)."""
        run_time = max(self.elapsed - self.resumed_elapsed, 1e-9)
        return steps * self.config.batch_size * T / run_time

    @torch.no_grad()
    def test_loss(self):
        self.model.eval()
        losses = []
        for step in range(math.ceil(len(self.test_dataset) / self.config.batch_size)):
            x, y = self.batch(self.test_dataset, step)
            packing = self.packing(target_lengths(y))
            x, y = self.to_device(x, y)
            losses.append(self.model(x, y, packing=packing)[1].item())  # fp32, as evaluation
        print("test loss: %f" % np.mean(losses))
        self.model.train()

    def save_checkpoint(self, epoch):
        config = self.config
        if config.ckpt_path is None or self.rank > 0 or (epoch + 1) % config.save_every:
            return
        path = config.ckpt_path.format(epoch=epoch + 1)
        files.atomic_save(params_files.written_params(self.model), path)

    def save_state(self):
        """The resumable state, written to config.resume_path (resume.save)."""
        resume.save(self)
