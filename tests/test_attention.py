"""The attention variants against the handouts' equations, computed independently here:
vanilla and the synthesizer (2021) and RoPE (2024/25). The float64 model built here from a
state_dict alone serves test_perceiver.py too."""

import math

import pytest
import torch
from torch.nn import functional as F

import attention
import model
from test_model import SMALL, make_gpt, sharpen

BLOCK = 128


# --- Direct computations of the handouts' equations, in float64 --------------------------


def rotate(x):
    """RoPE on (B, T, d) by the 2024 handout's formula, as complex numbers: the pair
    (x_{2i-1}, x_{2i}) at position t times e^{i t theta_i}, theta_i = 10000^(-2(i-1)/d)."""
    T, d = x.shape[-2:]
    i = torch.arange(1, d // 2 + 1, dtype=torch.float64)
    theta = 10000.0 ** (-2 * (i - 1) / d)  # (d/2,)
    t = torch.arange(T, dtype=torch.float64)[:, None]  # (T, 1)
    z = torch.complex(x[..., 0::2], x[..., 1::2]) * torch.polar(
        torch.ones_like(t * theta), t * theta
    )
    return torch.stack((z.real, z.imag), dim=-1).flatten(-2)


def linear(state, name, x):
    return x @ state[name + '.weight'].T + state[name + '.bias']


def layer_norm(state, name, x):
    return F.layer_norm(x, x.shape[-1:], state[name + '.weight'], state[name + '.bias'])


def attend(state, name, x_q, x_kv, n_head, rope=False, probs=None):
    """Per head i: softmax((X_q Q_i)(X_kv K_i)^T / sqrt(d/h), query t sees keys 0..t) (X_kv V_i),
    heads side by side, then the projection."""
    Q, K, V = (
        linear(state, name + '.query', x_q),
        linear(state, name + '.key', x_kv),
        linear(state, name + '.value', x_kv),
    )
    hs = Q.size(-1) // n_head
    future = torch.ones(Q.size(1), K.size(1), dtype=torch.bool).triu(1)  # key after the query
    heads = []
    for i in range(n_head):
        cols = slice(i * hs, (i + 1) * hs)
        q, k = (
            (rotate(Q[..., cols]), rotate(K[..., cols])) if rope else (Q[..., cols], K[..., cols])
        )
        p = torch.softmax(
            (q @ k.transpose(1, 2) / math.sqrt(hs)).masked_fill(future, float('-inf')), dim=-1
        )
        if probs is not None:
            probs.append(p)
        heads.append(p @ V[..., cols])
    return linear(state, name + '.proj', torch.cat(heads, dim=-1))


def mlp(state, name, x):
    return linear(state, name + '.2', F.gelu(linear(state, name + '.0', x)))


def block(state, name, x, n_head, rope):
    h = layer_norm(state, name + '.ln1', x)
    x = x + attend(state, name + '.attn', h, h, n_head, rope)
    return x + mlp(state, name + '.mlp', layer_norm(state, name + '.ln2', x))


def reference_forward(state, idx, n_head, n_layer):
    """The whole model from its state_dict alone: embeddings (no position embedding with
    rope), the blocks (for the perceiver: down-projection onto all bottleneck_dim
    positions, n_layer-2 blocks, up-projection), ln_f and the head."""
    state = {k: v.double() for k, v in state.items()}
    rope = 'blocks.0.attn.rope_cache' in state
    x = state['tok_emb.weight'][idx]  # (B, T, C)
    if 'pos_emb' in state:
        x = x + state['pos_emb'][:, : idx.size(1)]
    if 'down_block.C' in state:
        c = state['down_block.C'].expand(idx.size(0), -1, -1)  # (B, m, C)
        y = c + attend(state, 'down_block.attn', layer_norm(state, 'down_block.ln1', c), x, n_head)
        y = y + mlp(state, 'down_block.mlp', layer_norm(state, 'down_block.ln2', y))
        for i in range(n_layer - 2):
            y = block(state, f'blocks.{i}', y, n_head, rope)
        x = x + attend(state, 'up_block.attn', x, layer_norm(state, 'up_block.ln1', y), n_head)
        x = x + mlp(state, 'up_block.mlp', layer_norm(state, 'up_block.ln2', x))
    else:
        for i in range(n_layer):
            x = block(state, f'blocks.{i}', x, n_head, rope)
    return layer_norm(state, 'ln_f', x) @ state['head.weight'].T


# --- RoPE ---------------------------------------------------------------------------------


def test_rotary_cache_is_the_handouts_formula():
    cache = attention.precompute_rotary_emb(32, BLOCK)
    assert cache.shape == (BLOCK, 16, 2)
    t, i = 100, 3  # i is 0-based here: theta_4 = 10000^(-2*3/32)
    angle = t * 10000.0 ** (-2 * i / 32)
    torch.testing.assert_close(cache[t, i], torch.tensor([math.cos(angle), math.sin(angle)]))
    assert torch.equal(cache[0], torch.tensor([[1.0, 0.0]] * 16))
    x = torch.randn(2, 3, 50, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    expected = rotate(x.flatten(0, 1)).view_as(x)
    # the table is float32 (the buffer's dtype): its cos and sin are within 6e-8 of exact
    torch.testing.assert_close(attention.apply_rotary_emb(x, cache), expected, rtol=0, atol=2e-6)
    # a rotation: lengths of pairs kept, and q.k depends only on the positions' difference
    torch.testing.assert_close(attention.apply_rotary_emb(x, cache).norm(dim=-1), x.norm(dim=-1))


def test_rope_scores_depend_on_relative_position_only():
    cache = attention.precompute_rotary_emb(32, BLOCK)
    q, k = torch.randn(32, dtype=torch.float64), torch.randn(32, dtype=torch.float64)

    def score(tq, tk):
        rq = attention.apply_rotary_emb(q.expand(1, 1, tq + 1, 32), cache)[0, 0, tq]
        rk = attention.apply_rotary_emb(k.expand(1, 1, tk + 1, 32), cache)[0, 0, tk]
        return (rq @ rk).item()

    assert score(10, 3) == pytest.approx(score(110, 103), rel=1e-5)
    assert score(10, 3) != pytest.approx(score(10, 4), rel=1e-3)


@pytest.mark.parametrize('variant', ['vanilla', 'rope'])
def test_self_attention_matches_float64_equations_at_every_length(variant):
    config = model.GPTConfig(50, BLOCK, n_layer=1, n_head=4, n_embd=32, rope=variant == 'rope')
    torch.manual_seed(0)
    att = sharpen(attention.CausalSelfAttention(config), std=0.4).eval()
    state = {'attn.' + k: v.double() for k, v in att.state_dict().items()}
    x = torch.randn(3, BLOCK - 1, 32)
    probs = []
    with torch.no_grad():
        for T in range(1, BLOCK):
            expected = attend(
                state, 'attn', x[:, :T].double(), x[:, :T].double(), 4, variant == 'rope', probs
            )
            torch.testing.assert_close(att(x[:, :T]).double(), expected, atol=1e-4, rtol=1e-4)
    p = probs[-1]  # (B, T, T) at T = 127
    assert (p.amax(dim=-1) > 0.5).float().mean() > 0.5, 'attention should be sharp here'
    if variant == 'rope':  # the comparison can tell a wrong theta: the starter docstring's sign
        angles = (
            torch.arange(BLOCK)[:, None] * 10000.0 ** (torch.arange(0, 8, 2) / 8)[None, :]
        )  # (T, hs/2)
        att.rope_cache.copy_(torch.stack((angles.cos(), angles.sin()), dim=-1))
        with torch.no_grad():
            assert not torch.allclose(
                att(x).double(), attend(state, 'attn', x.double(), x.double(), 4, True), atol=1e-2
            )


# --- The perceiver ---------------------------------------------------------------------------


def test_rope_state_dict_names_and_shapes():
    state = make_gpt('rope').state_dict()
    assert 'pos_emb' not in state
    for i in range(4):
        torch.testing.assert_close(
            state[f'blocks.{i}.attn.rope_cache'], attention.precompute_rotary_emb(32, BLOCK)
        )
    assert (
        sum(v.numel() for k, v in state.items() if 'mask' not in k and 'rope_cache' not in k)
        == 3_323_392 - BLOCK * 256
    )


def assert_matches_reference_forward(variant):
    gpt = make_gpt(variant, **dict(SMALL, n_layer=4), sharp=True).eval()
    idx = torch.randint(0, 40, (2, BLOCK))
    with torch.no_grad():
        for T in (1, 2, 31, 32, 33, 64, BLOCK):
            expected = reference_forward(gpt.state_dict(), idx[:, :T], n_head=4, n_layer=4)
            torch.testing.assert_close(gpt(idx[:, :T])[0].double(), expected, atol=2e-4, rtol=1e-4)


def test_sharpened_attention_is_sharp():
    gpt = make_gpt('vanilla', **SMALL, sharp=True).eval()
    att = gpt.blocks[0].attn
    x = gpt.blocks[0].ln1(gpt.tok_emb(torch.randint(2, 40, (4, 100))) + gpt.pos_emb[:, :100])
    q = att.query(x).view(4, 100, 4, 8).transpose(1, 2)  # (B, nh, T, hs)
    k = att.key(x).view(4, 100, 4, 8).transpose(1, 2)  # (B, nh, T, hs)
    probs = (
        (q @ k.transpose(-2, -1) / math.sqrt(8))
        .masked_fill(att.mask[:, :, :100, :100] == 0, float('-inf'))
        .softmax(-1)
    )
    assert probs[:, :, 20:].amax(-1).mean() > 0.5


def vanilla_reference(att, x):
    """Handout eq. 9-10, per head, written out."""
    B, T, C = x.shape
    h = att.n_head
    hs = C // h
    heads = []
    for i in range(h):
        cols = slice(i * hs, (i + 1) * hs)
        Q = x @ att.query.weight[cols].T + att.query.bias[cols]
        K = x @ att.key.weight[cols].T + att.key.bias[cols]
        V = x @ att.value.weight[cols].T + att.value.bias[cols]
        scores = Q @ K.transpose(1, 2) / math.sqrt(hs)
        scores = scores.masked_fill(
            torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float('-inf')
        )
        heads.append(torch.softmax(scores, dim=-1) @ V)
    return torch.cat(heads, dim=-1) @ att.proj.weight.T + att.proj.bias


def synthesizer_reference(att, x):
    """Handout eq. 11 per head: softmax(ReLU(X A_i + b1) B + b2) (X V_i), causally masked."""
    B, T, C = x.shape
    h = att.n_head
    hs = C // h
    heads = []
    for i in range(h):
        cols = slice(i * hs, (i + 1) * hs)
        hidden = torch.relu(x @ att.w1.weight[cols].T + att.w1.bias[cols])  # (B, T, hs)
        scores = hidden @ att.w2[:, :T] + att.b2[:T]  # (B, T, T)
        scores = scores.masked_fill(
            torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float('-inf')
        )
        V = x @ att.value.weight[cols].T + att.value.bias[cols]
        heads.append(torch.softmax(scores, dim=-1) @ V)
    return torch.cat(heads, dim=-1) @ att.proj.weight.T + att.proj.bias


@pytest.mark.parametrize('synthesizer', [False, True])
@pytest.mark.parametrize('training', [False, True])
def test_attention_matches_handout_equations_at_every_length(synthesizer, training):
    """In float64, so any difference is a wrong computation, not rounding; training mode
    (dropout off) takes the written-out path, evaluation scaled_dot_product_attention."""
    config = model.GPTConfig(
        50,
        BLOCK,
        n_layer=1,
        n_head=4,
        n_embd=32,
        synthesizer=synthesizer,
        attn_pdrop=0.0,
        resid_pdrop=0.0,
    )
    torch.manual_seed(0)
    att = (
        attention.SynthesizerAttention(config)
        if synthesizer
        else attention.CausalSelfAttention(config)
    )
    sharpen(att).double().train(training)
    reference = synthesizer_reference if synthesizer else vanilla_reference
    x = torch.randn(3, BLOCK - 1, 32, dtype=torch.float64)
    with torch.no_grad():
        for T in range(1, BLOCK):
            torch.testing.assert_close(
                att(x[:, :T]), reference(att, x[:, :T]), atol=1e-10, rtol=1e-10
            )


@pytest.mark.parametrize('variant', ['vanilla', 'rope'])
def test_model_matches_float64_forward_from_its_state_dict(variant):
    assert_matches_reference_forward(variant)
