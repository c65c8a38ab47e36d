"""The model against the handout's equations, computed independently here, and the fast
paths (packed loss, key/value cache, batched greedy decoding, bf16) against the plain
ones, for every variant (test_attention.py and test_perceiver.py hold the equations)."""

import pytest
import torch
from torch.nn import functional as F

import model
import perceiver
from conftest import packed_loss
from machinery import decoding

BLOCK = 128
VARIANTS = {
    'vanilla': {},
    'synthesizer': dict(synthesizer=True),
    'rope': dict(rope=True),
    'perceiver': dict(bottleneck_dim=32),
}
SMALL = dict(vocab=40, n_layer=3, n_head=4, n_embd=32)  # the perceiver: down, 1 block, up


def make_gpt(variant, vocab=256, seed=0, sharp=False, **sizes):
    """The assignment's model size unless sizes are given; `sharp`: see sharpen."""
    torch.manual_seed(seed)
    sizes = sizes or dict(n_layer=4, n_head=8, n_embd=256)
    config = model.GPTConfig(vocab, BLOCK, **VARIANTS[variant], **sizes)
    gpt = perceiver.PerceiverGPT(config) if variant == 'perceiver' else model.GPT(config)
    return sharpen(gpt) if sharp else gpt


def sharpen(module, std=0.5):
    """Redraws every parameter with a large spread (LayerNorm weights around 1). At the
    N(0, 0.02) init attention is nearly uniform and the position embeddings are zero, so
    a wrong score scale, mask or position would go unseen; here attention is sharp (most
    rows put over half their weight on one position) and positions matter."""
    with torch.no_grad():
        for p in module.parameters():
            p.normal_(0.0, std)
        for m in module.modules():
            if isinstance(m, torch.nn.LayerNorm):
                m.weight.add_(1.0)
    return module


def test_parameter_counts():
    count = lambda m: sum(p.numel() for p in m.parameters())
    assert count(make_gpt('vanilla')) == 3_323_392
    # the synthesizer swaps key+query (2 x (256*256+256)) for w1 (256*256+256), w2 (32x127), b2 (127)
    assert count(make_gpt('synthesizer')) == 3_323_392 - 4 * (256 * 256 + 256 - 32 * 127 - 127)


def original_keys(synthesizer, n_layer=4):
    """The state_dict keys of the original starter code."""
    keys = ['pos_emb', 'tok_emb.weight']
    attn = (
        ['w1.weight', 'w1.bias', 'w2', 'b2', 'value.weight', 'value.bias']
        if synthesizer
        else ['key.weight', 'key.bias', 'query.weight', 'query.bias', 'value.weight', 'value.bias']
    )
    for i in range(n_layer):
        b = f'blocks.{i}.'
        keys += [b + k for k in ['ln1.weight', 'ln1.bias', 'ln2.weight', 'ln2.bias']]
        keys += [b + 'attn.' + k for k in attn + ['proj.weight', 'proj.bias', 'mask']]
        keys += [b + 'mlp.' + k for k in ['0.weight', '0.bias', '2.weight', '2.bias']]
    return set(keys + ['ln_f.weight', 'ln_f.bias', 'head.weight'])


@pytest.mark.parametrize('synthesizer', [False, True])
def test_state_dict_matches_original(synthesizer):
    state = make_gpt('synthesizer' if synthesizer else 'vanilla').state_dict()
    assert set(state) == original_keys(synthesizer)
    assert state['pos_emb'].shape == (1, BLOCK, 256)
    assert state['blocks.0.attn.mask'].shape == (1, 1, BLOCK, BLOCK)
    if synthesizer:
        assert state['blocks.0.attn.w2'].shape == (256 // 8, BLOCK - 1)
        assert state['blocks.0.attn.b2'].shape == (BLOCK - 1,)
        assert state['blocks.0.attn.w2'].abs().max() <= 0.001


def test_initialisation():
    gpt = make_gpt('vanilla')
    assert torch.all(gpt.pos_emb == 0)
    assert abs(gpt.head.weight.std().item() - 0.02) < 0.002
    assert torch.all(gpt.blocks[0].mlp[0].bias == 0)
    assert torch.all(gpt.ln_f.weight == 1) and torch.all(gpt.ln_f.bias == 0)
    assert (
        model.GPTConfig(10, 8).attn_pdrop == 0.1 and model.GPTConfig(10, 8, n_layer=3).n_layer == 3
    )


@pytest.mark.parametrize('variant', VARIANTS)
def test_causal(variant):
    """Changing input s changes outputs s.. and leaves the earlier ones bit for bit (31, 32:
    the perceiver's bottleneck ends there in this model)."""
    gpt = make_gpt(variant, **SMALL, sharp=True).eval()
    idx = torch.randint(0, 40, (2, BLOCK - 1))
    with torch.no_grad():
        base, _ = gpt(idx)
        for s in (0, 5, 31, 32, 50, 126):
            changed = idx.clone()
            changed[:, s] = (changed[:, s] + 1) % 40
            out, _ = gpt(changed)
            assert torch.equal(out[:, :s], base[:, :s]), s
            assert not torch.allclose(out[:, s:], base[:, s:]), s


def test_loss_ignores_pad_targets():
    gpt = make_gpt('vanilla', vocab=30, n_layer=1, n_head=2, n_embd=16).eval()
    idx = torch.randint(1, 30, (2, 10))
    targets = torch.randint(1, 30, (2, 10))
    targets[:, 6:] = 0
    logits, loss = gpt(idx, targets)
    expected = F.cross_entropy(logits[:, :6].reshape(-1, 30), targets[:, :6].reshape(-1))
    torch.testing.assert_close(loss, expected)


@pytest.mark.parametrize('variant', VARIANTS)
def test_bf16_autocast_loss_is_close(variant):
    gpt = make_gpt(variant, **SMALL, sharp=True).eval()
    idx, targets = ragged_batch(40)
    with torch.no_grad():
        _, plain = gpt(idx, targets)
        with torch.autocast('cpu', dtype=torch.bfloat16):
            fast = packed_loss(gpt, idx, targets)
    assert fast.dtype == torch.float32
    assert abs(fast.item() - plain.item()) < 0.02 * plain.item()


@pytest.mark.parametrize('variant', ['vanilla', 'synthesizer', 'rope'])
def test_cached_forward_equals_full_forward(variant):
    """The decoder's cache keeps each attention's earlier inputs: the attention sees the
    whole sequences from position 0 (rope rotates at the absolute positions), the other
    layers the fed positions alone, each row at its own (rows of different lengths, as the
    decoder batches them). The perceiver decodes without it."""
    gpt = make_gpt(variant, **SMALL, sharp=True).eval()
    assert gpt.decodes_with_cache and not make_gpt('perceiver', **SMALL).decodes_with_cache
    idx = torch.randint(0, 40, (3, 60))
    starts = torch.tensor([20, 27, 31])  # each row's prompt length
    with torch.no_grad():
        full, _ = gpt(idx)  # (3, 60, vocab)
        cache = decoding.Cache()
        cache.feed(torch.arange(31).expand(3, 31))
        first, _ = gpt(idx[:, :31], cache=cache)
        torch.testing.assert_close(first, full[:, :31], atol=1e-4, rtol=1e-4)
        for step in range(25):
            cache.feed((starts + step)[:, None])  # (3, 1): each row's next position
            logits, _ = gpt(idx[torch.arange(3)[:, None], cache.positions], cache=cache)
            expected = full[torch.arange(3), starts + step][:, None]  # (3, 1, vocab)
            torch.testing.assert_close(logits, expected, atol=1e-4, rtol=1e-4)  # logits ~ 10


@pytest.mark.parametrize('variant', VARIANTS)
def test_training_mode_path_equals_eval_path_without_dropout(variant):
    """In training, attention takes another path (written out, grouped by row length);
    with dropout off it must compute what evaluation computes."""
    gpt = make_gpt(variant, **SMALL, sharp=True, embd_pdrop=0.0, resid_pdrop=0.0, attn_pdrop=0.0)
    idx, targets = ragged_batch(40, B=20, leading_pad=True)
    with torch.no_grad():
        _, plain = gpt.eval()(idx, targets)
        fast = packed_loss(gpt.train(), idx, targets)
    torch.testing.assert_close(fast, plain, atol=1e-6, rtol=1e-5)


def ragged_batch(vocab, B=6, T=BLOCK - 1, leading_pad=False, seed=0):
    """Rows of different lengths padded with 0, like both datasets make."""
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(2, vocab, (B, T), generator=g)
    targets = torch.randint(2, vocab, (B, T), generator=g)
    for b, n in enumerate(torch.randint(3, T, (B,), generator=g).tolist()):
        idx[b, n:] = 0
        targets[b, n - 1 :] = 0
        if leading_pad:
            targets[b, : n // 3] = 0  # NameDataset: no targets inside the question
    return idx, targets
