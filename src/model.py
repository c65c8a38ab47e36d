"""GPT language model (minGPT): token + learned position embeddings, a stack of pre-LayerNorm
Transformer blocks, and a linear head over the vocabulary.

forward() is what training and evaluation both call: logits for every position (every
kept one, with packing), and the loss if targets are given. Two optional arguments make it
faster without changing what it computes, both working around the attention layers, which
always see plain (B, T, C) inputs: the trainer's packing (only the positions that can affect
the loss, machinery/packing.py) and the decoder's cache (each attention layer's earlier
inputs, so that the other layers compute only the newest position, machinery/decoding.py).
"""

import torch
import torch.nn as nn
from torch.nn import functional as F

import attention


class GPTConfig:
    """Base GPT config, params common to all GPT versions. Keyword arguments set any other
    attribute: n_layer, n_head, n_embd, and the variants' settings below."""

    embd_pdrop = 0.1
    resid_pdrop = 0.1
    attn_pdrop = 0.1
    # [2021] True: SynthesizerAttention in every block
    synthesizer = False
    # [2023] the bottleneck's positions in perceiver.py's model
    bottleneck_dim = None
    # [2024] True: rotary position embeddings instead of learned ones
    rope = False

    def __init__(self, vocab_size, block_size, **kwargs):
        self.vocab_size = vocab_size
        self.block_size = block_size
        for k, v in kwargs.items():
            setattr(self, k, v)


def mlp(config):
    return nn.Sequential(
        nn.Linear(config.n_embd, 4 * config.n_embd),
        nn.GELU(),
        nn.Linear(4 * config.n_embd, config.n_embd),
        nn.Dropout(config.resid_pdrop),
    )


class Block(nn.Module):
    """An unassuming Transformer block."""

    def __init__(self, config):
        super().__init__()
        self.ln1 = nn.LayerNorm(config.n_embd)
        self.ln2 = nn.LayerNorm(config.n_embd)
        # [2021]
        if config.synthesizer:
            self.attn = attention.SynthesizerAttention(config)
        else:
            self.attn = attention.CausalSelfAttention(config)
        self.mlp = mlp(config)

    def forward(self, x, around=None):
        """x (B, T, C) -> (B, T, C). around(attn, h), if given, calls the attention on h for
        the machinery: packed (N, C) rows (packing.py) or the newest positions of a decoded
        sequence (decoding.py), the attention itself seeing (B, T, C) as always."""
        h = self.ln1(x)
        x = x + (self.attn(h) if around is None else around(self.attn, h))
        x = x + self.mlp(self.ln2(x))
        return x


class GPT(nn.Module):
    """The full GPT language model, with a context size of block_size."""

    # a decoder may keep each attention layer's earlier inputs and feed only the newest
    # position (decoding.Cache): every other layer works position by position
    decodes_with_cache = True

    def __init__(self, config):
        super().__init__()
        self.tok_emb = nn.Embedding(config.vocab_size, config.n_embd)
        # [2024] rope has no position embedding: attention rotates q and k instead
        if config.rope:
            self.pos_emb = None
        else:
            self.pos_emb = nn.Parameter(torch.zeros(1, config.block_size, config.n_embd))
        self.drop = nn.Dropout(config.embd_pdrop)
        self.build_blocks(config)
        self.ln_f = nn.LayerNorm(config.n_embd)
        self.head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.block_size = config.block_size
        self.apply(self._init_weights)

    def build_blocks(self, config):
        """The Transformer blocks between the embeddings and the head."""
        self.blocks = nn.Sequential(*[Block(config) for _ in range(config.n_layer)])

    def _init_weights(self, module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            module.weight.data.normal_(mean=0.0, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                module.bias.data.zero_()
        elif isinstance(module, nn.LayerNorm):
            module.bias.data.zero_()
            module.weight.data.fill_(1.0)

    def get_block_size(self):
        return self.block_size

    def forward(self, idx, targets=None, packing=None, cache=None):
        """idx, targets: (B, T) token ids. Returns (logits (B, T, vocab), loss or None): the
        mean cross-entropy over the targets that are not PAD (id 0).

        packing (packing.Packing of the targets, as the trainer makes it): compute only the
        positions that can change the loss, as (N, C) rows; logits are then (N, vocab).
        cache (decoding.Cache, greedy decoding): idx continues the sequences fed so far,
        each id at its place in cache.positions (B, T)."""
        assert packing is None or cache is None, "packing is for training, the cache for decoding"
        b, t = idx.size()
        if packing is not None:
            idx = idx[:, : packing.T]  # the batch cut after its longest row
        # where each id stands: 0..t-1, or, decoding, where the cache says
        end = t if cache is None else cache.width
        assert end <= self.block_size, "Cannot forward, model block size is exhausted."
        x = self.tok_emb(idx)  # (B, T, C)
        if self.pos_emb is not None:
            if cache is None:
                x = x + self.pos_emb[:, : idx.size(1), :]  # (B, T, C)
            else:
                x = x + self.pos_emb[0, cache.positions]  # (B, T, C)
        if packing is not None:
            # embedded whole and then selected: gathering pos_emb per position would make its
            # gradient an accumulating scatter, whose order (and sum) varies between runs
            x = packing.select(x)  # (N, C)
            targets = None if targets is None else packing.select(targets)  # (N,)
        x = self.drop(x)
        x = self.run_blocks(x, packing, cache)  # (B, T, C), or (N, C)
        logits = self.head(self.ln_f(x))  # (B, T, vocab), or (N, vocab)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(
                logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=0
            )
        return logits, loss

    def run_blocks(self, x, packing=None, cache=None):
        """The Transformer blocks on (B, T, C) embeddings, or on (N, C) packed rows."""
        for i, block in enumerate(self.blocks):
            around = None
            if packing is not None:
                around = packing.in_groups
            elif cache is not None:
                around = cache.attention(i)
            x = block(x, around)
        return x
