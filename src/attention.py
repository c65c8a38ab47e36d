"""The two attention variants that plug into the GPT of model.py.

CausalSelfAttention is handout eq. 9-10 (through torch's scaled_dot_product_attention);
SynthesizerAttention is handout eq. 11, where the scores of each position come from that
position alone instead of from pairs of positions.

Both take, besides x, two optional helpers for speed that never change the result:
  packing  x holds only the positions that matter, as (N, C) rows (see Packing);
           attention alone needs the padded (B, T, C) layout, and unpacks for it.
  cache    a dict (one per layer) keeping the keys/values of earlier positions, so that
           greedy decoding feeds only the newest position (see utils.greedy_complete).
Their parameter names match the original starter code, so .params files load both ways.
"""
import torch
import torch.nn as nn
from torch.nn import functional as F


class Packing:
    """The positions of a padded (B, T) batch that can affect the loss: for each row, the
    positions up to its last target. Attention is causal and PAD targets count for
    nothing, so the positions after that are dead work; the position-wise layers (about
    90% of the FLOPs) run on the kept rows only, about half of them in pretraining."""

    def __init__(self, lengths, T):
        self.B, self.T = lengths.size(0), T
        keep = torch.arange(T, device=lengths.device)[None, :] < lengths[:, None]  # (B, T)
        self.index = keep.flatten().nonzero().squeeze(1)  # (N,) flat positions kept

    def pack(self, x):
        return x.flatten(0, 1).index_select(0, self.index)  # (B, T, ...) -> (N, ...)

    def unpack(self, x):
        padded = x.new_zeros(self.B * self.T, x.size(-1))  # (B*T, C)
        return padded.index_copy(0, self.index, x).view(self.B, self.T, -1)  # (B, T, C)


def _to_heads(x, packing, n_head):
    if packing is not None:
        x = packing.unpack(x)
    B, T, C = x.size()
    return x.view(B, T, n_head, C // n_head).transpose(1, 2)  # (B, nh, T, hs)


def _from_heads(y, packing):
    B, nh, T, hs = y.size()
    y = y.transpose(1, 2).reshape(B, T, nh * hs)  # (B, T, C): heads side by side
    return y if packing is None else packing.pack(y)


def _extend(cache, name, new):
    """Append the new positions' keys or values to those cached from earlier calls."""
    if cache is None:
        return new
    if name in cache:
        new = torch.cat((cache[name], new), dim=2)  # (B, nh, past+T, hs)
    cache[name] = new
    return new


class CausalSelfAttention(nn.Module):
    """A vanilla multi-head masked self-attention layer with a projection at the end."""

    def __init__(self, config):
        super().__init__()
        assert config.n_embd % config.n_head == 0
        self.key = nn.Linear(config.n_embd, config.n_embd)
        self.query = nn.Linear(config.n_embd, config.n_embd)
        self.value = nn.Linear(config.n_embd, config.n_embd)
        self.attn_drop = nn.Dropout(config.attn_pdrop)
        self.resid_drop = nn.Dropout(config.resid_pdrop)
        self.proj = nn.Linear(config.n_embd, config.n_embd)
        # causal mask, 1 where attention is allowed; kept in the state_dict as the original does
        self.register_buffer("mask", torch.tril(torch.ones(config.block_size, config.block_size))
                             .view(1, 1, config.block_size, config.block_size))
        self.n_head = config.n_head

    def forward(self, x, packing=None, cache=None):
        q = _to_heads(self.query(x), packing, self.n_head)  # (B, nh, T, hs)
        k = _extend(cache, 'k', _to_heads(self.key(x), packing, self.n_head))  # (B, nh, past+T, hs)
        v = _extend(cache, 'v', _to_heads(self.value(x), packing, self.n_head))  # (B, nh, past+T, hs)
        T, past = q.size(2), k.size(2) - q.size(2)
        dropout = self.attn_drop.p if self.training else 0.0
        if past == 0:
            # softmax(q k^T / sqrt(hs), causal) v, with attention dropout
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True)
        else:
            allowed = self.mask[:, :, past:past + T, :past + T].bool()  # (1, 1, T, past+T)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, dropout_p=dropout)
        # y: (B, nh, T, hs)
        return self.resid_drop(self.proj(_from_heads(y, packing)))


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
        self.attn_drop = nn.Dropout(config.attn_pdrop)
        self.resid_drop = nn.Dropout(config.resid_pdrop)
        self.register_buffer("mask", torch.tril(torch.ones(config.block_size, config.block_size))
                             .view(1, 1, config.block_size, config.block_size))
        self.n_head = config.n_head
        self.block_size = config.block_size
        nn.init.uniform_(self.w2, -0.001, 0.001)

    def forward(self, x, packing=None, cache=None):
        a = _to_heads(F.relu(self.w1(x)), packing, self.n_head)  # (B, nh, T, hs)
        v = _extend(cache, 'v', _to_heads(self.value(x), packing, self.n_head))  # (B, nh, past+T, hs)
        T, past = a.size(2), v.size(2) - a.size(2)
        assert past + T <= self.block_size - 1, 'the synthesizer has block_size-1 positions'
        # each row's scores over positions 0..past+T-1 come from that row alone
        scores = a @ self.w2[:, :past + T] + self.b2[:past + T]  # (B, nh, T, past+T)
        scores = scores.masked_fill(self.mask[:, :, past:past + T, :past + T] == 0, float('-inf'))
        att = self.attn_drop(F.softmax(scores, dim=-1))  # (B, nh, T, past+T)
        y = att @ v  # (B, nh, T, hs)
        return self.resid_drop(self.proj(_from_heads(y, packing)))
