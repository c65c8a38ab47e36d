"""What the tests compare with: the handout's equations computed directly, in float64 (the
synthesizer's eq. 11, the perceiver's cross-attention blocks, RoPE's table and rotation),
and the inputs the tests give the submission's code (given weights and inputs, seeded;
the documents span corruption is drawn from).
"""

import math
import random
import string

import torch
from torch.nn import functional as F


def span_documents():
    """The documents span corruption is drawn from: 100 longer than the truncation's cap,
    of random letters and spaces, and 6 short ones (4 to 34 characters: the spec says
    nothing of shorter ones)."""
    rng = random.Random(0)
    letters = string.ascii_letters + ' '
    long = [''.join(rng.choice(letters) for _ in range(rng.randint(60, 120))) for _ in range(100)]
    short = [''.join(rng.choice(letters) for _ in range(n)) for n in (4, 5, 8, 13, 21, 34)]
    return long + short


def generator(seed):
    return torch.Generator().manual_seed(seed)


def weights_for(shapes, seed):
    """Random weights of the given shapes (masks lower-triangular ones)."""
    rng = generator(seed)
    state = {}
    for name, shape in shapes.items():
        if name.endswith('mask'):
            state[name] = torch.tril(torch.ones(shape[-1], shape[-1])).view(*shape)
        else:
            state[name] = torch.randn(*shape, generator=rng) * 0.5
    return state


def exact(weights):
    """The weights in float64, for the direct computations."""
    return {name: tensor.double() for name, tensor in weights.items()}


def linear_shapes(prefix, n_in, n_out):
    return {f"{prefix}.weight": [n_out, n_in], f"{prefix}.bias": [n_out]}


def synthesizer_case():
    """SynthesizerAttention(n_head 3, n_embd 6, block_size 8) weights, and inputs with T
    of 5 (w2 and b2 cut to T) and 7 (all of them)."""
    shapes = {**linear_shapes('w1', 6, 6), 'w2': [2, 7], 'b2': [7]}
    shapes.update({**linear_shapes('value', 6, 6), **linear_shapes('proj', 6, 6)})
    shapes['mask'] = [1, 1, 8, 8]
    rng = generator(2)
    inputs = [(torch.randn(11, T, 6, generator=rng),) for T in (5, 7)]
    return weights_for(shapes, 1), inputs


def perceiver_case(block):
    """DownProjectBlock or UpProjectBlock weights (n_head 2, n_embd 6, block_size 8,
    bottleneck_dim 4) and inputs: x (3, 8, 6); for the up block also y (3, 4, 6)."""
    shapes = {}
    if block == 'down':
        shapes['C'] = [1, 4, 6]
    for part in ('key', 'query', 'value', 'proj'):
        shapes.update(linear_shapes(f"attn.{part}", 6, 6))
    shapes['attn.mask'] = [1, 1, 8, 8]
    for norm in ('ln1', 'ln2'):
        shapes.update({f"{norm}.weight": [6], f"{norm}.bias": [6]})
    shapes.update({**linear_shapes('mlp.0', 6, 24), **linear_shapes('mlp.2', 24, 6)})
    rng = generator(4)
    x, y = torch.randn(3, 8, 6, generator=rng), torch.randn(3, 4, 6, generator=rng)
    return weights_for(shapes, 3), [(x,)] if block == 'down' else [(y, x)]


def rope_apply_inputs():
    """x (2, 3, 10, 8) for apply_rotary_emb, and a table for 12 positions."""
    return torch.randn(2, 3, 10, 8, generator=generator(5)), rotary_table(8, 12)


def rope_attention_case():
    """CausalSelfAttention with rope (n_head 2, n_embd 16, block_size 8): weights, the right
    rope_cache, and x (3, 6, 16)."""
    shapes = {}
    for part in ('key', 'query', 'value', 'proj'):
        shapes.update(linear_shapes(part, 16, 16))
    shapes['mask'] = [1, 1, 8, 8]
    weights = weights_for(shapes, 6)
    weights['rope_cache'] = rotary_table(8, 8)
    return weights, [(torch.randn(3, 6, 16, generator=generator(7)),)]


def linear(x, weights, prefix):
    return x @ weights[f"{prefix}.weight"].T + weights[f"{prefix}.bias"]


def heads(x, n_head):
    B, T, C = x.shape
    return x.view(B, T, n_head, C // n_head).transpose(1, 2)  # (B, nh, T, hs)


def causal_softmax(scores):
    """softmax over keys j <= i of each query i (scores (..., Tq, Tk))."""
    Tq, Tk = scores.shape[-2:]
    above = torch.ones(Tq, Tk, dtype=torch.bool).triu(1)
    return scores.masked_fill(above, float('-inf')).softmax(-1)


def merged(y):
    B, nh, T, hs = y.shape
    return y.transpose(1, 2).reshape(B, T, nh * hs)


def synthesizer_attention(w, x, n_head):
    """Handout eq. 11 per head i: softmax(ReLU(X A_i + b_1) B + b_2) (X V_i), B and b_2 cut
    to the T positions and shared by the heads; the heads side by side, then proj."""
    T = x.shape[1]
    a = heads(F.relu(linear(x, w, 'w1')), n_head)  # (B, nh, T, hs)
    scores = a @ w['w2'][:, :T] + w['b2'][:T]  # (B, nh, T, T)
    y = causal_softmax(scores) @ heads(linear(x, w, 'value'), n_head)
    return linear(merged(y), w, 'proj')


def cross_attention(w, prefix, x_kv, x_q, n_head):
    """softmax((x_q Q_i)(x_kv K_i)^T / sqrt(hs)) (x_kv V_i), query i seeing keys 0..i."""
    q = heads(linear(x_q, w, f"{prefix}.query"), n_head)
    k = heads(linear(x_kv, w, f"{prefix}.key"), n_head)
    v = heads(linear(x_kv, w, f"{prefix}.value"), n_head)
    y = causal_softmax(q @ k.transpose(-2, -1) / math.sqrt(k.shape[-1])) @ v
    return linear(merged(y), w, f"{prefix}.proj")


def layer_norm(x, w, prefix):
    return F.layer_norm(x, x.shape[-1:], w[f"{prefix}.weight"], w[f"{prefix}.bias"])


def mlp(x, w):
    return linear(F.gelu(linear(x, w, 'mlp.0')), w, 'mlp.2')


# (residual around attention, ln1 on both inputs): ours first
PERCEIVER_FORMS = [(True, False), (False, False), (True, True), (False, True)]


def down_block(w, x, n_head, residual=True, norm_both=False):
    """y = C + attn(kv=x, q=ln1(C)), then y + mlp(ln2(y)); without the residual
    y = attn(...); with norm_both kv = ln1(x)."""
    basis = w['C'].expand(x.shape[0], -1, -1)
    kv = layer_norm(x, w, 'ln1') if norm_both else x
    y = cross_attention(w, 'attn', kv, layer_norm(basis, w, 'ln1'), n_head)
    y = basis + y if residual else y
    return y + mlp(layer_norm(y, w, 'ln2'), w)


def up_block(w, y, x, n_head, residual=True, norm_both=False):
    """out = x + attn(kv=ln1(y), q=x), then out + mlp(ln2(out)); without the residual
    out = attn(...); with norm_both q = ln1(x)."""
    q = layer_norm(x, w, 'ln1') if norm_both else x
    out = cross_attention(w, 'attn', layer_norm(y, w, 'ln1'), q, n_head)
    out = x + out if residual else out
    return out + mlp(layer_norm(out, w, 'ln2'), w)


def rotary_table(dim, positions):
    """(positions, dim/2, 2): cos and sin of t theta_i, theta_i = 10000^(-2(i-1)/dim)."""
    i = torch.arange(1, dim // 2 + 1, dtype=torch.float64)
    theta = 10000.0 ** (-2 * (i - 1) / dim)
    angles = torch.arange(positions, dtype=torch.float64)[:, None] * theta
    return torch.stack((angles.cos(), angles.sin()), dim=-1).float()


def rotate(x, table):
    """(x_{2i-1} + i x_{2i}) e^{i t theta_i} for each adjacent pair, t = 0..T-1."""
    T = x.shape[-2]
    pairs = torch.view_as_complex(x.double().reshape(*x.shape[:-1], -1, 2).contiguous())
    turns = torch.view_as_complex(table[:T].double().contiguous())  # (T, hs/2)
    return torch.view_as_real(pairs * turns).flatten(-2)


def rope_attention(w, x, n_head):
    q = rotate(heads(linear(x, w, 'query'), n_head), w['rope_cache'])
    k = rotate(heads(linear(x, w, 'key'), n_head), w['rope_cache'])
    v = heads(linear(x, w, 'value'), n_head)
    y = causal_softmax(q @ k.transpose(-2, -1) / math.sqrt(k.shape[-1])) @ v
    return linear(merged(y), w, 'proj')
