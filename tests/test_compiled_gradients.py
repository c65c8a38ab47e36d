"""tools/compiled_gradients.py: the loss and gradients it compares are the direct fp32
and bf16 computations; the traced graph run by eager kernels lies as far from fp32 as eager
does; and its split backends (slow: inductor's C++ kernels on the CPU) give inductor the
side they name and only that side."""

import re

import pytest
import torch

import bench
import compiled_gradients
import dataset
from conftest import tiny_corpus
from test_model import make_gpt


@pytest.fixture
def tiny_model(monkeypatch):
    """bench's model made small, so that a test's steps take a moment."""
    monkeypatch.setattr(
        bench, 'make_model', lambda vocab, variant='vanilla', *_: make_gpt(variant, vocab,
                                                                          n_layer=2, n_head=2,
                                                                          n_embd=32)
    )  # fmt: skip
    corpus = dataset.CharCorruptionDataset(tiny_corpus()[0] * 5, 128)
    x, y = bench.first_batch(corpus)
    return corpus, x, y


def direct(gpt, x, y, dtype):
    gpt.zero_grad(set_to_none=True)
    with torch.autocast('cpu', dtype=torch.bfloat16, enabled=dtype is not None):
        loss = gpt(x, y)[1]
    loss.backward()
    return loss.item(), [p.grad.clone() for p in gpt.parameters()]


def test_relative_error_is_the_ratio_of_norms():
    g, reference = torch.tensor([3.0, 4.0, 1.0]), torch.tensor([0.0, 4.0, 1.0])
    assert compiled_gradients.relative_error(g, reference) == pytest.approx(3 / 17**0.5)


def test_eager_training_moves_the_weights_it_measures_at(tiny_model):
    corpus = tiny_model[0]
    gpt, states = compiled_gradients.trained_weights(corpus, 'vanilla', 'cpu', [2, 0])
    assert list(states) == [0, 2]
    initial = bench.make_model(corpus.vocab_size)
    assert all(torch.equal(states[0][k], v) for k, v in initial.state_dict().items())
    assert not torch.equal(states[0]['tok_emb.weight'], states[2]['tok_emb.weight'])
    assert all(m.p == 0 for m in gpt.modules() if isinstance(m, torch.nn.Dropout))


def test_losses_and_gradients_are_the_direct_computations(tiny_model):
    corpus, x, y = tiny_model
    gpt, states = compiled_gradients.trained_weights(corpus, 'vanilla', 'cpu', [0])
    results = compiled_gradients.measure(gpt, states, ['aot_eager'], x, y, 'cpu')[0]
    for name, dtype in [('fp32', None), ('eager', torch.bfloat16)]:
        loss, grads = direct(gpt, x, y, dtype)
        assert results[name][0] == loss
        assert all(torch.equal(a, b) for a, b in zip(results[name][1].values(), grads))
    fp32 = results['fp32'][1]
    zero = compiled_gradients.zero_in_exact_arithmetic(fp32)
    assert zero == {f'blocks.{i}.attn.key.bias' for i in range(2)}
    for n, g in fp32.items():  # the same kernels, traced: as far from fp32 as eager
        if n in zero:
            continue
        eager = compiled_gradients.relative_error(results['eager'][1][n], g)
        traced = compiled_gradients.relative_error(results['aot_eager'][1][n], g)
        assert 0 < eager < 0.1 and traced == pytest.approx(eager, rel=0.1, abs=1e-3), n
    text = compiled_gradients.report({0: results}, ['aot_eager'])
    assert '| tok_emb.weight | ' in text and '| blocks.1.attn.key.bias | |g| ' in text
    assert re.search(r"^aot_eager: its gradients' error is (0\.9\d|1\.0\d)x eager's", text, re.M)


@pytest.mark.slow
@pytest.mark.parametrize('side', ['forward', 'backward'])
def test_a_split_path_gives_inductor_its_side_only(tiny_model, monkeypatch, side):
    from torch._inductor import compile_fx

    compiled, inner = [], compile_fx.compile_fx_inner

    def recorded(graph, inputs, **kwargs):
        compiled.append('backward' if kwargs.get('is_backward') else 'forward')
        return inner(graph, inputs, **kwargs)

    monkeypatch.setattr(compile_fx, 'compile_fx_inner', recorded)
    corpus, x, y = tiny_model
    gpt, states = compiled_gradients.trained_weights(corpus, 'vanilla', 'cpu', [0])
    path = f'inductor-{side}'
    results = compiled_gradients.measure(gpt, states, [path], x, y, 'cpu')[0]
    assert compiled == [side]
    zero = compiled_gradients.zero_in_exact_arithmetic(results['fp32'][1])
    for n, g in results['fp32'][1].items():  # inductor's C++ kernels track eager on the CPU
        if n in zero:
            continue
        eager = compiled_gradients.relative_error(results['eager'][1][n], g)
        assert compiled_gradients.relative_error(results[path][1][n], g) < 3 * eager + 1e-3, n


def test_a_path_whose_gradients_are_not_finite_is_said_so():
    fp32 = {'w': torch.tensor([1.0, 2.0]), 'key.bias': torch.tensor([1e-12, 0.0])}
    eager = {'w': torch.tensor([1.01, 2.0]), 'key.bias': torch.tensor([1e-3, 0.0])}
    broken = {'w': torch.tensor([float('nan'), 2.0]), 'key.bias': torch.tensor([0.0, 0.0])}
    results = {0: {'fp32': (1.0, fp32), 'eager': (1.0, eager), 'p': (float('nan'), broken),
                   'q': (1.0, eager)}}  # fmt: skip
    text = compiled_gradients.report(results, ['p', 'q'])
    assert "p: no comparison (its gradients are not finite, or eager's equal fp32's)" in text
    assert "q: its gradients' error is 1.00x eager's (median over the parameters)" in text
    assert '| key.bias | |g| 1.0e-03 | |g| 0.0e+00 | |g| 1.0e-03 |' in text
