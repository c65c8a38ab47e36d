"""trainer.py: the original's batches, schedule and optimizer groups, and a loss that
goes down (test_resume.py interrupts and resumes it)."""

import inspect
import math
import random
import sys
import textwrap

import pytest
import torch
from torch.utils.data import DataLoader

import attention
import dataset
import model
import perceiver
import trainer
from conftest import tiny_corpus
from test_model import make_gpt


def tiny_setup(tmp_path=None, **overrides):
    text, _ = tiny_corpus()
    ds = dataset.CharCorruptionDataset(text, 32)
    torch.manual_seed(0)
    gpt = model.GPT(model.GPTConfig(ds.vocab_size, 32, n_layer=2, n_head=2, n_embd=32))
    settings = dict(
        max_epochs=3,
        batch_size=8,
        learning_rate=1e-3,
        lr_decay=True,
        warmup_tokens=8 * 31 * 2,
        final_tokens=8 * 31 * 12,
        device='cpu',
    )
    settings.update(overrides)
    return gpt, ds, trainer.TrainerConfig(**settings)


def test_config_defaults():
    c = trainer.TrainerConfig(max_epochs=2)
    assert (c.max_epochs, c.batch_size, c.learning_rate, c.betas) == (2, 64, 3e-4, (0.9, 0.95))
    assert (c.grad_norm_clip, c.weight_decay, c.lr_decay) == (1.0, 0.1, False)
    assert (c.warmup_tokens, c.final_tokens, c.ckpt_path, c.num_workers) == (375e6, 260e9, None, 0)


def test_learning_rate_schedule():
    t = trainer.Trainer(
        torch.nn.Linear(1, 1),
        [],
        None,
        trainer.TrainerConfig(
            learning_rate=1.0, lr_decay=True, warmup_tokens=100, final_tokens=1100
        ),
    )
    assert t.lr_at(0) == 0 and t.lr_at(50) == 0.5 and t.lr_at(100) == 1.0
    assert math.isclose(t.lr_at(600), 0.5)  # half way through the cosine
    assert t.lr_at(1100) == 0.1 and t.lr_at(1000) == 0.1  # the 10% floor
    # As in the original, the cosine is not clamped past final_tokens: it rises again.
    # (The handout's pretraining runs to about 3.2 x final_tokens.)
    assert math.isclose(t.lr_at(2100), 1.0)
    t.config.lr_decay = False
    assert t.lr_at(600) == 1.0


def test_weight_decay_groups_as_original():
    gpt, ds, config = tiny_setup()
    optimizer = trainer.Trainer(gpt, ds, None, config).make_optimizer()
    decay, no_decay = optimizer.param_groups
    names = {id(p): n for n, p in gpt.named_parameters()}
    assert decay['weight_decay'] == 0.1 and no_decay['weight_decay'] == 0.0
    assert all('bias' not in names[id(p)] for p in decay['params'])
    assert all('bias' in names[id(p)] for p in no_decay['params'])
    assert any('ln1.weight' in names[id(p)] for p in decay['params'])  # as the original did
    assert len(decay['params']) + len(no_decay['params']) == len(names)


def test_batches_are_the_original_loaders():
    gpt, ds, config = tiny_setup()
    t = trainer.Trainer(gpt, ds, None, config)
    random.seed(5)
    ours = [t.batch(ds, i) for i in range(math.ceil(len(ds) / 8))]
    random.seed(5)
    original = list(DataLoader(ds, batch_size=8))
    assert len(ours) == len(original)
    for (x, y), (ox, oy) in zip(ours, original):
        assert torch.equal(x, ox) and torch.equal(y, oy)


def test_tokens_and_learning_rate_follow_the_original(tmp_path):
    gpt, ds, config = tiny_setup(metrics_path=str(tmp_path / 'm.csv'))
    t = trainer.Trainer(gpt, ds, None, config)
    t.train()
    assert t.tokens == 3 * len(ds) * 31  # every target position, PAD included
    rows = (tmp_path / 'm.csv').read_text().splitlines()
    steps = 3 * math.ceil(len(ds) / 8)
    assert rows[0] == 'epoch,step,loss,lr,tokens,seconds' and len(rows) == 1 + steps
    tokens = [int(r.split(',')[4]) for r in rows[1:]]
    lrs = [float(r.split(',')[3]) for r in rows[1:]]
    assert tokens[0] == 8 * 31 and tokens[-1] == t.tokens
    assert all(math.isclose(lr, t.lr_at(n), rel_tol=1e-5) for lr, n in zip(lrs, tokens))


def test_training_lowers_the_loss():
    gpt, ds, config = tiny_setup(max_epochs=10, lr_decay=False, learning_rate=3e-3)
    random.seed(0)
    x, y = trainer.Trainer(gpt, ds, None, config).batch(ds, 0)
    with torch.no_grad():
        before = gpt.eval()(x, y)[1].item()
    trainer.Trainer(gpt, ds, None, config).train()
    with torch.no_grad():
        after = gpt.eval()(x, y)[1].item()
    assert after < before - 1.0


# Each handout forward, and a change to a line of its body that the handout's equations hold
HANDOUT_FORWARDS = [
    ('vanilla', model.Block, 'self.mlp('),
    ('vanilla', attention.CausalSelfAttention, 'F.softmax('),
    ('rope', attention.CausalSelfAttention, 'F.softmax('),
    ('synthesizer', attention.SynthesizerAttention, 'F.softmax('),
    ('perceiver', perceiver.DownProjectBlock, 'self.mlp('),
    ('perceiver', perceiver.UpProjectBlock, 'self.mlp('),
    ('perceiver', attention.CausalCrossAttention, 'F.softmax('),
]


def changed_forward(module, code):
    """module.forward compiled from its own source with `code` scaled by 0.5."""
    source = textwrap.dedent(inspect.getsource(module.forward))
    assert code in source, f"{module.__name__}.forward does not compute {code}...) itself"
    namespace = {}
    exec(source.replace(code, '0.5 * ' + code), sys.modules[module.__module__].__dict__, namespace)
    return namespace['forward']


@pytest.mark.parametrize(
    'variant, module, code',
    HANDOUT_FORWARDS,
    ids=[f'{v}-{m.__name__}' for v, m, _ in HANDOUT_FORWARDS],
)
def test_a_change_to_a_handout_forward_changes_what_trains(monkeypatch, variant, module, code):
    """The handout's forwards are the code that trains: each computes its equation in its
    own body, and the trainer's loss (packed, in training mode, as a step computes it)
    runs through it, so the same step with one line of that body changed computes
    another loss."""
    text, _ = tiny_corpus()
    ds = dataset.CharCorruptionDataset(text, 128)

    def step_loss():
        random.seed(0)
        gpt = make_gpt(variant, vocab=ds.vocab_size, n_layer=3, n_head=4, n_embd=32)
        t = trainer.Trainer(gpt, ds, None, trainer.TrainerConfig(batch_size=8, device='cpu'))
        gpt.train()
        torch.manual_seed(0)  # the dropout masks
        return t.loss(*t.batch(ds, 0)).item()

    plain = step_loss()
    assert step_loss() == plain
    monkeypatch.setattr(module, 'forward', changed_forward(module, code))
    assert step_loss() != plain


def test_fp16_clips_the_unscaled_gradients(monkeypatch):
    """fp16 scales the loss up (2^16) for backward and unscales the gradients before
    clipping: the clip sees the true gradient norm, fp32's within fp16's error, never one
    2^16 times too large (the scaler's unscale_ left out)."""
    norms = {}
    clip = torch.nn.utils.clip_grad_norm_

    def recording_clip(parameters, max_norm, *args, **kwargs):
        parameters = list(parameters)
        grads = [p.grad.float().norm() for p in parameters if p.grad is not None]
        norms[precision] = torch.stack(grads).norm().item()
        return clip(parameters, max_norm, *args, **kwargs)

    monkeypatch.setattr(torch.nn.utils, 'clip_grad_norm_', recording_clip)
    for precision in ('fp32', 'fp16'):
        random.seed(0)
        gpt, ds, config = tiny_setup(precision=precision)
        t = trainer.Trainer(gpt, ds, None, config)
        x, y = t.batch(ds, 0)
        t.update(t.loss(x, y))
    assert 0.8 < norms['fp16'] / norms['fp32'] < 1.25, norms


def test_the_test_loss_is_computed_in_fp32(capsys):
    """The evaluation's loss on a test set is fp32 whatever the training precision, as
    --precision's help says."""
    printed = {}
    for precision in ('fp32', 'bf16'):
        random.seed(0)
        gpt, ds, config = tiny_setup(precision=precision)
        t = trainer.Trainer(gpt, ds, ds, config)
        random.seed(1)
        t.test_loss()
        printed[precision] = capsys.readouterr().out
    assert printed['bf16'] == printed['fp32'] and 'test loss: ' in printed['fp32']


def test_gpus_train_on_the_padded_batch_with_the_same_loss(monkeypatch):
    """GPUs train on the whole padded batch (one shape a phase, for MPS's and cuDNN's graph
    caches, and no packing kernels), the CPU on the packed positions: the same loss."""
    from machinery import devices

    assert devices.packs_batches('cpu') and not devices.packs_batches('cuda')
    assert not devices.packs_batches('mps')
    assert devices.fused_adamw('cuda') and devices.fused_adamw('mps')
    assert not devices.fused_adamw('cpu')  # the per-tensor loop the published runs used
    losses, shapes = {}, {}
    for packs in (True, False):
        monkeypatch.setattr(devices, 'packs_batches', lambda device, packs=packs: packs)
        random.seed(0)
        gpt, ds, config = tiny_setup(max_epochs=1)
        t = trainer.Trainer(gpt, ds, None, config)
        x, y = t.batch(ds, 0)
        gpt.eval()  # without dropout, whose masks follow the shapes
        losses[packs] = t.loss(x, y).item()
        gpt.train()
        seen, forward = set(), gpt.forward

        def recording(idx, targets=None, packing=None, seen=seen, forward=forward):
            seen.add(tuple(idx.shape) if packing is None else (packing.T,))
            return forward(idx, targets, packing)

        gpt.forward = recording
        for step in range(t.steps_per_epoch):
            t.update(t.loss(*t.batch(ds, step)))
        shapes[packs] = seen
    assert losses[True] == pytest.approx(losses[False], rel=1e-6)
    assert len(shapes[False]) <= 2 < len(shapes[True])  # full batches and the last one
