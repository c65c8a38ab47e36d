"""cuda_graphs.py (--cuda_graph): the training step replayed from CUDA graphs trains as the
eager step does. On the CPU the capture is replaced by a plain call of the same step on
the same static buffers, which checks everything but the capture: the warm-up steps,
one buffer pair per batch shape (an epoch's short last batch its own), the learning rate
as a tensor the schedule writes, the copied-out losses, and resumable states; bit for bit. On a CUDA
GPU (skipped elsewhere) the real graphs against the eager step, in each precision."""

import random

import pytest
import torch

import trainer
from machinery import cuda_graphs, resume
from machinery.files import UserError
from test_trainer import tiny_setup

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason='no CUDA GPU here')


def train(graphed, device='cpu', **overrides):
    """The tiny setup trained whole-batch (as a GPU trains); returns the trainer, the
    per-step losses and the learning rates its optimizer held at each step."""
    random.seed(0)
    gpt, ds, config = tiny_setup(device=device, cuda_graph=graphed, log_every=1, **overrides)
    t = trainer.Trainer(gpt, ds, None, config)
    t.packs = False
    losses, rates = [], []
    step = t.unlogged_step = t.train_step

    def logged_step(x, y):
        loss = step(x, y)
        losses.append(loss.item())
        rates.append(float(t.optimizer.param_groups[0]['lr']))  # the rate this step used
        return loss

    t.train_step = logged_step
    t.train()
    return t, losses, rates


def test_graphed_step_trains_as_the_eager_step_bit_for_bit():
    """The cosine schedule writes the rate into the tensor AdamW reads, at every step."""
    eager, eager_losses, eager_rates = train(False)
    graphed, graphed_losses, graphed_rates = train(True)
    assert graphed_losses == eager_losses
    assert len(graphed_rates) == 15 and graphed_rates == eager_rates
    assert len(set(eager_rates)) > 8  # warm-up, then decay: most steps a new rate
    for (name, p), q in zip(eager.model.named_parameters(), graphed.model.parameters()):
        assert torch.equal(p, q), name
    step = graphed.unlogged_step
    # 3 eager warm-up steps, each shape's first step eager (the epoch's short last batch:
    # epoch 1), then one buffer pair per shape: 8 rows, and the epoch's last 5
    assert step.eager_left == 0 and sorted(step.captured) == [(5, 31), (8, 31)]
    assert all(group['lr'] is step.lr for group in graphed.optimizer.param_groups)


@pytest.mark.parametrize('precision', ['bf16', 'fp16'])
def test_graphed_step_in_each_precision(precision):
    """bf16 and fp16 (the loss scaler's unscaling and update inside the step)."""
    settings = dict(learning_rate=2**-10, lr_decay=False, precision=precision)
    _, eager_losses, _ = train(False, **settings)
    graphed, graphed_losses, _ = train(True, **settings)
    assert graphed_losses == eager_losses
    assert graphed.scaler.is_enabled() == (precision == 'fp16')


def train_interrupted(tmp_path, stop_at, resumed_settings, **settings):
    """The tiny setup stopped (as by Ctrl-C) during step stop_at, then resumed with
    resumed_settings instead and trained to the end; returns the saved state as it was
    and the final params."""
    path = str(tmp_path / 'state.resume')
    random.seed(0)
    gpt, ds, config = tiny_setup(resume_path=path, **settings)
    t = trainer.Trainer(gpt, ds, None, config)
    t.packs, step, steps = False, t.train_step, []

    def counted_step(x, y):
        steps.append(1)
        if len(steps) == stop_at:
            t.stopper.signal = 2
        return step(x, y)

    t.train_step = counted_step
    with pytest.raises(resume.TrainingInterrupted):
        t.train()
    saved = torch.load(path, weights_only=True)
    random.seed(1)
    gpt, ds, config = tiny_setup(resume_path=path, resume=True, **resumed_settings)
    t = trainer.Trainer(gpt, ds, None, config)
    t.packs = False
    t.train()
    return saved, gpt.state_dict()


@pytest.mark.parametrize('resumed_with_graphs', [True, False])
def test_graphed_run_resumes_exactly_with_or_without_graphs(tmp_path, resumed_with_graphs):
    """Stopped after its graphs took over. The saved optimizer holds its learning rate as
    a number and is not capturable, so the state resumes without graphs too; either way
    the params are the straight graphed run's."""
    settings = dict(learning_rate=2**-10, lr_decay=False)
    straight = train(True, **settings)[0].model.state_dict()
    saved, resumed = train_interrupted(
        tmp_path,
        cuda_graphs.WARMUP + 4,
        dict(settings, cuda_graph=resumed_with_graphs),
        cuda_graph=True,
        **settings,
    )
    for group in saved['optimizer']['param_groups']:
        assert isinstance(group['lr'], float) and group['capturable'] is False
    for k in straight:
        assert torch.equal(straight[k], resumed[k]), k


def test_conditions_of_the_flag():
    cuda_graphs.check('cuda', 1, False)
    cuda_graphs.check('cpu', 1, False, stand_in=True)  # the tests' plain calls
    with pytest.raises(UserError, match='CUDA GPUs only'):
        cuda_graphs.check('mps', 1, False, stand_in=True)
    for device, processes, compile, why in [
        ('cpu', 1, False, 'CUDA GPUs only'),
        ('mps', 1, False, 'CUDA GPUs only'),
        ('cuda', 2, False, 'one process only'),
        ('cuda', 1, True, '--compile'),
    ]:
        with pytest.raises(UserError, match=why):
            cuda_graphs.check(device, processes, compile)


@CUDA
@pytest.mark.parametrize('precision', ['fp32', 'bf16', 'fp16'])
def test_cuda_graphs_train_as_the_eager_step(precision):
    """Real graphs: dropout on, the short last batch's graph, fp16's scaler; within
    rounding of the eager CUDA step (some GPU kernels are not deterministic)."""
    if precision == 'bf16' and torch.cuda.get_device_capability() < (8, 0):
        pytest.skip('no native bf16')
    settings = dict(learning_rate=2**-10, lr_decay=False, precision=precision)
    eager, eager_losses, _ = train(False, 'cuda', **settings)
    graphed, graphed_losses, _ = train(True, 'cuda', **settings)
    assert all(c.graph is not None for c in graphed.unlogged_step.captured.values())
    assert len(graphed.unlogged_step.captured) == 2
    tolerance = dict(rtol=1e-4, atol=1e-5) if precision == 'fp32' else dict(rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(graphed_losses, eager_losses, **tolerance)
    for (name, p), q in zip(eager.model.named_parameters(), graphed.model.parameters()):
        torch.testing.assert_close(q, p, **tolerance, msg=name)


@CUDA
def test_cuda_graph_run_resumes_on_cuda(tmp_path):
    """Stopped after its graphs took over and resumed with graphs: the straight graphed
    run's params, within rounding."""
    settings = dict(learning_rate=2**-10, lr_decay=False, device='cuda', cuda_graph=True)
    straight = train(True, **{k: v for k, v in settings.items() if k != 'cuda_graph'})
    straight = straight[0].model.state_dict()
    _, resumed = train_interrupted(tmp_path, cuda_graphs.WARMUP + 4, settings, **settings)
    for k in straight:
        torch.testing.assert_close(resumed[k], straight[k], rtol=1e-4, atol=1e-5, msg=k)
