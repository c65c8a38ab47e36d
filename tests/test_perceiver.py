"""The perceiver (2023) against direct float64 computations of its handout's equations,
and its parameter names against the 2023 starter's."""

import math

import torch

import attention
import model
from test_attention import BLOCK, assert_matches_reference_forward, attend
from test_model import make_gpt, sharpen


def test_cross_attention_takes_queries_shared_by_the_batch():
    """x_q of batch 1 (the down block's basis C, not expanded, as students pass it) gives
    what the basis repeated for each row gives."""
    config = model.GPTConfig(50, BLOCK, n_layer=1, n_head=4, n_embd=32)
    torch.manual_seed(0)
    att = sharpen(attention.CausalCrossAttention(config), std=0.4).eval()
    x, basis = torch.randn(3, 20, 32), torch.randn(1, 8, 32)
    with torch.no_grad():
        shared = att(x, basis)
        torch.testing.assert_close(shared, att(x, basis.expand(3, -1, -1)))
    assert shared.shape == (3, 8, 32)


def test_cross_attention_matches_float64_equations_at_every_length():
    config = model.GPTConfig(50, BLOCK, n_layer=1, n_head=4, n_embd=32)
    torch.manual_seed(0)
    att = sharpen(attention.CausalCrossAttention(config), std=0.4).eval()
    state = {'attn.' + k: v.double() for k, v in att.state_dict().items()}
    x, basis = torch.randn(3, BLOCK - 1, 32), torch.randn(3, 40, 32)
    with torch.no_grad():
        for T in range(1, BLOCK):
            xt = x[:, :T]
            # down: the basis queries the input; up: the input queries the bottleneck
            torch.testing.assert_close(
                att(xt, basis).double(),
                attend(state, 'attn', basis.double(), xt.double(), 4),
                atol=1e-4,
                rtol=1e-4,
            )
            torch.testing.assert_close(
                att(basis, xt).double(),
                attend(state, 'attn', xt.double(), basis.double(), 4),
                atol=1e-4,
                rtol=1e-4,
            )


def test_perceiver_state_dict_names_and_shapes():
    gpt = make_gpt('perceiver')
    state = gpt.state_dict()
    assert state['down_block.C'].shape == (1, 32, 256)
    bound = math.sqrt(6 / (32 * 256 + 256))  # xavier_uniform on (1, m, C): fan_in m*C, fan_out C
    assert state['down_block.C'].abs().max() <= bound and state['down_block.C'].std() > bound / 3
    # the middle blocks span the bottleneck
    assert state['blocks.0.attn.mask'].shape == (1, 1, 32, 32)
    assert {k.split('.')[0] for k in state} == {
        'pos_emb',
        'tok_emb',
        'down_block',
        'blocks',
        'up_block',
        'ln_f',
        'head',
    }
    assert {k for k in state if k.startswith('blocks.')} == {
        f'blocks.{i}.{k}'
        for i in range(2)
        for k in [k.split('.', 2)[2] for k in state if k.startswith('blocks.0.')]
    }
    for part in ('down_block', 'up_block'):
        assert {k.split('.', 1)[1] for k in state if k.startswith(part + '.')} >= {
            'attn.key.weight',
            'attn.query.weight',
            'attn.value.weight',
            'attn.proj.weight',
            'attn.mask',
            'ln1.weight',
            'ln2.weight',
            'mlp.0.weight',
            'mlp.2.weight',
        }


def test_perceiver_matches_float64_forward_from_its_state_dict():
    assert_matches_reference_forward('perceiver')
