"""The whole training step replayed from a CUDA graph: on CUDA, what training does for one
process unless run.py's --eager says otherwise (devices.training_paths).

The model is small enough that a GPU waits on Python and on launching some thousand
kernels a step, not on arithmetic. Here the trainer's own step (the model's loss as
Trainer.loss computes it on a GPU, then Trainer.update: backward, fp16's unscaling,
gradient clipping, AdamW and the loss scaler's update) is captured once into a CUDA
graph and then replayed, one launch a step. With --compile the graph holds the compiled
kernels (devices.compile_model):
- the batch is copied into static input buffers, one pair (and one graph) per batch
  shape: an epoch's full batches and its shorter last one; where the model is compiled,
  the shorter batch is padded with rows of PAD instead, whose targets the loss ignores,
  so that a phase has one shape and one compilation (the loss is the same but for
  rounding);
- AdamW is fused and capturable, and its learning rate is a device tensor that the
  schedule writes before each replay (Trainer.set_lr); the fused kernel reads it in
  fp32, so a rate that fp32 cannot hold exactly is rounded (eager passes a double);
- clipping, the unscaling and the scaler's update run on the device without a host
  sync; a step whose fp16 gradients overflowed is skipped inside the fused AdamW;
- dropout draws from CUDA's default generator (compiled dropout too), which graphs
  advance as eager code does;
- each step's loss is copied out of the graph's buffer, and the trainer reads the copies
  every log interval (metrics.MetricsLog).
The first WARMUP steps, and the first step of each new batch shape, run eagerly on a side
stream (they compile the model, set up AdamW's moments, the scaler and the kernels the
shape needs), as PyTorch's notes on whole-network capture ask; they are real steps, with
the learning rate already the tensor the graphs read, so that a resumed run repeats them
exactly. Each Graphs has a side stream of its own (PyTorch's pool holds 32), and
captures on it too: PyTorch gives cuBLAS one workspace per stream, which a graph keeps, so
runs' graphs captured on streams of their own can be replayed at once on several streams
(bench.py --concurrent) without two matrix products writing one workspace. Their dropout
is not each run's own there: every graph draws from CUDA's one default generator, whose
offset each replay sets first.
A step that cannot be captured (a model that reads a tensor's value on the host, say)
stops the run at its fourth step with one line naming the first error and --eager: a
failed capture leaves CUDA's random generator unusable in the process.

Elsewhere (the tests on a CPU) every "replay" is a plain call of the same step on the same
static buffers: everything here but the capture itself.
"""

import torch

from machinery import devices
from machinery.files import UserError

WARMUP = 3


def check(device, processes, stand_in=False):
    """--cuda_graph's conditions, checked before training starts; stand_in: the CPU's
    plain calls (the tests') are allowed too."""
    if device != 'cuda' and not (stand_in and device == 'cpu'):
        raise UserError(f"--cuda_graph: for CUDA GPUs only, and this runs on the {device}")
    if processes > 1:
        raise UserError("--cuda_graph: one process only; under torchrun, leave it out")


def pad_rows(x, y, rows):
    """The batch (x, y), each (b, T), with rows of PAD (id 0, whose targets the loss
    ignores) added up to `rows`: (rows, T) each."""
    missing = rows - x.size(0)
    if missing <= 0:
        return x, y
    return torch.cat([x, x.new_zeros(missing, x.size(1))]), torch.cat(
        [y, y.new_zeros(missing, y.size(1))]
    )


class Captured:
    """One batch shape's graph: its static inputs and the loss it writes."""

    def __init__(self, inputs):
        self.inputs = [torch.empty_like(t) for t in inputs]  # x, y (b, T), ... on the device
        self.loss = None  # the step's loss, overwritten by each replay
        self.graph = None  # torch.cuda.CUDAGraph, or None without capture


class Graphs:
    """A training step `step_on(*inputs)` (device tensors in, the loss out, the optimizer's
    step inside) eager for the first WARMUP steps and each batch shape's first, then
    replayed from the graph of the inputs' shape (captured the first time that shape
    comes). A subclass gives step_on and `optimizer`."""

    def __init__(self, device):
        self.device = device
        self.capture = device == 'cuda'
        self.eager_left = WARMUP
        self.seen = set()  # the batch shapes stepped on eagerly
        self.captured = {}  # the first input's shape -> Captured
        self.lr = None  # the device tensor AdamW reads its learning rate from
        self.stream = torch.cuda.Stream() if self.capture else None  # eager steps, capture

    def replayed(self, *inputs):
        """The loss of one training step on the device tensors `inputs`."""
        self.make_lr_a_tensor()
        shape = tuple(inputs[0].shape)
        if self.eager_left or shape not in self.seen:
            self.eager_left = max(0, self.eager_left - 1)
            self.seen.add(shape)
            return self.eager_step(inputs)
        if shape not in self.captured:
            self.captured[shape] = self.capture_step(inputs)
        step = self.captured[shape]
        for static, value in zip(step.inputs, inputs):
            static.copy_(value, non_blocking=True)
        if step.graph is not None:
            step.graph.replay()
        else:
            step.loss = self.step_on(*step.inputs)
        return step.loss.clone()  # the next replay overwrites step.loss

    def eager_step(self, inputs):
        if not self.capture:
            return self.step_on(*inputs)
        self.stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.stream):
            loss = self.step_on(*inputs)
        torch.cuda.current_stream().wait_stream(self.stream)
        return loss

    def capture_step(self, inputs):
        """The graph of the step on inputs of these shapes (recorded, not run: the caller
        fills its inputs and replays it)."""
        step = Captured(inputs)
        if not self.capture:
            return step
        for group in self.optimizer.param_groups:
            group['capturable'] = True
        torch.cuda.synchronize()
        step.graph = torch.cuda.CUDAGraph()
        self.optimizer.zero_grad(set_to_none=True)  # the graph allocates its gradients
        try:
            with torch.cuda.graph(step.graph, stream=self.stream):
                step.loss = self.step_on(*step.inputs)
        except RuntimeError as e:  # the first error's line: ending the capture raises its own
            # a failed capture leaves CUDA's random generator unusable in this process
            raise UserError(
                f"the training step cannot be replayed from a CUDA graph "
                f"({devices.first_cause(e)}); run the command again with --eager"
            ) from e
        return step

    def make_lr_a_tensor(self):
        """AdamW's learning rate as a device tensor (the schedule writes it)."""
        if self.lr is not None:
            return
        optimizer = self.optimizer
        lr = optimizer.param_groups[0]['lr']
        # fp32 where the fused CUDA kernel reads it; the CPU's AdamW computes with it, in
        # the double precision it gives a Python number
        dtype = torch.float32 if self.capture else torch.float64
        self.lr = torch.tensor(float(lr), dtype=dtype, device=self.device)
        for group in optimizer.param_groups:
            group['lr'] = self.lr


class GraphedStep(Graphs):
    """trainer's step on a batch (x, y), replayed from CUDA graphs (Graphs)."""

    def __init__(self, trainer):
        config = trainer.config
        check(trainer.device, trainer.world_size, stand_in=True)
        super().__init__(trainer.device)
        self.trainer = trainer
        self.rows = min(config.batch_size, len(trainer.train_dataset))  # a full batch's

    @property
    def optimizer(self):
        return self.trainer.optimizer

    def __call__(self, x, y):
        """The loss of one training step on the CPU batch (x, y); the model is updated."""
        trainer = self.trainer
        if devices.is_compiled(trainer.model):  # one shape, one compilation
            x, y = pad_rows(x, y, self.rows)
        x, y = trainer.to_device(x, y)
        return self.replayed(x, y)

    def step_on(self, x, y):
        """The trainer's step on the device batch (x, y), as Trainer.loss and update do
        it on a GPU (the whole padded batch): its loss; the model is updated. Autocast's
        cache of cast weights is off: a cast cached inside a graph must not outlive it."""
        trainer = self.trainer
        with devices.autocast(trainer.device, trainer.config.precision, cache_enabled=False):
            loss = trainer.model(x, y)[1]
        trainer.update(loss)
        return loss.detach()
