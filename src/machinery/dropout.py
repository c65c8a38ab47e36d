"""nn.Dropout with its masks drawn faster on the CPU (README: Speed).

On the CPU, torch's dropout draws one 64-bit random number per element (bernoulli_, in
double precision) and keeps a float mask for the backward pass. Here each 64-bit draw
gives two 32-bit ones, and an element is dropped when its number falls in the lowest
round(p * 2^32) of the 2^32 values: dropout with probability p to within 2^-33. The
draws come from numpy's SFC64 generator, seeded by a draw from torch's generator, so
torch.manual_seed still fixes every mask and resumed runs stay exact. The backward pass
reuses the mask, kept as one byte per element. On a GPU, torch's fused dropout is used
as it is. The model's code (a student's too) writes torch's nn.Dropout; the trainer makes
those layers this one from outside (use_in).
"""

import numpy as np
import torch
import torch.nn as nn


class Dropout(nn.Dropout):
    def forward(self, x):
        if not self.training or not 0 < self.p < 1 or x.device.type != "cpu":
            return super().forward(x)
        return _CpuDropout.apply(x, self.p)


def switched_off(model):
    """model with each of its dropout layers' p set to 0 (torch's and this module's): for
    comparisons of two ways of running it, which would draw other masks."""
    for layer in model.modules():
        if isinstance(layer, nn.Dropout):
            layer.p = 0.0
    return model


def use_in(model):
    """Makes each of model's torch nn.Dropout layers a Dropout of this module (the same
    layer, p and all: only how the CPU draws its masks differs)."""
    for layer in model.modules():
        if type(layer) is nn.Dropout:
            layer.__class__ = Dropout
    return model


def keep_mask(shape, p):
    """A bool tensor of the given shape: each element False with probability p."""
    n = shape.numel()
    seed = int(torch.randint(2**62, ()))  # from torch's generator, so torch.manual_seed rules
    draws = np.random.SFC64(seed).random_raw((n + 1) // 2)  # 64 random bits each
    bits = torch.from_numpy(draws.view(np.int32))[:n]  # (n,) uniform over the 2^32 int32 values
    return (bits >= round(p * 2**32) - 2**31).view(shape)


class _CpuDropout(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, p):
        keep = keep_mask(x.shape, p)
        ctx.save_for_backward(keep)
        ctx.scale = 1.0 / (1.0 - p)
        return torch.where(keep, x, 0).mul_(ctx.scale)

    @staticmethod
    def backward(ctx, grad):
        (keep,) = ctx.saved_tensors
        return torch.where(keep, grad, 0).mul_(ctx.scale), None
