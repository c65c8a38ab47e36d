"""packing.py against the plain computation: the packed loss and its gradients equal
forward()'s on the padded batch, for every variant, at every row length."""

import random

import pytest
import torch

import trainer
from conftest import packed_loss
from machinery.packing import Packing
from test_model import BLOCK, SMALL, VARIANTS, make_gpt, ragged_batch
from test_trainer import tiny_setup


@pytest.mark.parametrize('variant', VARIANTS)
@pytest.mark.parametrize('leading_pad', [False, True])
def test_packed_loss_equals_plain_loss_and_gradients(variant, leading_pad):
    gpt = make_gpt(variant, **SMALL, sharp=True).eval()
    idx, targets = ragged_batch(40, leading_pad=leading_pad)
    _, plain = gpt(idx, targets)
    plain.backward()
    plain_grads = {n: p.grad.clone() for n, p in gpt.named_parameters()}
    gpt.zero_grad()
    packed = packed_loss(gpt, idx, targets)
    packed.backward()
    torch.testing.assert_close(packed, plain, atol=1e-6, rtol=1e-5)
    for n, p in gpt.named_parameters():
        torch.testing.assert_close(p.grad, plain_grads[n], atol=1e-5, rtol=1e-4, msg=n)


def test_packed_loss_of_a_share_of_the_rows():
    """What each of several processes computes (Trainer.loss under torchrun, simulated
    with the model standing in for its DDP wrapper): its rows' summed loss over the whole
    batch's target count, times the process count as DDP averages the gradients. The
    shares average to forward()'s mean."""
    random.seed(0)
    gpt, ds, config = tiny_setup()
    t = trainer.Trainer(gpt.eval(), ds, None, config)
    x, y = t.batch(ds, 0)
    _, plain = gpt(x, y)
    shares = []
    for rank in range(3):
        t.ddp, t.rank, t.world_size = gpt, rank, 3
        shares.append(t.loss(x, y))
    torch.testing.assert_close(sum(shares) / 3, plain, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize('variant', VARIANTS)
def test_packed_loss_at_assignment_size_every_length(variant):
    """fp32 eval: same loss as forward() for every row length up to 127 (128 for the
    2024 edition's examples, which the synthesizer cannot take)."""
    gpt = make_gpt(variant, sharp=True).eval()
    T = BLOCK - 1 if variant == 'synthesizer' else BLOCK
    idx = torch.randint(2, 256, (T, T))
    targets = torch.randint(2, 256, (T, T))
    for b in range(T):  # row b has b+1 targets
        targets[b, b + 1 :] = 0
        idx[b, b + 1 :] = 0
    with torch.no_grad():
        for rows in (slice(0, 1), slice(60, 61), slice(T - 1, T), slice(0, T)):
            _, plain = gpt(idx[rows], targets[rows])
            torch.testing.assert_close(
                packed_loss(gpt, idx[rows], targets[rows]), plain, atol=1e-5, rtol=1e-5
            )


def test_packing_round_trip():
    lengths = torch.tensor([3, 0, 7, 1, 7, 5, 2])
    packing = Packing(lengths, groups=3)
    batch = torch.arange(7 * 9).view(7, 9)
    kept = packing.select(batch)
    assert sorted(kept.tolist()) == [
        b * 9 + t for b, n in enumerate(lengths.tolist()) for t in range(n)
    ]
    x = torch.randn(len(kept), 5)
    padded = packing.unpack(x)
    assert [p.shape[:2] for p in padded] == [
        (2, 7),
        (2, 5),
        (2, 2),
    ]  # by length; the empty row dropped
    assert torch.equal(packing.repack(padded), x)
