"""shared_runs.py: K pretrainings stepping together in one process give each run what it
gives alone, on CUDA's path (the whole padded batch, the batches built ahead from each
run's own batch seed), here on the CPU: with dropout off and on (each run's masks its
own), after an interruption and a resume, and with one run's loss made non-finite."""

import os
import random

import pytest
import torch

import conftest
import dataset
import model
import trainer
import utils
from conftest import tiny_corpus
from machinery import batch_producer, metrics, resume, shared_runs
from machinery.files import UserError

SEEDS = (0, 1, 2)


def build(seed, pdrop=0.0, **overrides):
    """A run as run.py builds it for --seed: seeded, the model initialised, the Trainer
    made; on CUDA's path (whole padded batches, batches built ahead)."""
    text, _ = tiny_corpus()
    ds = dataset.CharCorruptionDataset(text, 32)
    utils.set_seed(seed)
    drops = dict(embd_pdrop=pdrop, resid_pdrop=pdrop, attn_pdrop=pdrop)
    gpt = model.GPT(model.GPTConfig(ds.vocab_size, 32, n_layer=2, n_head=2, n_embd=32, **drops))
    settings = dict(
        max_epochs=2, batch_size=8, learning_rate=3e-3, lr_decay=True,
        warmup_tokens=8 * 31 * 2, final_tokens=8 * 31 * 12, device='cpu',
        batch_producer=True, grad_norm_clip=0.5, log_every=2,
    )  # fmt: skip
    settings.update(overrides)
    t = trainer.Trainer(gpt, ds, None, trainer.TrainerConfig(**settings))
    t.packs = False  # CUDA's whole padded batch
    return t


def alone(seed, **settings):
    """The run trained alone: its params."""
    t = build(seed, **settings)
    t.train()
    return dict(t.model.named_parameters())


def together(seeds, resume_paths=None, stop_at=None, graphs=False, **settings):
    """The runs built one after another, as shared_runs.build_runs does, and trained
    together; returns the SharedRuns."""
    trainers, randoms = [], []
    for i, seed in enumerate(seeds):
        extra = {} if resume_paths is None else dict(resume_path=resume_paths[i])
        t = build(seed, **settings, **extra)
        if t.config.resume:
            resume.load(t.config.resume_path, t)
        trainers.append(t)
        randoms.append(shared_runs.RunRandom('cpu'))
    group = shared_runs.SharedRuns(trainers, randoms, workers=0, graphs=graphs)
    group.step = conftest.stopped_at_call(stop_at, group.step, group)
    group.train()
    return group


def max_diff(group, solos):
    """The largest difference of a shared run's params from its run alone's (on the CPU)."""
    return max(
        (p.cpu() - solo[n]).abs().max().item()
        for t, solo in zip(group.trainers, solos)
        for n, p in t.model.named_parameters()
    )


@pytest.mark.parametrize('pdrop', [0.0, 0.1])
def test_each_run_trains_as_it_does_alone(pdrop):
    """Three seeds, two epochs (the short last batch included), the cosine schedule and
    clipping that bites: each run's params are its run alone's within the rounding of
    batched matrix products; with dropout, each run's masks are its own (the runs alone
    differ by seed, and each shared run matches its own)."""
    solos = [alone(seed, pdrop=pdrop) for seed in SEEDS]
    group = together(SEEDS, pdrop=pdrop)
    diff = max_diff(group, solos)
    print(f"max abs diff against the runs alone (pdrop {pdrop}): {diff:.3g}")
    # vmap's LayerNorm (normalise, then scale and shift) and cross-entropy round apart
    # from the fused kernels by an ulp; over these 10 steps that is 3e-6 with dropout off
    # or on, as much as the CPU's packed and padded paths differ by alone (2.8e-6): masks
    # not the run's own would be 1e-2 apart
    assert diff < 1e-5
    # the runs moved apart and far from where they started
    first, second = (dict(t.model.named_parameters()) for t in group.trainers[:2])
    assert (first['head.weight'] - second['head.weight']).abs().max() > 1e-2
    assert all(t.steps_run == 2 * 5 and t.epoch == 2 for t in group.trainers)
    assert all(t.final_loss == t.final_loss for t in group.trainers)  # logged, finite


def test_graphed_step_trains_as_the_eager_step_bit_for_bit(tmp_path):
    """CUDA's graphed shared step, its capture replaced by plain calls on the static
    buffers (as test_cuda_graphs.py checks a run alone's): warm-up steps, a graph per
    batch shape, the masks copied in, the rate a tensor; bit for bit with the eager
    step, and after a stop resumed without graphs."""
    eager = together(SEEDS, pdrop=0.1)
    graphed = together(SEEDS, pdrop=0.1, graphs=True)
    for p, q in zip(eager.params.values(), graphed.params.values()):
        assert torch.equal(p, q)
    step = graphed.graphed
    assert sorted(step.captured) == [(3, 5, 31), (3, 8, 31)]  # 37 examples: 4 of 8, 5
    assert all(group['lr'] is step.lr for group in graphed.optimizer.param_groups)
    paths = [str(tmp_path / f's{seed}.resume') for seed in SEEDS]
    with pytest.raises(resume.TrainingInterrupted):
        together(SEEDS, paths, stop_at=7, pdrop=0.1, graphs=True)
    state = torch.load(paths[0], weights_only=True)
    assert isinstance(state['optimizer']['param_groups'][0]['lr'], float)
    resumed = together(SEEDS, paths, pdrop=0.1, resume=True)
    for p, q in zip(resumed.params.values(), graphed.params.values()):
        assert torch.equal(p, q)


def test_mixed_precision_is_refused():
    """Under vmap autocast puts ops in bf16 that a run alone keeps in fp32 (here the loss):
    runs share a process in fp32 only."""
    trainers = [build(0, precision='bf16')]
    with pytest.raises(
        UserError, match='--precision bf16: runs that share a process train in fp32'
    ):
        shared_runs.SharedRuns(trainers, [shared_runs.RunRandom('cpu')])


def test_weight_decay_groups_are_the_trainers():
    t = build(0)
    group = together([0], max_epochs=0)
    names = {id(p): n for n, p in group.params.items()}
    solo_names = {id(p): n for n, p in t.model.named_parameters()}
    for ours, theirs in zip(group.optimizer.param_groups, t.optimizer.param_groups):
        assert ours['weight_decay'] == theirs['weight_decay']
        assert [names[id(p)] for p in ours['params']] == [
            solo_names[id(p)] for p in theirs['params']
        ]


def test_masks_are_each_runs_own_and_reproducible():
    """Two runs of one seed draw the same masks, another seed others; drawing does not
    touch the process's own random state."""
    trainers, randoms = [], []
    for seed in (0, 0, 1):
        trainers.append(build(seed, pdrop=0.5))
        randoms.append(shared_runs.RunRandom('cpu'))
    group = shared_runs.SharedRuns(trainers, randoms, workers=0)
    x = torch.randint(1, 10, (3, 4, 31))
    before = torch.get_rng_state()
    sites = group.find_sites(x, x)
    assert len(sites) == 1 + 2 * 3  # the embeddings', then attention's two and the MLP's
    masks = group.draw_masks(sites)
    assert torch.equal(torch.get_rng_state(), before)
    for m, (shape, _, p) in zip(masks, sites):
        assert p == 0.5
        assert m.shape == (3, *shape) and m.dtype == torch.bool
        assert torch.equal(m[0], m[1]) and not torch.equal(m[0], m[2])
        assert 0.3 < m.float().mean() < 0.7
    again = group.draw_masks(sites)  # the states moved on: new masks
    assert not torch.equal(again[0][0], masks[0][0])


def test_interrupted_and_resumed_gives_the_straight_runs_params(tmp_path):
    """Stopped (as by Ctrl-C) mid-epoch: every run's state saved, each a state its run
    alone loads; the group resumed from them ends where the straight group does, bit for
    bit, with dropout on."""
    straight = together(SEEDS, pdrop=0.1)
    paths = [str(tmp_path / f's{seed}.resume') for seed in SEEDS]
    with pytest.raises(resume.TrainingInterrupted, match='every run'):
        together(SEEDS, paths, stop_at=8, pdrop=0.1)
    for path in paths:
        state = torch.load(path, weights_only=True)
        assert (state['epoch'], state['step']) == (1, 3)  # 5 steps an epoch
    # a run alone resumes from its state: the same params as the shared run's
    solo = build(SEEDS[1], pdrop=0.1, resume_path=paths[1], resume=True)
    solo.train()
    diff = max(
        (p - q).abs().max().item()
        for p, q in zip(solo.model.parameters(), straight.trainers[1].model.parameters())
    )
    assert diff < 1e-5
    resumed = together(SEEDS, paths, pdrop=0.1, resume=True)
    for t, s in zip(resumed.trainers, straight.trainers):
        for (n, p), q in zip(t.model.named_parameters(), s.model.parameters()):
            assert torch.equal(p, q), n


def test_a_non_finite_loss_stops_the_group_the_others_saved(tmp_path, monkeypatch):
    """Run 1's loss becomes nan at step 3: the group stops at the next log; runs 0 and 2
    saved their states there, run 1 keeps its last good one (none yet)."""
    paths = [str(tmp_path / f's{seed}.resume') for seed in SEEDS]
    losses = shared_runs.SharedRuns.losses
    calls = []

    def poisoned(self, x, y, masks):
        out = losses(self, x, y, masks)
        if shared_runs.MaskedDropout.sites is None:  # a training step's, not a site search's
            calls.append(1)
        if len(calls) == 3:
            out = out * torch.tensor([1.0, float('nan'), 1.0])
        return out

    monkeypatch.setattr(shared_runs.SharedRuns, 'losses', poisoned)
    with pytest.raises(metrics.NonFiniteLoss) as stopped:
        together(SEEDS, paths, pdrop=0.1)
    message = str(stopped.value)
    assert f'run 1 ({paths[1]}): the loss became nan at epoch 1, step 3' in message
    assert 'no earlier state had been saved yet' in message
    for path in (paths[0], paths[2]):
        state = torch.load(path, weights_only=True)
        assert (state['epoch'], state['step']) == (0, 4)
        assert all(torch.isfinite(v).all() for v in state['model'].values())
    assert not os.path.exists(paths[1])


def test_runs_at_different_points_are_refused(tmp_path):
    paths = [str(tmp_path / f's{seed}.resume') for seed in SEEDS[:2]]
    with pytest.raises(resume.TrainingInterrupted):
        together(SEEDS[:2], paths, stop_at=3)
    t = build(SEEDS[1], resume_path=paths[1], resume=True)
    resume.load(paths[1], t)
    t.step = 1
    resume.save(t)
    with pytest.raises(Exception, match='continue from one point'):
        together(SEEDS[:2], paths, resume=True)


def test_group_batches_are_each_runs_batches_alone():
    """Batch k of each run: what batch_producer builds for that run's seed, built here or
    by a worker process (CUDA's)."""
    text, _ = tiny_corpus()
    ds = dataset.CharCorruptionDataset(text, 32)
    before = random.getstate()
    got = list(shared_runs.group_batches(ds, 8, 1, 2, 2, [5, 6], workers=0))
    assert random.getstate() == before
    by_worker = list(shared_runs.group_batches(ds, 8, 1, 2, 2, [5, 6], workers=1))
    assert all(
        torch.equal(a, b) for ours, theirs in zip(got, by_worker) for a, b in zip(ours, theirs)
    )
    for seed, run in ((5, 0), (6, 1)):
        alone = list(batch_producer.SeededBatches(ds, seed)[key]
                     for key in batch_producer.RunBatches(len(ds), 8, 1, 2, 2))  # fmt: skip
        assert len(got) == len(alone) == len(by_worker) == 3  # epoch 2 from its step 2
        for (x, y), (xa, ya) in zip(got, alone):
            assert torch.equal(x[run], torch.from_numpy(xa))
            assert torch.equal(y[run], torch.from_numpy(ya))


@pytest.mark.slow
def test_the_command_writes_each_runs_params_and_finetuning_loads_them(tiny, monkeypatch):
    """python -m machinery.shared_runs pretrain ...: each seed's params file, as run.py
    writes it (run.py finetune --reading_params_path loads it), its metrics beside it, no
    resumable state left; a group whose runs stopped at different points is refused."""
    monkeypatch.chdir(tiny)
    common = ['pretrain', 'vanilla', 'wiki.txt', '--max_epochs', '1', '--batch_size', '16',
              '--device', 'cpu', '--precision', 'fp32']  # fmt: skip
    shared_runs.main([*common, '--seeds', '0', '1', '--writing_params_paths', 'a.params',
                      'b.params'])  # fmt: skip
    a, b = (torch.load(tiny / f'{n}.params', weights_only=True) for n in 'ab')
    assert a.keys() == b.keys() and not torch.equal(a['head.weight'], b['head.weight'])
    assert not list(tiny.glob('*.resume'))
    assert (tiny / 'b.params.metrics.csv').read_text().count('\n') == 1 + 3
    assert conftest.main('finetune', 'vanilla', 'wiki.txt', '--reading_params_path',
                         'b.params', '--writing_params_path', 'f.params',
                         '--finetune_corpus_path', 'train.tsv', '--max_epochs', '1',
                         cwd=tiny) == 0  # fmt: skip
    with pytest.raises(SystemExit) as stopped:
        shared_runs.main([*common, '--seeds', '0', '--writing_params_paths', 'x', 'y'])
    assert stopped.value.code == 2


CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason='no CUDA GPU here')


@CUDA
@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16])
def test_cuda_masks_are_nn_dropouts(dtype):
    """The mask drawn for a site is the one nn.Dropout draws on CUDA from the same state."""
    for shape in [(8, 31, 32), (8, 2, 31, 31), (5, 127, 256), (128, 8, 127, 127)]:
        x = torch.rand(shape, device='cuda').add_(0.5).to(dtype)  # no zeros
        torch.cuda.manual_seed(3)
        theirs = torch.nn.Dropout(0.1).train()(x) != 0
        torch.cuda.manual_seed(3)
        ours = shared_runs.draw_mask(shape, dtype, 0.1, 'cuda')
        assert torch.equal(ours, theirs), shape


def cuda_alone(seed, **settings):
    t = build(seed, device='cuda', batch_producer=None, **settings)
    t.packs = False  # as CUDA does anyway
    t.train()
    return {n: p.cpu() for n, p in t.model.named_parameters()}


@CUDA
@pytest.mark.parametrize('graphs', [False, True])
def test_on_cuda_each_run_trains_as_it_does_alone(graphs):
    """On CUDA, eager and replayed from graphs, dropout on: each run's params against its
    run alone's (eager) within rounding; dropout that is not the run's own would be far."""
    trainers, randoms = [], []
    for seed in SEEDS:
        t = build(seed, pdrop=0.1, device='cuda', batch_producer=None)
        trainers.append(t)
        randoms.append(shared_runs.RunRandom('cuda'))
    group = shared_runs.SharedRuns(trainers, randoms, graphs=graphs)
    group.train()
    solos = [cuda_alone(seed, pdrop=0.1) for seed in SEEDS]
    diff = max_diff(group, solos)
    print(f"CUDA, graphs {graphs}: max abs diff against the runs alone {diff:.3g}")
    assert diff < 1e-4
