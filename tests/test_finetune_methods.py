"""finetune_methods.py: LoRA and adapters against their equations, a start exactly at the
pretrained model, frozen weights that stay frozen, an exact merge, exact resumes, and
run.py's --finetune_method from the command line."""

import math
import random

import pytest
import torch
import torch.nn as nn

import model
import perceiver
import trainer
from conftest import cli, main, packed_loss
from machinery import files, finetune_methods
from test_resume import train_to_end
from test_trainer import tiny_setup

VARIANTS = ['vanilla', 'synthesizer', 'rope', 'perceiver']


def small_gpt(variant, dtype=torch.float32):
    """A small GPT of the variant (vocabulary 11, 16 positions), in eval mode."""
    torch.manual_seed(0)
    config = model.GPTConfig(
        11,
        16,
        n_layer=3,
        n_head=2,
        n_embd=8,
        synthesizer=variant == 'synthesizer',
        rope=variant == 'rope',
        bottleneck_dim=6 if variant == 'perceiver' else None,
    )
    gpt = perceiver.PerceiverGPT(config) if variant == 'perceiver' else model.GPT(config)
    return gpt.to(dtype).eval()


def randomise_new_weights(gpt):
    """Nonzero values for the weights that start at zero (lora_B, the adapters' up)."""
    with torch.no_grad():
        for p in gpt.parameters():
            if p.requires_grad:
                p.copy_(torch.randn_like(p) * 0.3)


def test_lora_linear_is_its_equation():
    torch.manual_seed(1)
    linear = nn.Linear(6, 5).double()
    lora = finetune_methods.LoRALinear(linear, rank=3, alpha=6.0)
    assert lora.weight is linear.weight and lora.bias is linear.bias
    assert lora.lora_A.shape == (3, 6) and lora.lora_B.shape == (5, 3)
    assert torch.equal(lora.lora_B, torch.zeros(5, 3))
    # Kaiming-uniform with a = sqrt(5): uniform in +-1/sqrt(in_features), as loralib's
    assert 0 < lora.lora_A.abs().max() <= 1 / math.sqrt(6)
    lora.double()
    with torch.no_grad():
        lora.lora_B.normal_()
    W, b, A, B = linear.weight, linear.bias, lora.lora_A, lora.lora_B
    x = torch.randn(2, 4, 6, dtype=torch.float64)
    expected = torch.zeros(2, 4, 5, dtype=torch.float64)
    for i in range(2):
        for t in range(4):
            # y_o = sum_j W_oj x_j + b_o + (alpha / r) sum_r B_or sum_j A_rj x_j
            expected[i, t] = W @ x[i, t] + b + (6.0 / 3) * (B @ (A @ x[i, t]))
    torch.testing.assert_close(lora(x), expected, rtol=0, atol=1e-12)
    torch.testing.assert_close(lora.merged_weight(), W + (6.0 / 3) * B @ A, rtol=0, atol=1e-12)


def test_adapter_is_its_equation_after_attention_and_mlp():
    gpt = small_gpt('vanilla', torch.float64)
    finetune_methods.add_adapters(gpt, 3)
    randomise_new_weights(gpt)
    block = gpt.blocks[1]
    x = torch.randn(2, 5, 8, dtype=torch.float64)

    def adapter(a, h):  # h + W_up gelu(W_down h + b_down) + b_up, gelu(z) = z Phi(z)
        z = h @ a.down.weight.T + a.down.bias
        gelu = 0.5 * z * (1 + torch.erf(z / math.sqrt(2)))
        return h + gelu @ a.up.weight.T + a.up.bias

    with torch.no_grad():
        attn = block.attn.forward(block.ln1(x))  # .forward: without the hook
        h = x + adapter(block.attn.adapter, attn)
        mlp = block.mlp[3](block.mlp[2](block.mlp[1](block.mlp[0](block.ln2(h)))))
        expected = h + adapter(block.mlp.adapter, mlp)
        torch.testing.assert_close(block(x), expected, rtol=0, atol=1e-12)


def trainable_count(gpt):
    return sum(p.numel() for p in gpt.parameters() if p.requires_grad)


@pytest.mark.parametrize('variant', VARIANTS)
@pytest.mark.parametrize('method', ['lora', 'adapter'])
def test_training_starts_at_the_pretrained_model(variant, method):
    """Same logits and loss, bit for bit, plain and packed; only the new weights train."""
    gpt = small_gpt(variant)
    idx = torch.randint(1, 11, (3, 15))  # the synthesizer has 15 positions
    targets = torch.randint(0, 11, (3, 15))
    targets[0, 9:] = 0  # rows of different lengths, as packing sees them
    with torch.no_grad():
        logits, loss = gpt(idx, targets)
        packed = packed_loss(gpt, idx, targets)
    linears = finetune_methods.block_linears(gpt)
    sublayers = finetune_methods.sublayers(gpt)
    finetune_methods.apply(gpt, method, lora_rank=2, lora_alpha=4.0, adapter_size=3)
    with torch.no_grad():
        assert torch.equal(gpt(idx, targets)[0], logits)
        assert torch.equal(gpt(idx, targets)[1], loss)
        assert torch.equal(packed_loss(gpt, idx, targets), packed)
    if method == 'lora':
        assert trainable_count(gpt) == sum(
            2 * (m.in_features + m.out_features) for _, _, m in linears
        )
        assert all(
            n.endswith(('lora_A', 'lora_B')) for n, p in gpt.named_parameters() if p.requires_grad
        )
        assert type(gpt.head) is nn.Linear
    else:  # one adapter on each attention and MLP: (8*3 + 3) + (3*8 + 8) weights each
        assert trainable_count(gpt) == len(sublayers) * (8 * 3 + 3 + 3 * 8 + 8)
        assert all('.adapter.' in n for n, p in gpt.named_parameters() if p.requires_grad)
    assert len(sublayers) == 2 * 3  # the perceiver's: down, one middle block, up


@pytest.mark.parametrize('variant', VARIANTS)
@pytest.mark.parametrize('method', ['lora', 'adapter'])
def test_the_trainers_packed_loss_is_the_plain_loss_with_the_new_weights(variant, method):
    gpt = small_gpt(variant, torch.float64)
    finetune_methods.apply(gpt, method, lora_rank=2, lora_alpha=4.0, adapter_size=3)
    randomise_new_weights(gpt)
    idx = torch.randint(1, 11, (3, 15))
    targets = torch.randint(1, 11, (3, 15))
    targets[0, 9:], targets[2, 4:] = 0, 0  # rows the packing cuts short
    with torch.no_grad():
        torch.testing.assert_close(
            packed_loss(gpt, idx, targets), gpt(idx, targets)[1], rtol=1e-12, atol=0
        )


@pytest.mark.parametrize('variant', VARIANTS)
def test_merged_lora_computes_what_unmerged_lora_computes(variant):
    gpt = small_gpt(variant, torch.float64)
    finetune_methods.apply(gpt, 'lora', lora_rank=2, lora_alpha=3.0, adapter_size=None)
    randomise_new_weights(gpt)
    merged = finetune_methods.merge_lora(gpt.state_dict(), gpt)
    plain = small_gpt(variant, torch.float64)
    plain.load_state_dict(merged)  # strict: the plain model's names exactly
    idx = torch.randint(1, 11, (2, 15))
    with torch.no_grad():
        expected = gpt(idx)[0]
        assert not torch.allclose(expected, small_gpt(variant, torch.float64)(idx)[0])
        torch.testing.assert_close(plain(idx)[0], expected, rtol=0, atol=1e-10)
    # and in fp32, which the params files hold
    gpt.float(), plain.float()
    plain.load_state_dict(finetune_methods.merge_lora(gpt.state_dict(), gpt))
    with torch.no_grad():
        torch.testing.assert_close(plain(idx)[0], gpt(idx)[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('method', ['lora', 'adapter'])
def test_frozen_weights_stay_frozen_and_the_new_ones_decay_as_the_original_decides(method):
    random.seed(0)
    gpt, ds, config = tiny_setup(max_epochs=1)
    finetune_methods.apply(gpt, method, lora_rank=2, lora_alpha=2.0, adapter_size=4)
    before = {k: v.clone() for k, v in gpt.state_dict().items()}
    run = trainer.Trainer(gpt, ds, None, config)
    groups = run.optimizer.param_groups
    names = {id(p): n for n, p in gpt.named_parameters()}
    decayed = {names[id(p)] for p in groups[0]['params']}
    undecayed = {names[id(p)] for p in groups[1]['params']}
    trained = {n for n, p in gpt.named_parameters() if p.requires_grad}
    assert decayed | undecayed == trained
    assert undecayed == {n for n in trained if 'bias' in n}
    run.train()
    for name, value in gpt.state_dict().items():
        changed = not torch.equal(value, before[name])
        assert changed == (name in trained), name


@pytest.mark.parametrize('method', ['lora', 'adapter'])
def test_interrupted_run_resumes_exactly(tmp_path, method):
    def apply(gpt):
        finetune_methods.apply(gpt, method, lora_rank=2, lora_alpha=2.0, adapter_size=4)

    straight = train_to_end(tmp_path, prepare=apply)
    resumed = train_to_end(tmp_path, 5, prepare=apply)
    assert straight.keys() == resumed.keys()
    for k in straight:
        assert torch.equal(straight[k], resumed[k]), k


def test_resuming_with_another_method_is_one_line(tmp_path):
    state = str(tmp_path / 'state.resume')
    gpt, ds, config = tiny_setup(resume_path=state, finetune_method='LoRA rank 2, alpha 2')
    finetune_methods.apply(gpt, 'lora', lora_rank=2, lora_alpha=2.0, adapter_size=None)
    run = trainer.Trainer(gpt, ds, None, config)
    run.epoch, run.step = 0, 1
    run.save_state()
    gpt, ds, config = tiny_setup(
        resume_path=state, resume=True, finetune_method='LoRA rank 2, alpha 4'
    )
    finetune_methods.apply(gpt, 'lora', lora_rank=2, lora_alpha=4.0, adapter_size=None)
    with pytest.raises(
        files.UserError,
        match=r'finetune_method LoRA rank 2, alpha 2 \(this run: LoRA rank 2, alpha 4\)',
    ):
        trainer.Trainer(gpt, ds, None, config).train()


FINETUNE = ['--reading_params_path', 'vanilla.params', '--finetune_corpus_path', 'train.tsv',
            '--max_epochs', 1, '--batch_size', 4]  # fmt: skip
EVALUATE = ['--eval_corpus_path', 'dev.tsv', '--outputs_path', 'dev.predictions']


def assert_trained(out, pretrained, folder, trained, method):
    """The start line counts the pretrained model's parameters plus the trained ones."""
    state = torch.load(folder / pretrained)
    total = sum(v.numel() for k, v in state.items() if not k.endswith(('mask', 'rope_cache')))
    total += trained
    line = f"{total:,} parameters, {trained:,} of them trained ({trained / total:.2%}: {method})"
    assert line in out, out


@pytest.mark.slow
def test_lora_from_the_command_line_writes_plain_params(params):
    out = cli('finetune', 'vanilla', 'wiki.txt', *FINETUNE, '--writing_params_path', 'lora.params',
              '--finetune_method', 'lora', '--lora_rank', 4, cwd=params).stdout  # fmt: skip
    # 4 layers x (4 attention linears x 4 (256 + 256) + 4 (256 + 1024) + 4 (1024 + 256))
    assert_trained(out, 'vanilla.params', params, 73_728, 'LoRA rank 4, alpha 8')
    pretrained = torch.load(params / 'vanilla.params')
    written = torch.load(params / 'lora.params')
    assert written.keys() == pretrained.keys()
    for name in pretrained:
        adapted = name.startswith('blocks.') and name.endswith('.weight') and 'ln' not in name
        assert torch.equal(written[name], pretrained[name]) != adapted, name
    result = cli('evaluate', 'vanilla', 'wiki.txt', '--reading_params_path', 'lora.params',
                 *EVALUATE, cwd=params)  # fmt: skip
    assert 'Correct: ' in result.stdout and 'adapters' not in result.stdout


@pytest.mark.slow
def test_adapters_from_the_command_line_are_recognised_by_evaluate(params):
    out = cli('finetune', 'rope', 'wiki.txt', *FINETUNE[2:], '--reading_params_path', 'rope.params',
              '--writing_params_path', 'adapter.params', '--finetune_method', 'adapter',
              cwd=params).stdout  # fmt: skip
    # 4 layers x 2 sublayers x (256 x 16 + 16 + 16 x 256 + 256)
    assert_trained(out, 'rope.params', params, 67_712, 'adapters of size 16')
    written = torch.load(params / 'adapter.params')
    pretrained = torch.load(params / 'rope.params')
    assert {n for n in written if '.adapter.' in n} == written.keys() - pretrained.keys()
    assert len(written) - len(pretrained) == 4 * 2 * 4
    for name in pretrained:
        assert torch.equal(written[name], pretrained[name]), name
    result = cli('evaluate', 'rope', 'wiki.txt', '--reading_params_path', 'adapter.params',
                 *EVALUATE, cwd=params)  # fmt: skip
    assert 'adapter.params: evaluating with its adapters' in result.stdout
    assert 'Correct: ' in result.stdout
    # a model finetuned with adapters is not a starting point for finetuning
    code = main('finetune', 'rope', 'wiki.txt', *FINETUNE[2:], '--reading_params_path',
                'adapter.params', '--writing_params_path', 'x.params', cwd=params)  # fmt: skip
    assert code == 2
