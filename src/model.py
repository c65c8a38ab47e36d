"""GPT language model (minGPT): token + learned position embeddings, a stack of pre-LayerNorm
Transformer blocks, and a linear head over the vocabulary.

The later editions' variants are wired here too: rope (2024/25) drops the position
embedding, as the attention rotates queries and keys instead (attention.py); perceiver
(2023) replaces the first and last blocks by a DownProjectBlock onto bottleneck_dim
positions and an UpProjectBlock back, with n_layer-2 ordinary Blocks between them.

forward() is the plain model: logits for every position, and the loss if targets are
given. packed_loss() is the same loss computed on only the positions that can affect it;
the trainer uses it.
"""

import copy

import torch
import torch.nn as nn
from torch.nn import functional as F

import attention
from dropout import Dropout


class GPTConfig:
    """Base GPT config, params common to all GPT versions. Keyword arguments set any other
    attribute: n_layer, n_head, n_embd, and synthesizer=True for SynthesizerAttention,
    rope=True for rotary position embeddings, perceiver=True with bottleneck_dim."""

    embd_pdrop = 0.1
    resid_pdrop = 0.1
    attn_pdrop = 0.1
    synthesizer = False
    rope = False
    perceiver = False
    bottleneck_dim = None

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
        Dropout(config.resid_pdrop),
    )


class Block(nn.Module):
    """An unassuming Transformer block."""

    def __init__(self, config):
        super().__init__()
        self.ln1 = nn.LayerNorm(config.n_embd)
        self.ln2 = nn.LayerNorm(config.n_embd)
        if config.synthesizer:
            self.attn = attention.SynthesizerAttention(config)
        else:
            self.attn = attention.CausalSelfAttention(config)
        self.mlp = mlp(config)

    def forward(self, x, packing=None, cache=None):
        x = x + self.attn(self.ln1(x), packing, cache)
        x = x + self.mlp(self.ln2(x))
        return x


class DownProjectBlock(nn.Module):
    """The perceiver's first block: a learned basis C of bottleneck_dim positions attends
    to the input (handout: Y_i = softmax((C Q_i)(X K_i)^T / sqrt(d/h)) (X V_i)), then an
    MLP. Residuals as in Block, pre-LayerNorm on the queries and the MLP input:
    y = C + attn(kv=x_input, q=ln1(C)), then y + mlp(ln2(y)). Output j depends on inputs
    0..j only (the causal mask), so the model stays causal."""

    def __init__(self, config):
        super().__init__()
        self.C = nn.Parameter(torch.empty(1, config.bottleneck_dim, config.n_embd))
        nn.init.xavier_uniform_(self.C)
        self.attn = attention.CausalCrossAttention(config)
        self.ln1 = nn.LayerNorm(config.n_embd)
        self.ln2 = nn.LayerNorm(config.n_embd)
        self.mlp = mlp(config)

    def forward(self, x_input, positions=None):
        """x_input (B, T, C) -> (B, positions, C), positions defaulting to bottleneck_dim."""
        basis = self.C[:, :positions].expand(x_input.size(0), -1, -1)  # (B, m, C)
        y = basis + self.attn(x_input, self.ln1(basis))
        return y + self.mlp(self.ln2(y))


class UpProjectBlock(nn.Module):
    """The perceiver's last block: the input attends to the bottleneck's output y
    (handout: Y = softmax((X Q_i)(Y K_i)^T / sqrt(d/h)) (Y V_i)), then an MLP, back at
    the input's length. Residuals as in Block: x = x_input + attn(kv=ln1(y), q=x_input),
    then x + mlp(ln2(x)). Output t sees y_0..y_t, which see inputs 0..t."""

    def __init__(self, config):
        super().__init__()
        self.attn = attention.CausalCrossAttention(config)
        self.ln1 = nn.LayerNorm(config.n_embd)
        self.ln2 = nn.LayerNorm(config.n_embd)
        self.mlp = mlp(config)

    def forward(self, y, x_input):
        x = x_input + self.attn(self.ln1(y), x_input)  # (B, T, C)
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """The full GPT language model, with a context size of block_size."""

    def __init__(self, config):
        super().__init__()
        self.tok_emb = nn.Embedding(config.vocab_size, config.n_embd)
        if not config.rope:
            self.pos_emb = nn.Parameter(torch.zeros(1, config.block_size, config.n_embd))
        self.drop = Dropout(config.embd_pdrop)
        self.perceiver = config.perceiver
        if config.perceiver:
            assert 0 < config.bottleneck_dim <= config.block_size
            self.down_block = DownProjectBlock(config)
            middle = copy.copy(config)
            middle.block_size = config.bottleneck_dim  # their causal masks span the bottleneck
            self.blocks = nn.Sequential(*[Block(middle) for _ in range(config.n_layer - 2)])
            self.up_block = UpProjectBlock(config)
        else:
            self.blocks = nn.Sequential(*[Block(config) for _ in range(config.n_layer)])
        self.ln_f = nn.LayerNorm(config.n_embd)
        self.head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.block_size = config.block_size
        self.apply(self._init_weights)

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

    def new_cache(self):
        """An empty cache for forward(): one dict per block, or for the perceiver one dict
        keeping the ids so far, as it recomputes the whole prefix: exact, not faster. (Its
        blocks could cache too, bottleneck position j seeing inputs 0..j only, but a dev
        set decodes in seconds as it is.)"""
        return [{}] if self.perceiver else [{} for _ in self.blocks]

    def embed(self, idx, past=0):
        """(B, T) ids at positions past.. -> (B, T, C) token + position embeddings."""
        x = self.tok_emb(idx)  # (B, T, C)
        if hasattr(self, 'pos_emb'):  # rope has none: attention rotates q and k instead
            x = x + self.pos_emb[:, past : past + idx.size(1), :]
        return x

    def perceive(self, x_input):
        """The perceiver's blocks on (B, T, C) embeddings. Bottleneck positions from T on
        cannot reach any output (output t sees y_0..y_t), so at most T are computed."""
        y = self.down_block(x_input, min(x_input.size(1), self.down_block.C.size(1)))  # (B, m, C)
        y = self.blocks(y)  # (B, m, C)
        return self.up_block(y, x_input)  # (B, T, C)

    def forward(self, idx, targets=None, cache=None):
        """idx, targets: (B, T) token ids. Returns (logits (B, T, vocab), loss or None).
        With cache (from new_cache()), idx continues the sequence cached so far."""
        if cache is not None and self.perceiver:
            full = _extend_ids(cache[0], idx)  # (B, past+T)
            return self(full, None)[0][:, -idx.size(1) :], None
        b, t = idx.size()
        past = cache[0]['v'].size(2) if cache and 'v' in cache[0] else 0
        assert past + t <= self.block_size, "Cannot forward, model block size is exhausted."
        x = self.drop(self.embed(idx, past))  # (B, T, C)
        if self.perceiver:
            x = self.perceive(x)
        else:
            for i, block in enumerate(self.blocks):
                x = block(x, cache=None if cache is None else cache[i])
        logits = self.head(self.ln_f(x))  # (B, T, vocab)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(
                logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=0
            )
        return logits, loss

    def packed_loss(self, idx, targets, packing=None, n_targets=None):
        """forward(idx, targets)[1], computed only where it can make a difference: the
        positions after a row's last non-PAD target influence no counted target (attention
        is causal and PAD targets are ignored), so each row is cut there (see Packing).
        packing: Packing(target_lengths(targets)), best made on the CPU (the trainer makes
        it before the batch moves to the GPU). n_targets: divide the summed loss by this
        instead of averaging (a process holding part of a batch, see Trainer.loss)."""
        if packing is None:
            packing = attention.Packing(target_lengths(targets), device=idx.device)
        T = packing.T
        # embed the whole (trimmed) batch: gathering pos_emb per position would make its
        # gradient an accumulating scatter, whose order (and sum) varies between runs
        x = self.drop(packing.select(self.embed(idx[:, :T])))  # (N, C)
        if self.perceiver:
            # each group of rows padded to its longest; padding after a row's end is only
            # seen by positions after that end, which are cut again by repack
            x = packing.repack([self.perceive(group) for group in packing.unpack(x)])  # (N, C)
        else:
            for block in self.blocks:
                x = block(x, packing)
        logits = self.head(self.ln_f(x))  # (N, vocab)
        if n_targets is None:
            return F.cross_entropy(logits, packing.select(targets), ignore_index=0)
        return (
            F.cross_entropy(logits, packing.select(targets), ignore_index=0, reduction='sum')
            / n_targets
        )


def target_lengths(targets):
    """(B, T) targets -> (B,) each row's last non-PAD target position + 1 (0 if none):
    the positions that can affect the loss."""
    positions = torch.arange(1, targets.size(1) + 1, device=targets.device)  # (T,)
    return (positions * (targets != 0)).amax(dim=1)  # (B,)


def _extend_ids(cache, idx):
    """The perceiver's cache: the ids fed so far, with idx appended."""
    cache['idx'] = torch.cat((cache['idx'], idx), dim=1) if 'idx' in cache else idx  # (B, past+T)
    return cache['idx']
