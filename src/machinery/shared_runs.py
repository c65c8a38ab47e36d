"""Several pretrainings of one variant in one process, stepping together: on a GPU that
one small model leaves mostly idle, K runs with different seeds share it.

The K models are stacked into one batched model (torch.func.stack_module_state) and the
handout's model runs on them unchanged, through vmap over functional_call: one forward
and one backward for all K runs, each run's loss its own. Each run keeps what its run
alone has (run.py pretrain --seed S on CUDA, or on the CPU with the batches built ahead):
- its batches: the seeded batches of batch_producer.py, from its own batch seed;
- its dropout masks: drawn from its own random state, site by site, with the code its
  run alone draws with (dropout.keep_mask on the CPU, torch's fused dropout on CUDA),
  and handed into the vmapped model (MaskedDropout);
- its gradient clipping: its own norm over its own gradients, as clip_grad_norm_ takes it;
- its learning rate: the same schedule (the runs' tokens move together), and AdamW over
  the stacked weights is elementwise, so one optimizer steps each run as its own would;
- its resumable state and params file: a Trainer per run holds them, each the state and
  params file of that run alone (run.py --resume and --reading_params_path take them).
A run's params are those of its run alone to within the rounding of batched matrix
products (tests/test_shared_runs.py measures it); with dropout off or on.

A non-finite loss in one run stops the group: the other runs' states are saved where they
are, the faulted run keeps its last good state (as a run alone does). Ctrl-C or SIGTERM
saves every run's state after the step, and the same command continues.

On CUDA the step is replayed from CUDA graphs unless --eager (GraphedSharedStep), all but
the masks: those are drawn eagerly before each step, each run's state swapped into CUDA's
generator on the host, which a captured graph would not repeat. Training is fp32 only
(PRECISION_REFUSED says why), and torch.compile is not taken.

    python src/machinery/shared_runs.py pretrain vanilla wiki.txt --seeds 0 1 2 \\
        --writing_params_paths v.s0.params v.s1.params v.s2.params

research/grid.py --share K runs its pretrainings this way, K to a process.
"""

import os
import sys

if __name__ == '__main__':  # run as a script: src/ on the path in place of its folder
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

import machinery.cpu_libraries  # noqa: E402,F401 (MKL's and oneDNN's settings before torch)

import argparse  # noqa: E402
import contextlib  # noqa: E402
import copy  # noqa: E402
import functools  # noqa: E402
import random  # noqa: E402
import shlex  # noqa: E402
import time  # noqa: E402

import numpy as np
import torch
import torch.nn as nn
from torch.func import functional_call, stack_module_state, vmap
from torch.utils.data import DataLoader, Dataset

from machinery import (
    batch_producer,
    checks,
    cuda_graphs,
    devices,
    dropout,
    files,
    metrics,
    resume,
)

# Under vmap, autocast does not choose as it does for a run alone: ops that vmap takes
# apart before autocast sees them run in bf16 where a run alone's run in fp32 (on the
# CPU the loss itself, a bf16 number), so a run's params would not be its own within
# rounding. Until that is worked around, runs share a process in fp32 only.
PRECISION_REFUSED = (
    "--precision {}: runs that share a process train in fp32 only (under vmap, autocast "
    "would put some of a run alone's fp32 ops in bf16); add --precision fp32"
)


class RunRandom:
    """One run's random states (Python's, numpy's, torch's CPU one and CUDA's), as its run
    alone holds them in the process's global generators. `active()` puts them there for a
    while and takes them back after, the process's own put back."""

    def __init__(self, device):
        self.device = device
        self.capture()

    def capture(self):
        self.python, self.numpy = resume.random_states()
        self.torch = resume.torch_rng_state(self.device)

    def put(self):
        random.setstate(self.python)
        np.random.set_state(self.numpy)
        resume.set_torch_rng_state(self.torch, self.device)

    @contextlib.contextmanager
    def active(self):
        process = RunRandom(self.device)
        self.put()
        try:
            yield
        finally:
            self.capture()
            process.put()


class MaskedDropout(nn.Module):
    """A Dropout layer of the batched model: in training it applies the next of the masks
    handed in (drawn outside vmap, one per run, from each run's own state); while the
    sites are being found, it records the shape and dtype of what it drops."""

    masks = None  # an iterator over the step's masks, one per site, in call order
    sites = None  # a list: (shape, dtype, p) of each site, while recording

    def __init__(self, p):
        super().__init__()
        self.p = p

    def forward(self, x):
        if not self.training or self.p == 0:
            return x
        if self.p >= 1:
            return x * 0.0
        if MaskedDropout.sites is not None:
            MaskedDropout.sites.append((tuple(x.shape), x.dtype, self.p))
            return x
        keep = next(MaskedDropout.masks)  # x's shape, bool
        # what dropout.py's CPU function and torch's fused CUDA kernel compute
        return torch.where(keep, x, 0) * (1.0 / (1.0 - self.p))


def draw_mask(shape, dtype, p, device):
    """The keep mask a run alone's dropout draws for an input of this shape and dtype
    (from the global generators, where RunRandom.active puts the run's own): on the CPU
    dropout.py's, on CUDA the fused kernel's (nn.Dropout's there), which draws by numel
    and by how it vectorises: the dtype and a fresh contiguous input, as the model's are."""
    if device == 'cpu':
        return dropout.keep_mask(torch.Size(shape), p)
    return torch.native_dropout(ones(shape, dtype, device), p, True)[1]


@functools.cache
def ones(shape, dtype, device):
    return torch.ones(shape, dtype=dtype, device=device)


def batched_model(model):
    """A copy of model without weights (on the meta device, functional_call gives it the
    stacked ones), its dropout layers MaskedDropout."""
    base = copy.deepcopy(model).to('meta')
    for name, layer in list(base.named_modules()):
        if isinstance(layer, nn.Dropout):
            parent, _, child = name.rpartition('.')
            setattr(base.get_submodule(parent) if parent else base, child, MaskedDropout(layer.p))
    return base


class SeededGroupBatches(Dataset):
    """Item (k, indices): batch k of every run at once, each built from its own batch seed
    as batch_producer.SeededBatches builds it: (K, b, T) numpy arrays."""

    def __init__(self, dataset, seeds):
        self.runs = [batch_producer.SeededBatches(dataset, seed) for seed in seeds]

    def __getitem__(self, key):
        batches = [run[key] for run in self.runs]
        return np.stack([x for x, _ in batches]), np.stack([y for _, y in batches])


def group_batches(dataset, batch_size, epoch, step, max_epochs, seeds, workers):
    """The (x, y) batches left, each (K, b, T), from worker processes (workers > 0) or from
    this one (its generators put back after each batch)."""
    runs = batch_producer.RunBatches(len(dataset), batch_size, epoch, step, max_epochs)
    source = SeededGroupBatches(dataset, seeds)
    if workers == 0:
        for key in runs:
            with torch.random.fork_rng(devices=[]):
                state = resume.random_states()
                x, y = source[key]
                random.setstate(state[0])
                np.random.set_state(state[1])
            yield torch.from_numpy(x), torch.from_numpy(y)
        return
    loader = DataLoader(
        source,
        batch_size=None,
        sampler=runs,
        num_workers=workers,
        collate_fn=batch_producer.as_is,
        worker_init_fn=batch_producer.start_worker,
        prefetch_factor=batch_producer.PREFETCH,
        generator=torch.Generator(),
    )
    with batch_producer.stop_signals_ignored():
        iterator = iter(loader) if len(runs) else iter(())
    try:
        for x, y in iterator:
            yield torch.from_numpy(x), torch.from_numpy(y)
    finally:
        shutdown = getattr(iterator, '_shutdown_workers', None)
        if shutdown is not None:
            shutdown()


def stacked_groups(trainer, params):
    """The groups of the trainer's optimizer (Trainer.make_optimizer's: weight decay or
    none) over the stacked weights `params` (name -> (K, ...)), in its order."""
    name_of = {id(p): n for n, p in trainer.model.named_parameters()}
    return [
        {'params': [params[name_of[id(p)]] for p in group['params']],
         'weight_decay': group['weight_decay']}
        for group in trainer.optimizer.param_groups
    ]  # fmt: skip


class SharedRuns:
    """K Trainers of one variant and one config but for their seeds, trained together.
    Each trainer is built as its run alone builds it (the model seeded and initialised,
    a resumable state loaded) and nothing drawn since: its random states are taken from
    the process's at construction (`randoms`, one RunRandom per trainer, in order)."""

    def __init__(self, trainers, randoms, workers=None, graphs=False):
        self.trainers, self.randoms = trainers, randoms
        first = trainers[0]
        self.config, self.device, self.K = first.config, first.device, len(trainers)
        if self.config.precision != 'fp32':
            raise files.UserError(PRECISION_REFUSED.format(self.config.precision))
        self.workers = workers
        self.names = [n for n, p in first.model.named_parameters() if p.requires_grad]
        models = [t.model for t in trainers]
        params, _ = stack_module_state(models)  # name -> (K, ...) leaf, requires grad
        self.params = {n: params[n] for n in self.names}
        self.buffers = dict(first.model.named_buffers())  # constants: one copy for all runs
        self.base = batched_model(first.model)
        self.optimizer = torch.optim.AdamW(
            stacked_groups(first, self.params),
            lr=first.optimizer.param_groups[0]['lr'],
            betas=self.config.betas,
            fused=devices.fused_adamw(self.device),
        )
        self.load_optimizers()
        self.sites = {}  # (b, T) -> [(shape, dtype, p)] of the dropout sites
        self.stopper = resume.Stopper(self.config.resume_path)
        # the step after the masks replayed from CUDA graphs (or, on the CPU, its stand-in)
        self.graphed = GraphedSharedStep(self) if graphs else None

    # --- moving state between the stacked model and the runs' trainers

    def load_optimizers(self):
        """The runs' optimizer states (restored from their states, or empty) stacked."""
        states = [t.optimizer.state_dict() for t in self.trainers]
        if not states[0]['state']:
            return
        stacked = {
            i: {
                name: value
                if name == 'step'
                else torch.stack([s['state'][i][name] for s in states])
                for name, value in moments.items()
            }
            for i, moments in states[0]['state'].items()
        }
        self.optimizer.load_state_dict(
            {'state': stacked, 'param_groups': states[0]['param_groups']}
        )

    @torch.no_grad()
    def unstack(self):
        """Each trainer's model and optimizer given its run's slice of the stacked ones."""
        full = self.optimizer.state_dict()
        for k, t in enumerate(self.trainers):
            named = dict(t.model.named_parameters())
            for n in self.names:
                named[n].copy_(self.params[n][k])
            state = {
                i: {m: v.clone() if m == 'step' else v[k].clone() for m, v in moments.items()}
                for i, moments in full['state'].items()
            }
            t.optimizer.load_state_dict(
                {'state': state, 'param_groups': copy.deepcopy(full['param_groups'])}
            )

    def save_states(self, runs=None):
        """The resumable state of each run (all, or those listed) written to its own
        resume_path, each as its run alone writes it."""
        self.unstack()
        for k in range(self.K) if runs is None else runs:
            with self.randoms[k].active():
                resume.save(self.trainers[k])

    # --- the step

    def find_sites(self, x, y):
        """(shape, dtype, p) of each dropout site, in call order, for batches of x's shape."""
        MaskedDropout.sites = []
        try:
            with torch.no_grad():
                self.losses(x, y, [])
            return MaskedDropout.sites
        finally:
            MaskedDropout.sites = None

    def draw_masks(self, sites):
        """Each site's masks: (K, *shape) bool, run k's from its own random state."""
        per_run = []
        for k in range(self.K):
            with self.randoms[k].active():
                per_run.append([draw_mask(s, d, p, self.device) for s, d, p in sites])
        return [torch.stack(masks) for masks in zip(*per_run)]  # each (K, *shape)

    def losses(self, x, y, masks):
        """Each run's loss on its batch: x, y (K, b, T) on the device -> (K,)."""

        def loss(params, x, y, masks):
            MaskedDropout.masks = iter(masks)
            with devices.autocast(self.device, self.config.precision):
                return functional_call(self.base, (params, self.buffers), (x, y))[1]

        return vmap(loss, in_dims=(0, 0, 0, 0))(self.params, x, y, masks)  # (K,)

    def step(self, x, y):
        """One training step of every run on its CPU batch: x, y (K, b, T) -> losses (K,)."""
        x, y = (devices.to_device(t, self.device) for t in (x, y))  # (K, b, T) each
        self.base.train()
        shape = tuple(x.shape[1:])
        if shape not in self.sites:
            self.sites[shape] = self.find_sites(x, y)
        masks = self.draw_masks(self.sites[shape])  # drawn eagerly, each run from its own state
        if self.graphed is not None:
            return self.graphed(x, y, masks)
        return self.step_on(x, y, masks)

    def step_on(self, x, y, masks):
        """The step on device tensors, masks drawn: losses (K,); every run updated. No
        host sync: a CUDA graph can hold it."""
        losses = self.losses(x, y, masks)  # (K,)
        self.optimizer.zero_grad(set_to_none=True)
        losses.sum().backward()  # the runs share no weights: each gets its own gradient
        self.clip()
        self.optimizer.step()
        return losses.detach()

    @torch.no_grad()
    def clip(self):
        """Each run's gradients clipped to grad_norm_clip by its own norm, as
        clip_grad_norm_ clips a run alone's (the same norm and scaling, on its slices)."""
        grads = [self.params[n].grad for n in self.names]  # (K, ...) each
        max_norm = float(self.config.grad_norm_clip)
        for k in range(self.K):
            run = [g[k] for g in grads]
            total = torch.nn.utils.get_total_norm(run, 2.0)
            coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
            torch._foreach_mul_(run, coef)

    def set_lr(self, lr):
        """The next steps' learning rate: a rate held as a device tensor (the graphs') is
        written in place."""
        for group in self.optimizer.param_groups:
            if torch.is_tensor(group['lr']):
                group['lr'].fill_(lr)
            else:
                group['lr'] = lr

    # --- the loop

    def check_together(self):
        """Every run continues from the same point (its state's epoch, step and tokens)."""
        points = {(t.epoch, t.step, t.tokens) for t in self.trainers}
        if len(points) > 1:
            where = ', '.join(
                f"{t.config.resume_path}: epoch {t.epoch + 1}, step {t.step}" for t in self.trainers
            )
            raise files.UserError(
                f"runs that share a process continue from one point, and these stopped at "
                f"different ones ({where}); continue each alone with run.py --resume"
            )

    def train(self):
        """config.max_epochs epochs of every run (with config.resume, what is left)."""
        config, first = self.config, self.trainers[0]
        checks.check_examples(first.train_dataset)
        self.check_together()
        steps_per_epoch = first.steps_per_epoch
        before = first.epoch * steps_per_epoch + first.step
        start, last_save = time.time() - first.elapsed, time.time()
        for t, random_states in zip(self.trainers, self.randoms):
            t.resumed_elapsed, t.steps_before = t.elapsed, before
            if t.batch_seed is None:
                with random_states.active():
                    t.batch_seed = batch_producer.batch_seed()
        workers = self.workers
        if workers is None:
            workers = (
                batch_producer.worker_count() if devices.builds_batches_ahead(self.device) else 0
            )
        batches = group_batches(
            first.train_dataset, config.batch_size, first.epoch, first.step,
            config.max_epochs, [t.batch_seed for t in self.trainers], workers,
        )  # fmt: skip
        logs = [
            metrics.MetricsLog(t.config.metrics_path, t.config.resume, t.config.tensorboard_dir,
                               before)
            for t in self.trainers
        ]  # fmt: skip
        total = config.max_epochs * steps_per_epoch
        bar = metrics.Bar(total=total, initial=before, unit='step', dynamic_ncols=True,
                          smoothing=0.05, disable=total == 0)  # fmt: skip

        def clock():
            for t in self.trainers:
                t.elapsed = time.time() - start
            return first.elapsed

        try:
            with self.stopper:
                for epoch in range(first.epoch, config.max_epochs):
                    for step in range(first.step, steps_per_epoch):
                        x, y = next(batches)
                        losses = self.step(x, y)  # (K,)
                        tokens = first.tokens + y[0].numel()
                        lr = first.lr_at(tokens)
                        self.set_lr(lr)
                        for t, log, loss in zip(self.trainers, logs, losses):
                            t.tokens, t.epoch, t.step = tokens, epoch, step + 1
                            log.add(epoch, epoch * steps_per_epoch + step + 1, loss, lr, tokens)
                        bar.update(1)  # every step; the losses where they are read
                        logged = (step + 1) % config.log_every == 0 or step == steps_per_epoch - 1
                        if logged:
                            last = self.flush(logs, clock())
                            bar.set_description(
                                f"epoch {epoch + 1} iter {step}: train losses "
                                + ' '.join(f"{v:.4f}" for v in last)
                                + f". lr {lr:e}"
                            )
                        if self.stopper.asked():
                            self.flush(logs, clock())
                            self.save_states()
                            raise resume.TrainingInterrupted(
                                f"interrupted at epoch {epoch + 1}, step {step + 1}; every "
                                f"run's state saved ({', '.join(self.resume_paths())})"
                            )
                    for t in self.trainers:
                        t.epoch, t.step = epoch + 1, 0
                    self.flush(logs, clock())
                    self.save_checkpoints(epoch)
                    overdue = time.time() - last_save >= config.save_every_s
                    if config.resume_path and overdue:
                        self.save_states()
                        last_save = time.time()
        finally:
            bar.close()
            batches.close()
            for log in logs:
                log.close()
        clock()
        for t, log in zip(self.trainers, logs):
            t.steps_run = t.epoch * steps_per_epoch + t.step - before
            t.final_loss = log.last_loss
        self.unstack()

    def resume_paths(self):
        return [t.config.resume_path for t in self.trainers]

    def flush(self, logs, seconds):
        """Every run's logged rows written; a non-finite loss in any stops the group, the
        others' states saved. Returns each run's last loss."""
        faults = []
        for k, log in enumerate(logs):
            try:
                log.flush(seconds)
            except metrics.NonFiniteLoss as e:
                faults.append((k, e))
        if faults:
            healthy = [k for k in range(self.K) if k not in {k for k, _ in faults}]
            if self.config.resume_path:
                self.save_states(healthy)
            bad = '; '.join(
                f"run {k} ({self.trainers[k].config.resume_path}): {e}, "
                f"{resume.kept(self.trainers[k].config.resume_path)}"
                for k, e in faults
            )
            saved = ', '.join(self.trainers[k].config.resume_path for k in healthy) or 'none'
            raise metrics.NonFiniteLoss(
                f"{bad}; the group stopped, the other runs' states saved ({saved}); a lower "
                f"learning rate may help"
            )
        return [log.last_loss for log in logs]

    def save_checkpoints(self, epoch):
        if self.config.ckpt_path is None or (epoch + 1) % self.config.save_every:
            return
        self.unstack()
        for t in self.trainers:
            t.save_checkpoint(epoch)


class GraphedSharedStep(cuda_graphs.Graphs):
    """SharedRuns.step_on replayed from CUDA graphs (cuda_graphs.Graphs, as a run alone's
    step is), the batch and each dropout site's masks the graph's inputs. The masks are
    drawn before, eagerly, from each run's own state: the graph holds no random draw. On
    the CPU each "replay" is a plain call on the same static buffers (the tests' stand-in)."""

    def __init__(self, group):
        cuda_graphs.check(group.device, 1, stand_in=True)
        super().__init__(group.device)
        self.group = group

    @property
    def optimizer(self):
        return self.group.optimizer

    def __call__(self, x, y, masks):
        """Every run's loss (K,) on the device batch x, y (K, b, T) and the step's masks."""
        return self.replayed(x, y, *masks)

    def step_on(self, x, y, *masks):
        return self.group.step_on(x, y, list(masks))


# --- the command: run.py's pretrain for several seeds at once ---------------------------


def build_runs(argv, seeds, paths):
    """(trainers, randoms, graphs): each seed's run as run.py builds it for
    `run.py pretrain ... --seed S --writing_params_path P` (its settings and checks,
    its resumable state with --resume)."""
    import run  # src/'s handout files, imported here: they import this package
    from trainer import Trainer

    trainers, randoms = [], []
    for seed, path in zip(seeds, paths):
        args = run.parse_args([*argv, '--seed', str(seed), '--writing_params_path', path])
        if args.function != 'pretrain':
            raise files.UserError("runs share a process for pretraining only")
        if args.compile:
            raise files.UserError("--compile: not for runs that share a process")
        run.check_args(args)
        gpt, data, config = handout_pretraining(run, args)
        device = devices.pick_device(args.device)
        run.add_settings(config, args, device)
        graphs = devices.training_paths(device, 1, args.eager, False, args.cuda_graph)[1]
        config.compile = config.cuda_graph = False  # the group steps with its own step
        t = Trainer(gpt, data, None, config)
        t.args = args
        config.resume = args.resume and os.path.exists(config.resume_path)
        if config.resume:  # a run without a state starts afresh (check_together decides)
            resume.load(config.resume_path, t)
        randoms.append(RunRandom(device))
        trainers.append(t)
    return trainers, randoms, graphs


def handout_pretraining(run, args):
    """(model, dataset, TrainerConfig) of run.py's pretrain for args: its own function
    called with its train() held back, so that the handout's settings stay in one place."""
    built = []
    handout_train = run.train
    run.train = lambda args, gpt, dataset, config: built.append((gpt, dataset, config))
    try:
        run.pretrain(args)
    finally:
        run.train = handout_train
    return built[0]


def write_params(trainers):
    """Each run's params file, its resumable state removed and its last line printed, as
    run.py's are."""
    import run

    for t in trainers:
        run.write_params(t, t.args, 'pretrain')


def parse_args(argv):
    argp = argparse.ArgumentParser(
        description=__doc__.split('\n\n')[0],
        epilog="Any other arguments are run.py's, passed to each run (pretrain VARIANT CORPUS ...)",
    )
    argp.add_argument('--seeds', nargs='+', type=int, required=True)
    argp.add_argument('--writing_params_paths', nargs='+', required=True)
    args, rest = argp.parse_known_args(argv)
    if len(args.seeds) != len(args.writing_params_paths):
        argp.error("one --writing_params_paths per seed")
    return args, rest


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args, rest = parse_args(argv)
    status = 0
    try:
        trainers, randoms, graphs = build_runs(rest, args.seeds, args.writing_params_paths)
        first = trainers[0].config
        print(
            f"pretrain, {len(trainers)} runs in one process (seeds "
            f"{' '.join(map(str, args.seeds))}): {first.max_epochs} epochs, batch "
            f"{first.batch_size}, lr {first.learning_rate:g}, on {trainers[0].device}, "
            f"{devices.PRECISION_NAMES[first.precision]}"
            f"{', replayed from CUDA graphs' if graphs else ''}"
        )
        SharedRuns(trainers, randoms, graphs=graphs).train()
        write_params(trainers)
    except files.UserError as e:
        status = files.report(e)
    except resume.TrainingInterrupted as e:
        again = [a for a in argv if a != '--resume'] + ['--resume']
        command = shlex.join(['python', 'src/machinery/shared_runs.py', *again])
        print(f"\n{e}. To continue: {command}", file=sys.stderr)
        status = 130
    except metrics.NonFiniteLoss as e:
        print(f"error: {e}", file=sys.stderr)
        status = 3
    except KeyboardInterrupt:  # before training started, or a second Ctrl-C
        print("\ninterrupted; each run keeps the state it last saved", file=sys.stderr)
        status = 130
    if status:
        sys.exit(status)


if __name__ == '__main__':
    main()
