"""The perceiver (2023 edition): a GPT whose first and last blocks change the length.

A DownProjectBlock maps the input's T positions onto bottleneck_dim learned positions,
n_layer-2 ordinary Blocks (model.py) work there, and an UpProjectBlock maps back to T
positions. Both are built on attention.py's CausalCrossAttention, and every output
position sees only inputs up to its own, so the model stays causal. PerceiverGPT has the
2023 starter's parameter names (down_block, blocks, up_block), so .params files load
both ways; run.py builds it for the perceiver variant.
"""

import copy

import torch
import torch.nn as nn

import attention
from model import GPT, Block, mlp


class DownProjectBlock(nn.Module):
    """The perceiver's first block: a learned basis C (1, bottleneck_dim, n_embd), initialised
    with xavier_uniform, attends to the input (handout: Y_i = softmax((C Q_i)(X K_i)^T /
    sqrt(d/h)) (X V_i)), then an MLP. Residuals as in Block, pre-LayerNorm on the queries and
    the MLP input: y = C + attn(kv=x_input, q=ln1(C)), then y + mlp(ln2(y)). Output j
    depends on inputs 0..j only (the causal mask), so the model stays causal. Its parts are
    named as in the 2023 starter: C, attn (a CausalCrossAttention), ln1, ln2, mlp."""

    # [part g, 2023]
    def __init__(self, config):
        super().__init__()
        self.C = nn.Parameter(torch.empty(1, config.bottleneck_dim, config.n_embd))
        nn.init.xavier_uniform_(self.C)
        self.attn = attention.CausalCrossAttention(config)
        self.ln1 = nn.LayerNorm(config.n_embd)
        self.ln2 = nn.LayerNorm(config.n_embd)
        self.mlp = mlp(config)

    # [part g, 2023]
    def forward(self, x_input):
        """x_input (B, T, C) -> (B, bottleneck_dim, C)."""
        basis = self.C.expand(x_input.size(0), -1, -1)  # (B, m, C)
        y = basis + self.attn(x_input, self.ln1(basis))  # (B, m, C)
        return y + self.mlp(self.ln2(y))


class UpProjectBlock(nn.Module):
    """The perceiver's last block: the input attends to the bottleneck's output y
    (handout: Y = softmax((X Q_i)(Y K_i)^T / sqrt(d/h)) (Y V_i)), then an MLP, back at
    the input's length. Residuals as in Block: x = x_input + attn(kv=ln1(y), q=x_input),
    then x + mlp(ln2(x)). Output t sees y_0..y_t, which see inputs 0..t. Its parts are
    named as in the 2023 starter: attn (a CausalCrossAttention), ln1, ln2, mlp."""

    # [part g, 2023]
    def __init__(self, config):
        super().__init__()
        self.attn = attention.CausalCrossAttention(config)
        self.ln1 = nn.LayerNorm(config.n_embd)
        self.ln2 = nn.LayerNorm(config.n_embd)
        self.mlp = mlp(config)

    # [part g, 2023]
    def forward(self, y, x_input):
        """y (B, m, C), the bottleneck's output, and x_input (B, T, C) -> (B, T, C)."""
        x = x_input + self.attn(self.ln1(y), x_input)  # (B, T, C)
        return x + self.mlp(self.ln2(x))


class PerceiverGPT(GPT):
    """GPT with the perceiver's blocks; config.bottleneck_dim sets the bottleneck."""

    # each new character changes the bottleneck positions from its own on (position j sees
    # inputs 0..j), so a decoder computes the whole sequence again for each character
    decodes_with_cache = False

    def build_blocks(self, config):
        assert 0 < config.bottleneck_dim <= config.block_size
        self.down_block = DownProjectBlock(config)
        middle = copy.copy(config)
        middle.block_size = config.bottleneck_dim  # their causal masks span the bottleneck
        self.blocks = nn.Sequential(*[Block(middle) for _ in range(config.n_layer - 2)])
        self.up_block = UpProjectBlock(config)

    def perceive(self, x_input):
        """The perceiver's blocks on (B, T, C) embeddings."""
        y = self.down_block(x_input)  # (B, m, C)
        y = self.blocks(y)  # (B, m, C)
        return self.up_block(y, x_input)  # (B, T, C)

    def run_blocks(self, x, packing=None, cache=None):
        """perceive() on (B, T, C) embeddings, or on (N, C) packed rows (each group of rows
        padded to its longest: packing.in_groups). Decoding feeds the whole sequence every
        step (decodes_with_cache), so there is never a cache here."""
        assert cache is None, "the perceiver decodes without a cache"
        return self.perceive(x) if packing is None else packing.in_groups(self.perceive, x)
