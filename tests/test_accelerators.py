"""CUDA and Apple's MPS against the CPU: these run only where such a device is present,
and are skipped, saying so, everywhere else (the rest of the suite pins the CPU, whose
results it checks bit for bit). A few training steps in each precision the device offers
against fp32 on the CPU, compiled ones (--compile, CUDA) against eager ones, the packed
loss against the plain one, cached greedy decoding against the plain decoder, an
interrupted and resumed run against a straight one, and 53 epochs of the handout's
pretraining against the published CPU run's losses."""

import random

import pytest
import torch

import measure_gpu
import run
import trainer
import utils
from conftest import ROOT, packed_loss, stopped_at_call
from machinery import decoding, dropout, resume
from test_distributed import csv_losses
from test_model import SMALL, VARIANTS, make_gpt, ragged_batch
from test_trainer import tiny_setup

DEVICES = [
    pytest.param(
        'cuda', marks=pytest.mark.skipif(not torch.cuda.is_available(), reason='no CUDA GPU here')
    ),
    pytest.param(
        'mps',
        marks=pytest.mark.skipif(not torch.backends.mps.is_available(), reason='no Apple GPU here'),
    ),
]


def offers(device, precision):
    """Whether `device` trains in `precision` (bf16 natively from compute capability 8.0)."""
    if device == 'cuda' and precision == 'bf16':
        return torch.cuda.get_device_capability() >= (8, 0)
    return True


def train_steps(device, precision, steps=5, compile=False):
    """The tiny setup without dropout: each step's loss, and the first step's gradients."""
    random.seed(0)
    gpt, ds, config = tiny_setup(precision=precision, device=device, compile=compile)
    dropout.switched_off(gpt)
    t = trainer.Trainer(gpt, ds, None, config)
    losses, first_grads = [], None
    for step in range(steps):
        loss = t.loss(*t.batch(ds, step % 4))
        t.update(loss)
        losses.append(loss.item())
        if first_grads is None:
            first_grads = {n: p.grad.float().cpu() for n, p in gpt.named_parameters()}
    return losses, first_grads


@pytest.mark.parametrize('device', DEVICES)
@pytest.mark.parametrize('precision', ['fp32', 'bf16', 'fp16'])
def test_training_steps_match_the_cpu(device, precision):
    if not offers(device, precision):
        pytest.skip(f'{device} has no native {precision}')
    assert_close_training(train_steps(device, precision), train_steps('cpu', 'fp32'), precision)


@pytest.mark.parametrize('device', DEVICES[:1])
@pytest.mark.parametrize('precision', ['fp32', 'bf16', 'fp16'])
def test_compiled_training_steps_match_eager(device, precision):
    """--compile with inductor's GPU kernels (tests/test_devices.py checks the graph on
    the CPU)."""
    if not offers(device, precision):
        pytest.skip(f'{device} has no native {precision}')
    torch._dynamo.reset()
    compiled = train_steps(device, precision, compile=True)
    assert_close_training(compiled, train_steps(device, precision), precision)


def assert_close_training(steps, expected_steps, precision):
    """Losses and first gradients of train_steps within the precision's tolerance."""
    (losses, grads), (expected_losses, expected_grads) = steps, expected_steps
    loss_tolerance, grad_tolerance = (1e-4, 1e-3) if precision == 'fp32' else (2e-2, 5e-2)
    torch.testing.assert_close(
        torch.tensor(losses), torch.tensor(expected_losses), rtol=loss_tolerance, atol=0
    )
    # relative to each gradient's size, with a floor: some (the key biases') are zero but for rounding
    floor = 1e-3 * torch.cat([g.flatten() for g in expected_grads.values()]).norm()
    for name, grad in grads.items():
        error = (grad - expected_grads[name]).norm() / (expected_grads[name].norm() + floor)
        assert error < grad_tolerance, name


@pytest.mark.parametrize('device', DEVICES)
@pytest.mark.parametrize('variant', VARIANTS)
def test_packed_loss_equals_plain_loss(device, variant):
    gpt = make_gpt(variant, **SMALL, sharp=True).eval().to(device)
    idx, targets = (t.to(device) for t in ragged_batch(40, leading_pad=True))
    with torch.no_grad():
        _, plain = gpt(idx, targets)
        packed = packed_loss(gpt, idx, targets)
    torch.testing.assert_close(packed, plain, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize('device', DEVICES)
@pytest.mark.parametrize('variant', VARIANTS)
def test_cached_decoding_equals_plain_decoding(device, variant):
    gpt = make_gpt(variant, **dict(SMALL, vocab=12), sharp=True).eval().to(device)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(2, 12, (n,), generator=g) for n in [5, 9, 5, 17, 9, 40, 1]]
    plains = [utils.sample(gpt, p[None].to(device), 32)[0, len(p) :].tolist() for p in prompts]
    assert decoding.greedy_complete(gpt, prompts, 32, stop_id=-1, batch_size=2) == plains


@pytest.mark.parametrize('device', DEVICES)
def test_interrupted_run_resumes_to_the_same_losses(tmp_path, device):
    """Dropout on: the device's random state is part of the resumable state, so the resumed
    run's losses are the straight run's (other dropout masks would move them by percents).
    Compared within rounding, not bit for bit: some GPU kernels are not deterministic."""

    def run(metrics, resume=False, stop_at=None):
        gpt, ds, config = tiny_setup(
            device=device,
            precision='fp32',
            resume=resume,
            metrics_path=str(metrics),
            resume_path=str(tmp_path / 'state.resume'),
            log_every=1,
        )
        t = trainer.Trainer(gpt, ds, None, config)
        gpt.forward = stopped_at_call(stop_at, gpt.forward, t)
        t.train()

    random.seed(0)
    run(tmp_path / 'straight.csv')
    random.seed(0)
    with pytest.raises(resume.TrainingInterrupted):
        run(tmp_path / 'resumed.csv', stop_at=7)
    random.seed(1)
    torch.manual_seed(1)
    run(tmp_path / 'resumed.csv', resume=True)
    losses = [csv_losses(tmp_path / name) for name in ('straight.csv', 'resumed.csv')]
    assert len(losses[0]) == len(losses[1]) == 15
    torch.testing.assert_close(
        torch.tensor(losses[1]), torch.tensor(losses[0]), rtol=1e-4, atol=1e-6
    )


COMPILED_BF16_DIVERGES = pytest.mark.xfail(
    strict=True,
    reason="compiled with bf16, the H200 run's loss rose from step 30 and became nan "
    "(torch 2.11); this passes once that is fixed",
)


@pytest.mark.parametrize('device', DEVICES[:1])
@pytest.mark.parametrize(
    'flags',
    [
        [],
        ['--compile', '--precision', 'fp32'],
        pytest.param(['--compile'], marks=COMPILED_BF16_DIVERGES),
    ],
    ids=['default', 'compiled-fp32', 'compiled-bf16'],
)
def test_pretraining_learns_as_on_the_cpu(real_data, tmp_path, device, flags):
    """53 epochs of the handout's vanilla pretraining (1,219 steps: 10 s on an H200 with
    CUDA graphs) in the device's default precision, and compiled: its mean loss over steps
    1,100-1,219 is the published CPU run's within 0.15. On an H100 (torch 2.11, bf16),
    training through torch's fused attention with its own dropout had a mean 0.65 above it
    there (and its 650-epoch model answered no dev question); the written-out attention's
    was 0.05 above, and the H200's graphed run 0.09."""
    params = tmp_path / 'vanilla.pretrain.params'
    args = ['pretrain', 'vanilla', 'wiki.txt', '--writing_params_path', str(params)]
    torch._dynamo.reset()
    run.main(args + ['--max_epochs', '53', '--device', device, *flags])
    reference = ROOT / 'results' / 'vanilla.pretrain.params.metrics.csv'
    here, there = (
        measure_gpu.late_mean_loss(path, 1100, 1219)
        for path in (params.with_name(params.name + '.metrics.csv'), reference)
    )
    assert abs(here - there) < 0.15, (here, there)
