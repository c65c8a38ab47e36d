"""The attention variants that plug into the GPT of model.py.

CausalSelfAttention is handout eq. 9-10 (in evaluation through torch's
scaled_dot_product_attention); with config.rope (2024/25 editions) it rotates queries and keys
by their positions (precompute_rotary_emb, apply_rotary_emb).
SynthesizerAttention is handout eq. 11, where the scores of each position come from that
position alone instead of from pairs of positions.
CausalCrossAttention (2023 edition, the perceiver) takes keys/values from one sequence and
queries from another; perceiver.py's DownProjectBlock and UpProjectBlock are built on it.

Each forward() is the handout's computation, written out; it is what trains, on every
device. Evaluation, which has no dropout, runs torch's fused kernel instead (fused_attention,
which tests/test_model.py holds equal to the written-out computation). Training never uses
the fused kernels' own dropout: on an H100 in bf16, pretraining through it stalled far
above the CPU run's losses and the finetuned model answered no dev question (README,
"Measured on one GPU"). The self-attentions take, besides x, two optional
arguments that make them faster without changing the result:
  packing  x holds only the positions that can change the loss, as (N, C) rows
           (packing.py); attention needs whole rows, so it runs on groups of padded rows.
  cache    a KVCache keeping the keys and values of earlier positions, so that greedy
           decoding feeds only the newest position (decoding.greedy_complete).
Their parameter names match the original starter code, so .params files load both ways.
"""

import math

import torch
import torch.nn as nn
from torch.nn import functional as F

from dropout import Dropout
from packing import padded_groups, repacked


def split_heads(x, n_head):
    B, T, C = x.size()
    return x.view(B, T, n_head, C // n_head).transpose(1, 2)  # (B, nh, T, hs)


def merge_heads(y):
    B, nh, T, hs = y.size()
    return y.transpose(1, 2).reshape(B, T, nh * hs)  # (B, T, C): heads side by side


def fused_attention(q, k, v, mask, past):
    """softmax(q k^T / sqrt(hs), causal) v in torch's fused kernel, without dropout (for
    evaluation): (B, nh, Tq, hs). Query i
    stands at position past+i and sees keys 0..past+i: the block_size mask cut to
    [past:past+Tq, :Tk], or the kernel's own causal mask where that is the same."""
    Tq, Tk = q.size(2), k.size(2)
    if past == 0 and Tq == Tk:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    allowed = mask[:, :, past : past + Tq, :Tk].bool()  # (1, 1, Tq, Tk)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)


class KVCache:
    """One attention layer's keys and values of the positions decoded so far, so that each
    decoding step feeds only its newest position (decoding.greedy_complete)."""

    def __init__(self):
        self.k = self.v = None

    @property
    def past(self):
        """How many positions are cached."""
        return 0 if self.v is None else self.v.size(2)

    def extend(self, k, v):
        """(B, nh, T, hs) keys and values of new positions -> those of all positions so far,
        (B, nh, past+T, hs). k may be None (the synthesizer has no keys)."""
        if self.v is not None:
            k = None if k is None else torch.cat((self.k, k), dim=2)
            v = torch.cat((self.v, v), dim=2)
        self.k, self.v = k, v
        return k, v


# [part g, 2024]
def precompute_rotary_emb(dim, max_positions):
    """RoPE's rotations for head size `dim`: a (max_positions, dim/2, 2) tensor holding
    (cos(t theta_i), sin(t theta_i)) for position t and pair i, theta_i = 10000^(-2(i-1)/d)
    for i = 1..d/2 (the 2024 handout's formula; the starter's docstring has the sign wrong)."""
    theta = 10000.0 ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)  # (dim/2,)
    angles = (
        torch.arange(max_positions, dtype=torch.float64)[:, None] * theta[None, :]
    )  # (T, dim/2)
    return torch.stack((angles.cos(), angles.sin()), dim=-1).float()  # (T, dim/2, 2)


# [part g, 2024]
def apply_rotary_emb(x, rope_cache):
    """Rotates each adjacent pair (x_{2i-1}, x_{2i}) of x (B, nh, T, hs) at position t by
    t theta_i, using the first T rows of rope_cache: the complex product
    (x_{2i-1} + i x_{2i}) e^{i t theta_i}. Callers slice the cache to start at the first
    position's absolute index (see CausalSelfAttention.forward)."""
    T = x.size(-2)
    dtype = torch.promote_types(x.dtype, torch.float32)  # rotate bf16 (autocast) q, k in fp32
    cos, sin = rope_cache[:T, :, 0].to(dtype), rope_cache[:T, :, 1].to(dtype)  # (T, hs/2)
    pairs = x.to(dtype).unflatten(-1, (-1, 2))  # (B, nh, T, hs/2, 2)
    real, imag = pairs[..., 0], pairs[..., 1]  # (B, nh, T, hs/2)
    rotated = torch.stack(
        (real * cos - imag * sin, real * sin + imag * cos), dim=-1
    )  # (B, nh, T, hs/2, 2)
    return rotated.flatten(-2).type_as(x)  # (B, nh, T, hs)


class CausalSelfAttention(nn.Module):
    """A vanilla multi-head masked self-attention layer with a projection at the end."""

    def __init__(self, config):
        super().__init__()
        assert config.n_embd % config.n_head == 0
        self.key = nn.Linear(config.n_embd, config.n_embd)
        self.query = nn.Linear(config.n_embd, config.n_embd)
        self.value = nn.Linear(config.n_embd, config.n_embd)
        self.attn_drop = Dropout(config.attn_pdrop)
        self.resid_drop = Dropout(config.resid_pdrop)
        self.proj = nn.Linear(config.n_embd, config.n_embd)
        # causal mask, 1 where attention is allowed; kept in the state_dict as the original does
        self.register_buffer(
            "mask",
            torch.tril(torch.ones(config.block_size, config.block_size)).view(
                1, 1, config.block_size, config.block_size
            ),
        )
        self.n_head = config.n_head
        self.rope = getattr(config, 'rope', False)
        # [part g, 2024] the buffer rope_cache: precompute_rotary_emb for a head's size
        if self.rope:
            # kept in the state_dict under the 2024 starter's name, as the mask is
            self.register_buffer(
                "rope_cache",
                precompute_rotary_emb(config.n_embd // config.n_head, config.block_size),
            )

    def forward(self, x, packing=None, cache=None):
        """Handout eq. 9-10 on x (B, T, C): per head i, softmax((x Q_i)(x K_i)^T / sqrt(d/h))
        (x V_i) with a causal mask, the heads side by side, then the projection."""
        queries, keys, values = self.query(x), self.key(x), self.value(x)  # (B, T, C), or (N, C)
        ys = []
        for q, k, v in padded_groups(packing, queries, keys, values):  # each (b, T, C)
            q, k, v = (split_heads(z, self.n_head) for z in (q, k, v))  # (B, nh, T, hs)
            past = 0 if cache is None else cache.past  # positions decoded before these
            # [part g, 2024] rotate q and k (not v) by their positions past, past+1, ...
            if self.rope:  # rotated at their absolute positions, before joining cached keys
                q = apply_rotary_emb(q, self.rope_cache[past:])  # (B, nh, T, hs)
                k = apply_rotary_emb(k, self.rope_cache[past:])  # (B, nh, T, hs)
            if cache is not None:
                k, v = cache.extend(k, v)  # (B, nh, past+T, hs)
            Tq, Tk = q.size(2), k.size(2)
            if self.training:
                # scaled and masked in place: the scores are the step's biggest tensor
                att = (q @ k.transpose(-2, -1)).mul_(1.0 / math.sqrt(k.size(-1)))  # (B, nh, Tq, Tk)
                att.masked_fill_(self.mask[:, :, past : past + Tq, :Tk] == 0, float('-inf'))
                y = self.attn_drop(F.softmax(att, dim=-1)) @ v  # (B, nh, Tq, hs)
            else:  # the same in torch's fused kernel
                y = fused_attention(q, k, v, self.mask, past)  # (B, nh, Tq, hs)
            ys.append(merge_heads(y))  # (B, T, C)
        return self.resid_drop(self.proj(repacked(packing, ys)))  # (B, T, C), or (N, C)


class SynthesizerAttention(nn.Module):
    """Handout eq. 11: per head i, softmax(ReLU(X A_i + b_1) B_i + b_2) (X V_i).
    w1 holds A_i and b_1 of all heads; w2 is B_i and b2 is b_2, shared by the heads as in
    the original, with one column per position."""

    def __init__(self, config):
        super().__init__()
        assert config.n_embd % config.n_head == 0
        self.w1 = nn.Linear(config.n_embd, config.n_embd)
        self.w2 = nn.Parameter(torch.zeros(config.n_embd // config.n_head, config.block_size - 1))
        self.b2 = nn.Parameter(torch.zeros(config.block_size - 1))
        self.value = nn.Linear(config.n_embd, config.n_embd)
        self.proj = nn.Linear(config.n_embd, config.n_embd)
        self.attn_drop = Dropout(config.attn_pdrop)
        self.resid_drop = Dropout(config.resid_pdrop)
        self.register_buffer(
            "mask",
            torch.tril(torch.ones(config.block_size, config.block_size)).view(
                1, 1, config.block_size, config.block_size
            ),
        )
        self.n_head = config.n_head
        self.block_size = config.block_size
        nn.init.uniform_(self.w2, -0.001, 0.001)

    # [part g, 2021]
    def forward(self, x, packing=None, cache=None):
        """Handout eq. 11 on x (B, T, C): per head i, softmax(ReLU(x A_i + b_1) B_i + b_2)
        (x V_i) with a causal mask, the heads side by side, then the projection."""
        hidden, values = F.relu(self.w1(x)), self.value(x)  # (B, T, C), or packed (N, C)
        ys = []
        for a, v in padded_groups(packing, hidden, values):  # each (b, T, C)
            a, v = split_heads(a, self.n_head), split_heads(v, self.n_head)  # (B, nh, T, hs)
            past = 0 if cache is None else cache.past  # positions decoded before these
            if cache is not None:
                _, v = cache.extend(None, v)  # (B, nh, past+T, hs)
            T = a.size(2)
            assert past + T <= self.block_size - 1, 'the synthesizer has block_size-1 positions'
            # each row's scores over positions 0..past+T-1 come from that row alone
            scores = a @ self.w2[:, : past + T] + self.b2[: past + T]  # (B, nh, T, past+T)
            scores.masked_fill_(self.mask[:, :, past : past + T, : past + T] == 0, float('-inf'))
            att = self.attn_drop(F.softmax(scores, dim=-1))  # (B, nh, T, past+T)
            ys.append(merge_heads(att @ v))  # (B, T, C)
        return self.resid_drop(self.proj(repacked(packing, ys)))  # (B, T, C), or (N, C)


class CausalCrossAttention(CausalSelfAttention):
    """Multi-head attention of the queries x_q (B, Tq, C) over the keys and values x_kv
    (B, Tk, C), with a projection at the end (the 2023 edition's perceiver). Its layers
    and their names are CausalSelfAttention's, as in the 2023 starter. The causal mask is
    the block_size one cut to [:Tq, :Tk]: query i sees x_kv's positions 0..i."""

    def forward(self, x_kv, x_q):
        q = split_heads(self.query(x_q), self.n_head)  # (B, nh, Tq, hs)
        k = split_heads(self.key(x_kv), self.n_head)  # (B, nh, Tk, hs)
        v = split_heads(self.value(x_kv), self.n_head)  # (B, nh, Tk, hs)
        Tq, Tk = q.size(2), k.size(2)
        if self.training:  # written out, as CausalSelfAttention
            att = (q @ k.transpose(-2, -1)).mul_(1.0 / math.sqrt(k.size(-1)))  # (B, nh, Tq, Tk)
            att.masked_fill_(self.mask[:, :, :Tq, :Tk] == 0, float('-inf'))
            y = self.attn_drop(F.softmax(att, dim=-1)) @ v  # (B, nh, Tq, hs)
        else:
            y = fused_attention(q, k, v, self.mask, 0)  # (B, nh, Tq, hs)
        return self.resid_drop(self.proj(merge_heads(y)))  # (B, Tq, C)
