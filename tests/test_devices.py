"""devices.py: the device chosen (CUDA, else MPS, else the CPU), a missing one as one
line, bf16 only where it is native, copies to the GPU non-blocking only from pinned
memory, and --compile (CUDA only) training as eager does."""

import random

import pytest
import torch

import dataset
import trainer
from conftest import main, tiny_corpus
from machinery import devices, dropout, files, finetune_methods
from test_model import VARIANTS, make_gpt


@pytest.mark.parametrize(
    'capability, expected',
    [((6, 0), 'fp32'), ((7, 0), 'fp32'), ((7, 5), 'fp32'), ((8, 0), 'bf16'), ((9, 0), 'bf16')],
)
def test_auto_precision_is_bf16_only_where_native(monkeypatch, capability, expected):
    """P100, V100 and T4 emulate bf16, and torch.cuda.is_bf16_supported() says True there."""
    monkeypatch.setattr(torch.cuda, 'is_bf16_supported', lambda *a, **k: True)
    monkeypatch.setattr(torch.cuda, 'get_device_capability', lambda *a, **k: capability)
    assert devices.training_precision('auto', 'cuda') == expected
    assert (
        devices.training_precision('fp16', 'cuda') == 'fp16'
        and devices.training_precision('fp32', 'cuda') == 'fp32'
    )
    assert devices.training_precision('auto', 'mps') == 'fp32'
    for native in (True, False):
        monkeypatch.setattr(devices, 'cpu_has_native_bf16', lambda native=native: native)
        assert devices.training_precision('auto', 'cpu') == ('bf16' if native else 'fp32')


def test_missing_device_is_one_clear_line(tiny, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)
    monkeypatch.setattr(torch.backends.mps, 'is_available', lambda: False)
    for device in ('cuda', 'mps'):
        code = main(
            'pretrain',
            'vanilla',
            'wiki.txt',
            '--writing_params_path',
            'x.params',
            '--device',
            device,
            cwd=tiny,
        )
        assert code == 2 and capsys.readouterr().err.startswith(
            f'error: --device {device}: not available'
        )


@pytest.mark.parametrize(
    'cuda, mps, expected', [(True, True, 'cuda'), (False, True, 'mps'), (False, False, 'cpu')]
)
def test_device_is_cuda_else_mps_else_cpu(monkeypatch, cuda, mps, expected):
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: cuda)
    monkeypatch.setattr(torch.cuda, 'get_arch_list', lambda: [])  # as a CPU build says
    monkeypatch.setattr(torch.backends.mps, 'is_available', lambda: mps)
    assert devices.pick_device('auto') == expected
    assert devices.pick_device('cpu') == 'cpu'
    for device, present in (('cuda', cuda), ('mps', mps)):
        if present:
            assert devices.pick_device(device) == device
        else:
            with pytest.raises(files.UserError, match=f'--device {device}: not available'):
                devices.pick_device(device)


def test_copies_to_the_gpu_are_non_blocking_only_from_pinned_memory(monkeypatch):
    """Simulated (no GPU needed): to CUDA, pinned then non-blocking; to MPS or the CPU, a
    plain copy, since a non-blocking one from unpinned memory may read freed memory."""
    copies = []
    monkeypatch.setattr(torch.Tensor, 'pin_memory', lambda t: copies.append('pin') or t)
    monkeypatch.setattr(
        torch.Tensor, 'to', lambda t, device, **kw: copies.append((str(device), kw)) or t
    )
    x = torch.arange(3)
    for device in ('cuda', 'mps', 'cpu'):
        devices.to_device(x, device)
    assert copies == ['pin', ('cuda', {'non_blocking': True}), ('mps', {}), ('cpu', {})]


@pytest.mark.parametrize(
    'cuda_version, why',
    [
        (None, 'is built without CUDA; install a CUDA build'),
        ('13.0', 'the NVIDIA driver may be older than CUDA 13.0 needs'),
    ],
)
def test_a_gpu_torch_cannot_use_is_one_line_saying_why(monkeypatch, capsys, cuda_version, why):
    """An NVIDIA GPU that torch cannot use (a CPU-only build, a driver older than the
    build's CUDA): auto runs on the CPU and says why in one line, once; --device cuda is
    an error saying the same."""
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)
    monkeypatch.setattr(torch.backends.mps, 'is_available', lambda: False)
    monkeypatch.setattr(torch.version, 'cuda', cuda_version)
    monkeypatch.setattr(devices, 'NOTES', set())
    monkeypatch.setattr(devices, 'nvidia_gpu_present', lambda: True)
    assert devices.pick_device('auto') == 'cpu' and devices.pick_device('auto') == 'cpu'
    err = capsys.readouterr().err
    assert err.startswith('note: an NVIDIA GPU is here, but this runs on the cpu: ')
    assert why in err and err.count('\n') == 1
    with pytest.raises(
        files.UserError, match=f"--device cuda: not available on this machine .*{why}"
    ):
        devices.pick_device('cuda')
    monkeypatch.setattr(devices, 'nvidia_gpu_present', lambda: False)
    monkeypatch.setattr(devices, 'NOTES', set())
    assert devices.pick_device('auto') == 'cpu' and capsys.readouterr().err == ''


BUILT = ['sm_75', 'sm_80', 'sm_86', 'sm_90', 'sm_100', 'sm_120']


@pytest.mark.parametrize(
    'capability, name, runs',
    [
        ((6, 0), 'Tesla P100-PCIE-16GB', False),
        ((7, 0), 'Tesla V100-SXM2-16GB', False),
        ((7, 5), 'Tesla T4', True),
        ((8, 9), 'NVIDIA L4', True),
        ((12, 1), 'a GPU newer than the build', True),
    ],
)
def test_a_gpu_without_kernels_in_this_torch_is_one_line(
    monkeypatch, tiny, capsys, capability, name, runs
):
    """A GPU older than every architecture the torch build has kernels for would fail at
    its first kernel with a traceback: one line before any work instead."""
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
    monkeypatch.setattr(torch.cuda, 'get_arch_list', lambda: BUILT)
    monkeypatch.setattr(torch.cuda, 'get_device_capability', lambda *a: capability)
    monkeypatch.setattr(torch.cuda, 'get_device_name', lambda *a: name)
    if runs:
        assert devices.pick_device('auto') == 'cuda'
        return
    argv = ['pretrain', 'vanilla', 'wiki.txt', '--writing_params_path', 'x.params']
    code = main(*argv, '--max_epochs', '1', '--device', 'cuda', cwd=tiny)
    err = capsys.readouterr().err
    assert code == 2 and err.count('\n') == 1
    assert err.startswith(
        f"error: --device: this torch ({torch.__version__}) has no kernels for the {name} (sm_{capability[0]}{capability[1]}; it has sm_75 to sm_120)"
    )


@pytest.mark.parametrize(
    'capability, precision, hinted',
    [
        ((7, 5), 'fp32', True),
        ((7, 0), 'fp32', True),
        ((7, 5), 'fp16', False),
        ((8, 0), 'fp32', False),
    ],
)
def test_a_t4_left_in_fp32_is_told_of_fp16(monkeypatch, capability, precision, hinted):
    monkeypatch.setattr(torch.cuda, 'get_device_capability', lambda *a: capability)
    monkeypatch.setattr(torch.cuda, 'get_device_name', lambda *a: 'Tesla T4')
    hint = devices.precision_hint('cuda', 'auto', precision)
    assert (hint is not None) == hinted
    if hinted:
        assert hint == (
            "note: the Tesla T4 has no native bf16, so auto trains in fp32; "
            "--precision fp16 puts its tensor cores to work"
        )
    assert devices.precision_hint('cuda', precision, precision) is None  # asked for
    assert devices.precision_hint('cpu', 'auto', 'fp32') is None


@pytest.mark.parametrize(
    'flags, native',
    [
        ('flags\t\t: fpu sse2 avx2 avx512f avx512_bf16 sha_ni', True),
        ('flags\t\t: fpu sse2 avx2 amx_bf16 amx_tile', True),
        ('flags\t\t: fpu sse2 avx2 avx512f avx512bw', False),
        ('Features\t: fp asimd bf16 i8mm', None),  # an ARM CPU: not known either way
    ],
)
def test_bf16_asked_of_a_cpu_that_emulates_it_gets_a_note(tmp_path, monkeypatch, flags, native):
    cpuinfo = tmp_path / 'cpuinfo'
    cpuinfo.write_text(f'processor\t: 0\nmodel name\t: Some CPU\n{flags}\n\n', encoding='utf-8')
    assert devices.cpu_has_native_bf16(cpuinfo) is native
    assert devices.cpu_has_native_bf16(tmp_path / 'none') is None
    monkeypatch.setattr(devices, 'cpu_has_native_bf16', lambda: native)
    assert devices.training_precision('auto', 'cpu') == ('bf16' if native else 'fp32')
    hint = devices.precision_hint('cpu', 'bf16', 'bf16')
    if native is False:
        assert hint == (
            "note: this CPU has no bf16 instructions (avx512_bf16 or AMX), so bf16 is "
            "emulated: on an AVX2 CPU about 25 times slower than fp32, which auto takes here"
        )
    else:
        assert hint is None
    assert devices.precision_hint('cpu', 'fp32', 'fp32') is None


def test_run_prints_the_bf16_note(tiny, monkeypatch, capsys):
    monkeypatch.setattr(devices, 'cpu_has_native_bf16', lambda: False)
    monkeypatch.setattr(trainer.Trainer, 'train', lambda self: None)  # the start is enough
    for precision, noted in (('bf16', True), ('auto', False)):
        args = ('--writing_params_path', f'{precision}.params', '--precision', precision)
        assert main('pretrain', 'vanilla', 'wiki.txt', *args, cwd=tiny) == 0
        out = capsys.readouterr().out
        assert ('so bf16 is emulated' in out) == noted and 'on cpu, ' in out


def test_compile_is_for_cuda_only(tiny, capsys):
    common = ('--writing_params_path', 'x.params', '--compile')
    assert main('pretrain', 'vanilla', 'wiki.txt', *common, '--device', 'cpu', cwd=tiny) == 2
    assert capsys.readouterr().err == (
        "error: --compile: for CUDA GPUs only, and this runs on the cpu\n"
    )
    code = main(
        'evaluate',
        'vanilla',
        'wiki.txt',
        '--reading_params_path',
        'x.params',
        '--eval_corpus_path',
        'dev.tsv',
        '--outputs_path',
        'out',
        '--compile',
        cwd=tiny,
    )
    assert code == 2
    assert capsys.readouterr().err == "error: --compile applies to pretrain and finetune only\n"


@pytest.mark.parametrize(
    'device, processes, flags, expected',
    [
        ('cuda', 1, {}, (False, True)),  # the handout's commands: graphs
        ('cuda', 2, {}, (False, False)),  # torchrun: DDP is not captured
        ('cuda', 1, {'eager': True}, (False, False)),
        ('cuda', 1, {'compile': True}, (True, True)),
        ('cuda', 2, {'compile': True}, (True, False)),
        ('cpu', 1, {}, (False, False)),
        ('mps', 1, {}, (False, False)),
        ('cpu', 1, {'cuda_graph': True}, (False, True)),  # refused before this
    ],
)
def test_training_paths_graph_one_process_on_cuda(device, processes, flags, expected):
    assert devices.training_paths(device, processes, **flags) == expected


def test_compile_in_bf16_gets_a_note():
    assert 'diverged' in devices.compile_hint(True, 'bf16')
    assert devices.compile_hint(True, 'fp32') is None
    assert devices.compile_hint(False, 'bf16') is None


def test_eager_turns_off_what_compile_and_cuda_graph_ask(tiny, capsys):
    for flag in ('--compile', '--cuda_graph'):
        args = ('--writing_params_path', 'x.params', '--eager', flag)
        assert main('pretrain', 'vanilla', 'wiki.txt', *args, cwd=tiny) == 2
        assert capsys.readouterr().err == f"error: --eager: leave out {flag}, which it turns off\n"


def test_run_trains_graphed_on_cuda_by_default(tiny, monkeypatch, capsys):
    """The handout's command as printed, on a simulated GPU: the settings run.py hands the
    Trainer (the Trainer itself stubbed: nothing runs on the CPU as if it were a GPU)."""
    made = []

    class Recorded:
        def __init__(self, model, train_dataset, test_dataset, config):
            made.append((config.compile, config.cuda_graph))
            raise SystemExit(0)

    monkeypatch.setattr(trainer, 'Trainer', Recorded)
    monkeypatch.setattr(devices, 'pick_device', lambda requested='auto': 'cuda')
    monkeypatch.setattr(devices, 'training_precision', lambda choice, device: 'bf16')
    for flags, expected in [((), (False, True)), (('--eager',), (False, False)),
                            (('--compile',), (True, True))]:  # fmt: skip
        args = ('--writing_params_path', 'x.params', *flags)
        assert main('pretrain', 'vanilla', 'wiki.txt', *args, cwd=tiny) == 0
        assert made.pop() == expected
        assert ('--compile with bf16 diverged' in capsys.readouterr().out) == ('--compile' in flags)


@pytest.mark.parametrize(
    'variant, method', [(variant, 'full') for variant in VARIANTS] + [('vanilla', 'lora')]
)
@pytest.mark.slow
def test_compiled_training_equals_eager(monkeypatch, variant, method):
    """--compile as a GPU runs it, simulated on the CPU: the whole padded batch (no
    packing), each model compiled as one graph (fullgraph: a graph break fails), with
    torch's aot_eager backend standing in for inductor's GPU kernels. One epoch, whose
    last batch is shorter (a second compiled shape). Dropout is off: the CPU's dropout
    draws from numpy, which no graph holds; a GPU uses torch's."""
    monkeypatch.setattr(devices, 'packs_batches', lambda device: False)
    text, _ = tiny_corpus()
    params = {}
    for compiled in (False, True):
        if compiled:
            torch._dynamo.reset()
            monkeypatch.setattr(devices, 'COMPILED_DEVICES', ('cpu',))
            options = dict(devices.COMPILE_OPTIONS, backend='aot_eager', fullgraph=True)
            monkeypatch.setattr(devices, 'COMPILE_OPTIONS', options)
        random.seed(0)
        ds = dataset.CharCorruptionDataset(text, 32)
        gpt = make_gpt(variant, ds.vocab_size, n_layer=3, n_head=2, n_embd=16)
        dropout.switched_off(gpt)
        finetune_methods.apply(gpt, method, **finetune_methods.DEFAULTS)
        config = trainer.TrainerConfig(
            max_epochs=1, batch_size=7, learning_rate=1e-3, device='cpu', compile=compiled
        )
        assert len(ds) % config.batch_size, "the epoch's last batch should be shorter"
        trainer.Trainer(gpt, ds, None, config).train()
        params[compiled] = gpt.state_dict()
    assert list(params[True]) == list(params[False])  # compiled in place: the same names
    for name, value in params[False].items():
        torch.testing.assert_close(params[True][name], value, msg=name)
