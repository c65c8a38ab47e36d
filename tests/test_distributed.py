"""Several processes (torchrun, DistributedDataParallel): on the CPU with gloo, two
processes must compute what one process computes."""

import os
import random
import signal
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import dataset
import model
import trainer
from conftest import ROOT, stopped_at_call, tiny_corpus, wait_for
from machinery import distributed, finetune_methods, packing, resume


def setup(folder, method='full', **overrides):
    """The tiny corpus, without dropout; batches of 5 of its 36 lines, so that the epoch
    ends with a single row and one process gets none. method: a finetuning method that
    trains part of the model (finetune_methods.py)."""
    text, _ = tiny_corpus()
    ds = dataset.CharCorruptionDataset(text, 32)
    torch.manual_seed(0)
    gpt = model.GPT(
        model.GPTConfig(
            ds.vocab_size,
            32,
            n_layer=2,
            n_head=2,
            n_embd=32,
            embd_pdrop=0.0,
            resid_pdrop=0.0,
            attn_pdrop=0.0,
        )
    )
    finetune_methods.apply(gpt, method, lora_rank=2, lora_alpha=2.0, adapter_size=4)
    settings = dict(
        max_epochs=1,
        batch_size=5,
        learning_rate=3e-3,
        lr_decay=True,
        warmup_tokens=5 * 31 * 2,
        final_tokens=5 * 31 * 12,
        log_every=3,
        precision='fp32',
        device='cpu',
        metrics_path=str(folder / 'metrics.csv'),
        resume_path=str(folder / 'state.resume'),
    )
    settings.update(overrides)
    return gpt, ds, trainer.TrainerConfig(**settings)


def interrupted_run(rank, world_size, folder, method, producer=False):
    """A stop signal reaches process 0 alone during step 2; every process must stop after
    the same step, and the run is then resumed in fresh models. producer: each process
    takes its batches from producer processes of its own (batch_producer.py), as on CUDA,
    the same batches in every process."""
    dist.init_process_group(
        'gloo', init_method=f'file://{folder}/store', rank=rank, world_size=world_size
    )
    torch.set_num_threads(1)
    random.seed(0)
    gpt, ds, config = setup(folder, method, batch_producer=producer)
    t = trainer.Trainer(gpt, ds, None, config)
    seed = torch.initial_seed()
    gpt.forward = stopped_at_call(2 if rank == 0 else None, gpt.forward, t)  # process 0's Ctrl-C
    try:
        t.train()
        stopped = None
    except resume.TrainingInterrupted as e:
        stopped = str(e)
    random.seed(100 + rank)
    torch.manual_seed(100 + rank)
    gpt, ds, config = setup(folder, method, resume=True, batch_producer=producer)
    resumed = trainer.Trainer(gpt, ds, None, config)
    resumed.train()
    torch.save(
        {'params': gpt.state_dict(), 'seed': seed, 'stopped': stopped}, folder / f'rank{rank}.pt'
    )
    distributed.finish(0)  # as run.py ends


def csv_losses(path):
    return [float(row.split(',')[2]) for row in path.read_text().splitlines()[1:]]


# lora: most weights frozen; the producer: batches built ahead, as on CUDA
@pytest.mark.parametrize(
    'method, producer',
    [('full', False), pytest.param('lora', False, marks=pytest.mark.slow),
     pytest.param('full', True, marks=pytest.mark.slow)],
)  # fmt: skip
def test_two_processes_compute_what_one_computes(tmp_path, method, producer):
    single, ddp = tmp_path / 'single', tmp_path / 'ddp'
    single.mkdir(), ddp.mkdir()
    random.seed(0)
    gpt, ds, config = setup(single, method, batch_producer=producer)
    trainer.Trainer(gpt, ds, None, config).train()
    expected = gpt.state_dict()

    mp.start_processes(
        interrupted_run, args=(2, ddp, method, producer), nprocs=2, start_method='spawn'
    )
    results = [torch.load(ddp / f'rank{r}.pt', weights_only=False) for r in range(2)]
    assert (
        results[0]['stopped']
        == results[1]['stopped']
        == 'interrupted at epoch 1, step 3; state saved to ' + str(ddp / 'state.resume')
    )
    assert results[0]['seed'] != results[1]['seed']  # a dropout stream per process
    for k in expected:
        assert torch.equal(results[0]['params'][k], results[1]['params'][k]), k
        torch.testing.assert_close(results[0]['params'][k], expected[k], rtol=1e-4, atol=1e-5)
    # one writer of the metrics, with the whole batch's loss; the resumed run appended to them
    torch.testing.assert_close(
        csv_losses(ddp / 'metrics.csv'), csv_losses(single / 'metrics.csv'), rtol=1e-5, atol=1e-6
    )


def torchrun(*args, cwd, hold=(), **kwargs):
    """python src/run.py ARGS under torchrun on two processes; hold: (STEP, MARKER) to
    hold their training after that step until a stop signal (tests/hold_at_step.py)."""
    script = [str(ROOT / 'tests' / 'hold_at_step.py'), *map(str, hold)] if hold else []
    command = [sys.executable, '-m', 'torch.distributed.run', '--standalone',
               '--nproc_per_node', '2', *script, str(ROOT / 'src' / 'run.py'), *map(str, args)]  # fmt: skip
    return subprocess.Popen(
        command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs
    )


@pytest.mark.slow
def test_torchrun_command_line_ctrl_c_and_resume(tiny):
    """The README's command on two CPU processes: process 0 alone prints and writes; a
    terminal's Ctrl-C (which reaches torchrun and both processes) saves a state from
    which `--resume` ends with the params of an uninterrupted run."""
    args = ['pretrain', 'vanilla', 'wiki.txt', '--max_epochs', 4, '--batch_size', 8,
            '--device', 'cpu', '--precision', 'fp32']  # fmt: skip
    process = torchrun(*args, '--writing_params_path', 'straight.params', cwd=tiny)
    out, err = process.communicate(timeout=300)
    assert process.returncode == 0 and 'Traceback' not in err, err
    assert 'broadcast_buffers' not in err, err  # torch 2.13 warns about the old name
    assert out.count('pretrain done: 20 steps') == 1
    assert out.count('data has ') == 1
    assert (tiny / 'straight.params.metrics.csv').read_text().count('\n') == 1 + 20

    process = torchrun(
        *args, '--writing_params_path', 'resumed.params', cwd=tiny, hold=(7, 'held'),
        start_new_session=True,
    )  # fmt: skip
    wait_for(tiny / 'held.0', process)
    os.killpg(process.pid, signal.SIGINT)  # as a terminal's Ctrl-C: to the whole process group
    _, err = process.communicate(timeout=120)
    assert process.returncode != 0 and (tiny / 'resumed.params.resume').exists(), err
    # the processes agree to stop where they log: the end of epoch 2 (5 steps an epoch)
    assert 'interrupted at epoch 2, step 5; state saved to resumed.params.resume' in err
    assert 'To continue: torchrun --nproc_per_node=2 src/run.py pretrain' in err
    assert not (tiny / 'resumed.params').exists()

    process = torchrun(*args, '--writing_params_path', 'resumed.params', '--resume', cwd=tiny)
    out, err = process.communicate(timeout=300)
    assert process.returncode == 0 and 'resuming from resumed.params.resume' in out, err
    straight = torch.load(tiny / 'straight.params', weights_only=True)
    resumed = torch.load(tiny / 'resumed.params', weights_only=True)
    assert all(torch.equal(straight[k], resumed[k]) for k in straight)
    assert not (tiny / 'resumed.params.resume').exists()


def test_ddp_is_given_the_packing_not_tensors_to_copy_back(tmp_path):
    """DistributedDataParallel with device_ids copies every tensor argument to the GPU: a
    process's share of the batch must reach it as x (already on the device) and a Packing
    worked out on the CPU, which DDP's copying leaves as it is, so no size is read back
    from the GPU. Simulated: DDP's own copying, to the meta device."""
    gpt, ds, config = setup(tmp_path)
    t = trainer.Trainer(gpt, ds, None, config)
    given = []

    def ddp(*args, **kwargs):
        given.append((args, kwargs))
        return gpt(*args, **kwargs)

    t.ddp, t.rank, t.world_size = ddp, 1, 2
    x, y = t.batch(ds, 0)
    t.loss(x, y)
    ((args, kwargs),) = given
    assert [type(a) for a in args] == [torch.Tensor] and list(kwargs) == ['packing']
    packed = kwargs['packing']
    assert type(packed) is packing.Packing
    moved = torch.distributed.utils._recursive_to(kwargs, torch.device('meta'), False)[0]
    assert moved['packing'] is packed and all(
        isinstance(v, int) for v in (packed.T, *sum(packed.shapes, ()))
    )


@pytest.mark.parametrize('script', ['grid', 'reproduce'])
def test_scripts_of_many_runs_refuse_torchrun_at_their_start(script, tmp_path, monkeypatch, capsys):
    """Under torchrun each process would train every run: one line, exit 2, nothing run."""
    module = __import__(script)
    monkeypatch.setattr(distributed, 'PROCESSES', 2)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as stopped:
        module.main(['--outdir', str(tmp_path / 'out')] if script == 'grid' else [])
    err = capsys.readouterr().err
    assert stopped.value.code == 2
    assert f"{script}.py runs in one process; for several GPUs" in err and 'Traceback' not in err
    assert list(tmp_path.iterdir()) == []
