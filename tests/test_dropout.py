"""The CPU dropout against what dropout must be: the right rate, independent draws, the
1/(1-p) scale, the same mask in the backward pass, and torch's own dropout elsewhere."""

import math

import pytest
import torch
import torch.nn as nn

import bench
import trainer
from machinery import dropout
from test_trainer import tiny_setup


@pytest.mark.parametrize("p", [0.1, 0.5, 0.97])
def test_mask_rate_and_independence(p):
    torch.manual_seed(0)
    n = 1 << 21
    dropped = ~dropout.keep_mask(torch.Size([n]), p)
    sigma = math.sqrt(p * (1 - p) / n)
    assert abs(dropped.float().mean().item() - p) < 6 * sigma
    # the two halves of each 64-bit draw, and neighbouring draws, are independent
    for a, b in ((dropped[0::2], dropped[1::2]), (dropped[0:-2:2], dropped[2::2])):
        both = (a & b).float().mean().item()
        assert abs(both - p * p) < 6 * math.sqrt(p * p * (1 - p * p) / len(a))


def test_forward_scales_kept_values_and_backward_reuses_the_mask():
    torch.manual_seed(0)
    layer = dropout.Dropout(0.1).train()
    x = torch.rand(64, 127, 256) + 1.0  # no zeros, so a zero output means dropped
    x.requires_grad_(True)
    y = layer(x)
    kept = y != 0
    assert 0.09 < 1 - kept.float().mean().item() < 0.11
    torch.testing.assert_close(y[kept], x[kept] / 0.9, rtol=1e-6, atol=0)
    y.backward(torch.full_like(y, 2.0))
    torch.testing.assert_close(x.grad, kept * (2.0 / 0.9), rtol=1e-6, atol=0)


def test_bf16_stays_bf16():
    x = torch.ones(1000, dtype=torch.bfloat16, requires_grad=True)
    y = dropout.Dropout(0.1).train()(x)
    assert y.dtype == torch.bfloat16
    y.sum().backward()
    assert x.grad.dtype == torch.bfloat16


def test_seeded_and_fresh_masks():
    layer = dropout.Dropout(0.1).train()
    x = torch.ones(10000)
    torch.manual_seed(3)
    first, second = layer(x), layer(x)
    torch.manual_seed(3)
    assert torch.equal(layer(x), first)
    assert not torch.equal(first, second)


def test_torch_dropout_where_ours_does_not_apply():
    x = torch.randn(1000)
    assert torch.equal(dropout.Dropout(0.1).eval()(x), x)
    assert torch.equal(dropout.Dropout(0.0).train()(x), x)
    assert torch.equal(dropout.Dropout(1.0).train()(x), torch.zeros_like(x))


def test_the_trainer_draws_faster_and_bench_plain_path_keeps_torch_dropout():
    """The model's code writes torch's nn.Dropout, as a student's does; the Trainer makes
    those layers dropout.Dropout from outside, and bench.py's baseline, the original code,
    has torch's own again."""
    gpt, ds, config = tiny_setup()
    layers = [m for m in gpt.modules() if isinstance(m, nn.Dropout)]
    assert len(layers) == 1 + 2 * 3 and all(type(m) is nn.Dropout for m in layers)
    trainer.Trainer(gpt, ds, None, config)
    assert all(type(m) is dropout.Dropout and m.p == 0.1 for m in layers)
    bench.torch_dropout(gpt)
    assert all(type(m) is nn.Dropout for m in layers)
