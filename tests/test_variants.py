"""The later editions' variants: RoPE (2024/25) and the perceiver (2023), against direct
float64 computations of their handouts' equations, and their fast paths (packed loss,
cached and batched decoding, bf16 autocast) against the plain ones."""
import math

import pytest
import torch
from torch.nn import functional as F

import attention
import model
import utils
from test_model import ragged_batch

BLOCK = 128
VARIANTS = {'rope': dict(rope=True), 'perceiver': dict(perceiver=True, bottleneck_dim=32)}


def make_gpt(variant, vocab=40, seed=0, spread=None, **sizes):
    """A small GPT of the variant; with `spread`, every weight but LayerNorm's is drawn
    from N(0, spread^2), so that attention is sharp and positions matter (the N(0, 0.02)
    init makes attention nearly uniform, where position mistakes hardly show)."""
    torch.manual_seed(seed)
    sizes = sizes or dict(n_layer=4, n_head=4, n_embd=32)
    gpt = model.GPT(model.GPTConfig(vocab, BLOCK, **VARIANTS[variant], **sizes))
    if spread:
        with torch.no_grad():
            for name, p in gpt.named_parameters():
                if '.ln' not in name and not name.startswith('ln'):
                    p.normal_(0.0, spread)
    return gpt


# --- Direct computations of the handouts' equations, in float64 --------------------------

def rotate(x):
    """RoPE on (B, T, d) by the 2024 handout's formula, as complex numbers: the pair
    (x_{2i-1}, x_{2i}) at position t times e^{i t theta_i}, theta_i = 10000^(-2(i-1)/d)."""
    T, d = x.shape[-2:]
    i = torch.arange(1, d // 2 + 1, dtype=torch.float64)
    theta = 10000.0 ** (-2 * (i - 1) / d)  # (d/2,)
    t = torch.arange(T, dtype=torch.float64)[:, None]  # (T, 1)
    z = torch.complex(x[..., 0::2], x[..., 1::2]) * torch.polar(torch.ones_like(t * theta), t * theta)
    return torch.stack((z.real, z.imag), dim=-1).flatten(-2)


def linear(state, name, x):
    return x @ state[name + '.weight'].T + state[name + '.bias']


def layer_norm(state, name, x):
    return F.layer_norm(x, x.shape[-1:], state[name + '.weight'], state[name + '.bias'])


def attend(state, name, x_q, x_kv, n_head, rope=False, probs=None):
    """Per head i: softmax((X_q Q_i)(X_kv K_i)^T / sqrt(d/h), query t sees keys 0..t) (X_kv V_i),
    heads side by side, then the projection."""
    Q, K, V = linear(state, name + '.query', x_q), linear(state, name + '.key', x_kv), linear(state, name + '.value', x_kv)
    hs = Q.size(-1) // n_head
    future = torch.ones(Q.size(1), K.size(1), dtype=torch.bool).triu(1)  # key after the query
    heads = []
    for i in range(n_head):
        cols = slice(i * hs, (i + 1) * hs)
        q, k = (rotate(Q[..., cols]), rotate(K[..., cols])) if rope else (Q[..., cols], K[..., cols])
        p = torch.softmax((q @ k.transpose(1, 2) / math.sqrt(hs)).masked_fill(future, float('-inf')), dim=-1)
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
        x = x + state['pos_emb'][:, :idx.size(1)]
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
    x = torch.randn(2, 3, 50, 32, dtype=torch.float64)
    expected = rotate(x.flatten(0, 1)).view_as(x)
    torch.testing.assert_close(attention.apply_rotary_emb(x, cache), expected)
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
    att = attention.CausalSelfAttention(config).eval()
    with torch.no_grad():
        for p in att.parameters():
            p.normal_(0.0, 0.4)  # sharp attention
    state = {'attn.' + k: v.double() for k, v in att.state_dict().items()}
    x = torch.randn(3, BLOCK - 1, 32)
    probs = []
    with torch.no_grad():
        for T in range(1, BLOCK):
            expected = attend(state, 'attn', x[:, :T].double(), x[:, :T].double(), 4, variant == 'rope', probs)
            torch.testing.assert_close(att(x[:, :T]).double(), expected, atol=1e-4, rtol=1e-4)
    p = probs[-1]  # (B, T, T) at T = 127
    assert (p.amax(dim=-1) > 0.5).float().mean() > 0.5, 'attention should be sharp here'
    if variant == 'rope':  # the comparison can tell a wrong theta: the starter docstring's sign
        angles = torch.arange(BLOCK)[:, None] * 10000.0 ** (torch.arange(0, 8, 2) / 8)[None, :]  # (T, hs/2)
        att.rope_cache.copy_(torch.stack((angles.cos(), angles.sin()), dim=-1))
        with torch.no_grad():
            assert not torch.allclose(att(x).double(), attend(state, 'attn', x.double(), x.double(), 4, True),
                                      atol=1e-2)


# --- The perceiver ---------------------------------------------------------------------------

def test_cross_attention_matches_float64_equations_at_every_length():
    config = model.GPTConfig(50, BLOCK, n_layer=1, n_head=4, n_embd=32)
    torch.manual_seed(0)
    att = attention.CausalCrossAttention(config).eval()
    with torch.no_grad():
        for p in att.parameters():
            p.normal_(0.0, 0.4)
    state = {'attn.' + k: v.double() for k, v in att.state_dict().items()}
    x, basis = torch.randn(3, BLOCK - 1, 32), torch.randn(3, 40, 32)
    with torch.no_grad():
        for T in range(1, BLOCK):
            xt = x[:, :T]
            # down: the basis queries the input; up: the input queries the bottleneck
            torch.testing.assert_close(att(xt, basis).double(),
                                       attend(state, 'attn', basis.double(), xt.double(), 4), atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(att(basis, xt).double(),
                                       attend(state, 'attn', xt.double(), basis.double(), 4), atol=1e-4, rtol=1e-4)


def test_perceiver_state_dict_names_and_shapes():
    gpt = make_gpt('perceiver', vocab=256, n_layer=4, n_head=8, n_embd=256)
    state = gpt.state_dict()
    assert state['down_block.C'].shape == (1, 32, 256)
    bound = math.sqrt(6 / (32 * 256 + 256))  # xavier_uniform on (1, m, C): fan_in m*C, fan_out C
    assert state['down_block.C'].abs().max() <= bound and state['down_block.C'].std() > bound / 3
    assert state['blocks.0.attn.mask'].shape == (1, 1, 32, 32)  # the middle blocks span the bottleneck
    assert {k.split('.')[0] for k in state} == {'pos_emb', 'tok_emb', 'down_block', 'blocks', 'up_block',
                                               'ln_f', 'head'}
    assert {k for k in state if k.startswith('blocks.')} == {f'blocks.{i}.{k}' for i in range(2) for k in
                                                            [k.split('.', 2)[2] for k in state if k.startswith('blocks.0.')]}
    for part in ('down_block', 'up_block'):
        assert {k.split('.', 1)[1] for k in state if k.startswith(part + '.')} >= {
            'attn.key.weight', 'attn.query.weight', 'attn.value.weight', 'attn.proj.weight', 'attn.mask',
            'ln1.weight', 'ln2.weight', 'mlp.0.weight', 'mlp.2.weight'}


def test_rope_state_dict_names_and_shapes():
    state = make_gpt('rope', vocab=256, n_layer=4, n_head=8, n_embd=256).state_dict()
    assert 'pos_emb' not in state
    for i in range(4):
        torch.testing.assert_close(state[f'blocks.{i}.attn.rope_cache'], attention.precompute_rotary_emb(32, BLOCK))
    assert sum(v.numel() for k, v in state.items() if 'mask' not in k and 'rope_cache' not in k) == \
        3_323_392 - BLOCK * 256


@pytest.mark.parametrize('variant', ['rope', 'perceiver'])
def test_model_matches_float64_forward_from_its_state_dict(variant):
    gpt = make_gpt(variant, spread=0.3).eval()
    idx = torch.randint(0, 40, (2, BLOCK - 1))
    with torch.no_grad():
        for T in (1, 2, 31, 32, 33, 64, BLOCK - 1):
            expected = reference_forward(gpt.state_dict(), idx[:, :T], n_head=4, n_layer=4)
            torch.testing.assert_close(gpt(idx[:, :T])[0].double(), expected, atol=2e-4, rtol=1e-4)


@pytest.mark.parametrize('variant', ['rope', 'perceiver'])
def test_causal(variant):
    gpt = make_gpt(variant, spread=0.3).eval()
    idx = torch.randint(0, 40, (2, BLOCK - 1))
    with torch.no_grad():
        base, _ = gpt(idx)
        for s in (0, 5, 31, 32, 50, 126):
            changed = idx.clone()
            changed[:, s] = (changed[:, s] + 1) % 40
            out, _ = gpt(changed)
            assert torch.equal(out[:, :s], base[:, :s]), s
            assert not torch.allclose(out[:, s:], base[:, s:]), s


# --- The fast paths ----------------------------------------------------------------------------

@pytest.mark.parametrize('variant', ['rope', 'perceiver'])
@pytest.mark.parametrize('leading_pad', [False, True])
def test_packed_loss_equals_plain_loss_and_gradients(variant, leading_pad):
    gpt = make_gpt(variant, spread=0.1).eval()
    idx, targets = ragged_batch(40, leading_pad=leading_pad)
    _, plain = gpt(idx, targets)
    plain.backward()
    plain_grads = {n: p.grad.clone() for n, p in gpt.named_parameters()}
    gpt.zero_grad()
    packed = gpt.packed_loss(idx, targets)
    packed.backward()
    torch.testing.assert_close(packed, plain, atol=1e-6, rtol=1e-5)
    for n, p in gpt.named_parameters():
        torch.testing.assert_close(p.grad, plain_grads[n], atol=1e-5, rtol=1e-4, msg=n)


@pytest.mark.parametrize('variant', ['rope', 'perceiver'])
def test_packed_loss_every_length(variant):
    gpt = make_gpt(variant, spread=0.1).eval()
    idx = torch.randint(2, 40, (BLOCK - 1, BLOCK))  # up to 128 positions: the 2024 examples
    targets = torch.randint(2, 40, (BLOCK - 1, BLOCK))
    for b in range(BLOCK - 1):  # row b has b+2 targets
        targets[b, b + 2:] = 0
        idx[b, b + 2:] = 0
    with torch.no_grad():
        for rows in [slice(b, b + 1) for b in range(0, BLOCK - 1, 14)] + [slice(0, BLOCK - 1)]:
            _, plain = gpt(idx[rows], targets[rows])
            torch.testing.assert_close(gpt.packed_loss(idx[rows], targets[rows]), plain, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize('variant', ['rope', 'perceiver'])
def test_training_mode_path_equals_eval_path_without_dropout(variant):
    gpt = make_gpt(variant, spread=0.1, n_layer=3, n_head=4, n_embd=32,
                   embd_pdrop=0.0, resid_pdrop=0.0, attn_pdrop=0.0)
    idx, targets = ragged_batch(40, B=20, leading_pad=True)
    with torch.no_grad():
        _, plain = gpt.eval()(idx, targets)
        fast = gpt.train().packed_loss(idx, targets)
    torch.testing.assert_close(fast, plain, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize('variant', ['rope', 'perceiver'])
def test_bf16_autocast_loss_is_close(variant):
    gpt = make_gpt(variant).eval()
    idx, targets = ragged_batch(40)
    with torch.no_grad():
        _, plain = gpt(idx, targets)
        with torch.autocast('cpu', dtype=torch.bfloat16):
            fast = gpt.packed_loss(idx, targets)
    assert fast.dtype == torch.float32
    assert abs(fast.item() - plain.item()) < 0.02 * plain.item()


@pytest.mark.parametrize('variant', ['rope', 'perceiver'])
def test_cached_forward_equals_full_forward(variant):
    gpt = make_gpt(variant, spread=0.3).eval()
    idx = torch.randint(0, 40, (3, 60))
    with torch.no_grad():
        full, _ = gpt(idx)
        cache = gpt.new_cache()
        steps = [gpt(idx[:, :20], cache=cache)[0]]
        for t in range(20, 60):
            steps.append(gpt(idx[:, t:t + 1], cache=cache)[0])
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize('variant', ['rope', 'perceiver'])
def test_greedy_complete_equals_plain_sampling(variant):
    gpt = make_gpt(variant, vocab=12, seed=3, spread=0.2).eval()
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(2, 12, (n,), generator=g) for n in [5, 9, 5, 17, 40, 1]]
    stop = 1
    completions = utils.greedy_complete(gpt, prompts, 32, stop, batch_size=2)
    for p, got in zip(prompts, completions):
        plain = utils.sample(gpt, p[None], 32)[0, len(p):].tolist()
        expected = plain[:plain.index(stop) + 1] if stop in plain else plain
        assert got == expected
    assert len({tuple(c) for c in completions}) > 3  # the completions do differ
