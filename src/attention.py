"""The attention layers that plug into the GPT of model.py, as the handout writes them;
each class's docstring says which equations it computes.

Each forward() takes plain (B, T, C) tensors whose positions start at 0, in training and in
evaluation, and computes the handout's equations written out: the parts a student writes
have these signatures, and a student's code and ours are interchangeable. What makes
training and decoding fast is done around these calls, never inside them (packing.py,
src/machinery/). Their parameter names match the original starter
code, so .params files load both ways.
"""

import math

import torch
import torch.nn as nn
from torch.nn import functional as F


# [part g, 2024]
def precompute_rotary_emb(dim, max_positions):
    """RoPE's rotations for head size `dim`: a (max_positions, dim/2, 2) tensor holding
    (cos(t theta_i), sin(t theta_i)) for position t and pair i, theta_i = 10000^(-2(i-1)/d)
    for i = 1..d/2 (the handout's formula; the course's starter had the exponent's sign wrong
    in this docstring)."""
    theta = 10000.0 ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)  # (dim/2,)
    angles = (
        torch.arange(max_positions, dtype=torch.float64)[:, None] * theta[None, :]
    )  # (T, dim/2)
    return torch.stack((angles.cos(), angles.sin()), dim=-1).float()  # (T, dim/2, 2)


# [part g, 2024]
def apply_rotary_emb(x, rope_cache):
    """Rotates each adjacent pair (x_{2i-1}, x_{2i}) of x (B, nh, T, hs) at position t by
    t theta_i, using the first T rows of rope_cache: the complex product
    (x_{2i-1} + i x_{2i}) e^{i t theta_i}."""
    T = x.size(-2)
    cos, sin = rope_cache[:T, :, 0], rope_cache[:T, :, 1]  # (T, hs/2)
    pairs = x.unflatten(-1, (-1, 2))  # (B, nh, T, hs/2, 2)
    real, imag = pairs[..., 0], pairs[..., 1]  # (B, nh, T, hs/2)
    rotated = torch.stack(
        (real * cos - imag * sin, real * sin + imag * cos), dim=-1
    )  # (B, nh, T, hs/2, 2)
    return rotated.flatten(-2)  # (B, nh, T, hs)


def causal_mask(block_size):
    """(1, 1, block_size, block_size): 1 where attention is allowed (key j <= query i)."""
    return torch.tril(torch.ones(block_size, block_size)).view(1, 1, block_size, block_size)


class CausalSelfAttention(nn.Module):
    """A vanilla multi-head masked self-attention layer with a projection at the end
    (handout eq. 9-10)."""

    def __init__(self, config):
        super().__init__()
        assert config.n_embd % config.n_head == 0
        # key, query, value projections for all heads
        self.key = nn.Linear(config.n_embd, config.n_embd)
        self.query = nn.Linear(config.n_embd, config.n_embd)
        self.value = nn.Linear(config.n_embd, config.n_embd)
        # regularization
        self.attn_drop = nn.Dropout(config.attn_pdrop)
        self.resid_drop = nn.Dropout(config.resid_pdrop)
        # output projection
        self.proj = nn.Linear(config.n_embd, config.n_embd)
        # causal mask to ensure that attention is only applied to the left in the input sequence
        self.register_buffer("mask", causal_mask(config.block_size))
        self.n_head = config.n_head
        # [2024] rotary position embeddings: q and k rotated by their positions
        self.rope = config.rope
        # [part g, 2024] the buffer rope_cache: precompute_rotary_emb for a head's size
        if self.rope:
            self.register_buffer(
                "rope_cache",
                precompute_rotary_emb(config.n_embd // config.n_head, config.block_size),
            )

    def forward(self, x):
        """Handout eq. 9-10 on x (B, T, C): per head i, softmax((x Q_i)(x K_i)^T / sqrt(d/h))
        (x V_i) with a causal mask, the heads side by side, then the projection."""
        B, T, C = x.size()
        nh, hs = self.n_head, C // self.n_head
        # query, key, values for all heads, the head moved forward to be a batch dimension
        k = self.key(x).view(B, T, nh, hs).transpose(1, 2)  # (B, nh, T, hs)
        q = self.query(x).view(B, T, nh, hs).transpose(1, 2)  # (B, nh, T, hs)
        v = self.value(x).view(B, T, nh, hs).transpose(1, 2)  # (B, nh, T, hs)
        # [part g, 2024] rotate q and k (not v) by their positions 0..T-1 (apply_rotary_emb)
        if self.rope:
            q = apply_rotary_emb(q, self.rope_cache)  # (B, nh, T, hs)
            k = apply_rotary_emb(k, self.rope_cache)  # (B, nh, T, hs)
        # causal self-attention: (B, nh, T, hs) x (B, nh, hs, T) -> (B, nh, T, T)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))  # (B, nh, T, T)
        att = att.masked_fill(self.mask[:, :, :T, :T] == 0, float('-inf'))
        att = self.attn_drop(F.softmax(att, dim=-1))
        y = att @ v  # (B, nh, T, hs)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # (B, T, C): heads side by side
        return self.resid_drop(self.proj(y))  # (B, T, C)


# [2021]
class SynthesizerAttention(nn.Module):
    """Handout eq. 11: per head i, softmax(ReLU(X A_i + b_1) B_i + b_2) (X V_i).
    w1 holds A_i and b_1 of all heads; w2 is B_i and b2 is b_2, shared by the heads as in
    the original, with one column per position."""

    def __init__(self, config):
        super().__init__()
        assert config.n_embd % config.n_head == 0
        # NOTE: the original starter's names, so that params load both ways
        self.w1 = nn.Linear(config.n_embd, config.n_embd)
        self.w2 = nn.Parameter(torch.zeros(config.n_embd // config.n_head, config.block_size - 1))
        self.b2 = nn.Parameter(torch.zeros(config.block_size - 1))
        # value projection
        self.value = nn.Linear(config.n_embd, config.n_embd)
        # output projection
        self.proj = nn.Linear(config.n_embd, config.n_embd)
        # regularization
        self.attn_drop = nn.Dropout(config.attn_pdrop)
        self.resid_drop = nn.Dropout(config.resid_pdrop)
        # causal mask to ensure that attention is only applied to the left in the input sequence
        self.register_buffer("mask", causal_mask(config.block_size))
        self.n_head = config.n_head
        self.block_size = config.block_size
        nn.init.uniform_(self.w2, -0.001, 0.001)

    # [part g, 2021]
    def forward(self, x):
        """Handout eq. 11 on x (B, T, C): per head i, softmax(ReLU(x A_i + b_1) B_i + b_2)
        (x V_i), B_i and b_2 cut to the T positions, with a causal mask; the heads side by
        side, then the projection."""
        B, T, C = x.size()
        nh, hs = self.n_head, C // self.n_head
        assert T <= self.block_size - 1, 'the synthesizer has block_size-1 positions'
        a = F.relu(self.w1(x)).view(B, T, nh, hs).transpose(1, 2)  # (B, nh, T, hs)
        v = self.value(x).view(B, T, nh, hs).transpose(1, 2)  # (B, nh, T, hs)
        # each row's scores over the positions come from that row alone
        att = a @ self.w2[:, :T] + self.b2[:T]  # (B, nh, T, T)
        att = att.masked_fill(self.mask[:, :, :T, :T] == 0, float('-inf'))
        att = self.attn_drop(F.softmax(att, dim=-1))
        y = att @ v  # (B, nh, T, hs)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # (B, T, C): heads side by side
        return self.resid_drop(self.proj(y))  # (B, T, C)


# [2023]
class CausalCrossAttention(CausalSelfAttention):
    """Multi-head attention of the queries x_q (B, Tq, C) over the keys and values x_kv
    (B, Tk, C), with a projection at the end: perceiver.py's DownProjectBlock and
    UpProjectBlock are built on it. Its layers and their names are CausalSelfAttention's,
    as in the course's starter. The causal mask is
    the block_size one cut to [:Tq, :Tk]: query i sees x_kv's positions 0..i."""

    def forward(self, x_kv, x_q):
        Bk, Tk, C = x_kv.size()
        Bq, Tq, _ = x_q.size()  # Bq may be 1 (a basis shared by the batch), broadcast
        nh, hs = self.n_head, C // self.n_head
        k = self.key(x_kv).view(Bk, Tk, nh, hs).transpose(1, 2)  # (B, nh, Tk, hs)
        q = self.query(x_q).view(Bq, Tq, nh, hs).transpose(1, 2)  # (B, nh, Tq, hs)
        v = self.value(x_kv).view(Bk, Tk, nh, hs).transpose(1, 2)  # (B, nh, Tk, hs)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))  # (B, nh, Tq, Tk)
        att = att.masked_fill(self.mask[:, :, :Tq, :Tk] == 0, float('-inf'))
        att = self.attn_drop(F.softmax(att, dim=-1))
        y = att @ v  # (B, nh, Tq, hs)
        y = y.transpose(1, 2).contiguous().view(Bk, Tq, C)  # (B, Tq, C): heads side by side
        return self.resid_drop(self.proj(y))  # (B, Tq, C)
