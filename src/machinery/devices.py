"""Where the code runs and in what arithmetic: the one place the device and the training
precision are chosen, the --device and --precision options that the scripts share, and
the one-line description of the machine their reports print.

The environment of the CPU's math libraries is set up by cpu_libraries.py, which the
entry points import before torch.
"""

import functools
import os
import platform
import re
import shutil
import sys

import torch

from machinery.files import UserError

DEVICES = ['auto', 'cuda', 'mps', 'cpu']
PRECISIONS = ['auto', 'fp32', 'bf16', 'fp16']


def add_arguments(argp):
    """The --precision and --device options, as every script takes them."""
    argp.add_argument(
        '--precision',
        choices=PRECISIONS,
        default='auto',
        help="training arithmetic; auto: bf16 autocast where the hardware has native "
        "bf16 (NVIDIA GPUs from compute capability 8.0, CPUs with avx512_bf16/amx), "
        "else fp32. fp16: autocast with a gradient scaler, for older GPUs (T4, V100). "
        "Evaluation is always fp32.",
    )
    argp.add_argument(
        '--device',
        choices=DEVICES,
        default='auto',
        help="where to run; auto: CUDA, else Apple's MPS, else the CPU",
    )


def pick_device(requested='auto'):
    """'cuda', 'mps' or 'cpu': the one place the device is chosen. auto: an NVIDIA GPU,
    else Apple's GPU, else the CPU. A device that is asked for but missing is a UserError.
    The model, trainer and decoder use only standard ops (linear, SDPA, layer norm, GELU,
    index_select/index_copy, topk), which torch implements on MPS;
    PYTORCH_ENABLE_MPS_FALLBACK=1 sends any that a torch version lacks to the CPU."""
    available = {
        'cuda': torch.cuda.is_available(),
        'mps': torch.backends.mps.is_available(),
        'cpu': True,
    }
    if requested in (None, 'auto'):
        device = next(device for device, ok in available.items() if ok)
        if device != 'cuda' and nvidia_gpu_present():
            note_once(
                f"note: an NVIDIA GPU is here, but this runs on the {device}: {why_no_cuda()}"
            )
    elif not available[requested]:
        why = why_no_cuda() if requested == 'cuda' else f"torch {torch.__version__}"
        raise UserError(f"--device {requested}: not available on this machine ({why})")
    else:
        device = requested
    if device == 'cuda':
        check_gpu_architecture()
    return device


def nvidia_gpu_present():
    """Whether the machine has an NVIDIA GPU and driver, whatever torch makes of it."""
    return os.path.exists('/proc/driver/nvidia/version') or shutil.which('nvidia-smi') is not None


def why_no_cuda():
    """Why torch cannot use the GPU, and what to install."""
    if torch.version.cuda is None:
        return (
            f"torch {torch.__version__} is built without CUDA; install a CUDA build "
            f"(https://pytorch.org/get-started/locally/)"
        )
    return (
        f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees no GPU it can use; the "
        f"NVIDIA driver may be older than CUDA {torch.version.cuda} needs (nvidia-smi shows "
        f"the CUDA version it supports): update the driver, or install a torch built for an "
        f"older CUDA (https://pytorch.org/get-started/previous-versions/)"
    )


def check_gpu_architecture():
    """A GPU older than every architecture this torch has kernels for (a P100, sm_60, under
    a build from sm_75 on) fails at its first kernel: a UserError instead, saying what to
    do. Kernels for sm_XY also run on sm_XZ, Z > Y; newer GPUs than the build's are left
    to torch (it may compile them from its PTX)."""
    built = sorted(
        int(re.match(r'sm_(\d+)', a).group(1))
        for a in torch.cuda.get_arch_list()
        if a.startswith('sm_')
    )  # sm_120 -> 120
    if not built:
        return
    major, minor = torch.cuda.get_device_capability()
    if any(b // 10 == major and b % 10 <= minor for b in built) or major * 10 + minor > built[-1]:
        return
    raise UserError(
        f"--device: this torch ({torch.__version__}) has no kernels for the "
        f"{torch.cuda.get_device_name()} (sm_{major}{minor}; it has sm_{built[0]} to "
        f"sm_{built[-1]}): install a torch built for this GPU "
        f"(https://pytorch.org/get-started/previous-versions/), or pass --device cpu"
    )


NOTES = set()


def first_cause(error):
    """The first line of the error that started `error` (what it was raised from or
    while handling), at most 200 characters: the compiler and CUDA graphs wrap theirs."""
    while (error.__cause__ or error.__context__) is not None:
        error = error.__cause__ or error.__context__
    lines = str(error).strip().split('\n')
    return lines[0][:200] or type(error).__name__


def note_once(line):
    """A note on stderr, once per process however often the device is asked for."""
    if line not in NOTES:
        NOTES.add(line)
        print(line, file=sys.stderr)


def to_device(tensor, device):
    """A CPU tensor copied to `device`. To a CUDA GPU the copy goes from pinned memory and
    does not wait for the GPU. Elsewhere it is an ordinary copy: a non-blocking copy from
    unpinned memory (to MPS, say) may read the source after it has been freed."""
    device = torch.device(device)
    if device.type == 'cuda':
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)


PRECISION_NAMES = {
    'fp32': "fp32",
    'bf16': "bf16 autocast (--precision fp32 for the original's fp32)",
    'fp16': "fp16 autocast with a gradient scaler (--precision fp32 for the original's fp32)",
}


def autocast_dtype(precision):
    """The dtype a precision autocasts to: None for fp32, which does not autocast."""
    return {'bf16': torch.bfloat16, 'fp16': torch.float16}.get(precision)


def autocast(device, precision, cache_enabled=True):
    """The forward pass's autocast context for a training precision (off for fp32)."""
    dtype = autocast_dtype(precision)
    return torch.autocast(
        device,
        dtype=dtype or torch.bfloat16,
        enabled=dtype is not None,
        cache_enabled=cache_enabled,
    )


def training_precision(choice, device):
    """The precision to train in: `choice`, or for auto, bf16 where `device` has it natively."""
    if choice != 'auto':
        return choice
    if device == 'cuda':
        # native bf16 from Ampere (8.0) on: torch.cuda.is_bf16_supported() also says True on
        # older GPUs (T4, V100), which emulate it slowly
        return 'bf16' if torch.cuda.get_device_capability() >= (8, 0) else 'fp32'
    if device == 'cpu':
        return 'bf16' if cpu_has_native_bf16() else 'fp32'
    return 'fp32'  # MPS: bf16 is native only on recent Apple chips


def rotate_in_fp32(model):
    """Has the apply_rotary_emb of model's attention code rotate in fp32 under autocast: in
    bf16 autocast q and k arrive in bf16, and a rotation written with complex numbers
    (torch.view_as_complex, as the 2024 starter invites) has no bf16. The function is
    wrapped from outside, in its module: q and k go in as fp32 and come back in their own
    dtype. A rotation written with real numbers in fp32 gives the same either way."""
    modules = {sys.modules.get(type(m).__module__) for m in model.modules()}
    for module in modules:
        apply = getattr(module, 'apply_rotary_emb', None)
        if callable(apply) and not hasattr(apply, 'rotates_in_fp32'):
            module.apply_rotary_emb = in_fp32(apply)


def in_fp32(apply):
    @functools.wraps(apply)
    def apply_in_fp32(x, rope_cache, *args, **kwargs):
        with torch.autocast(x.device.type, enabled=False):
            return apply(x.float(), rope_cache.float(), *args, **kwargs).to(x.dtype)

    apply_in_fp32.rotates_in_fp32 = True
    return apply_in_fp32


def packs_batches(device):
    """Whether training computes only the positions that can change the loss (packing.py):
    on the CPU, where it halves the work. On GPUs (CUDA, MPS) the model is small enough to
    be bound by kernel launches, and packing adds some 300 a step (the perceiver runs its
    stack per group of rows, thousands) and gives a new shape almost every step, which MPS
    and cuDNN build a graph and cache memory for: they train on the whole padded batch,
    one shape a phase. The loss is the same either way (tests/test_trainer.py)."""
    return device == 'cpu'


def builds_batches_ahead(device):
    """Whether training's batches are built ahead in a producer process (batch_producer.py):
    on CUDA, where a step takes less time than building its batch. On the CPU the step
    takes hundreds of times longer than the batch, and the cores are better left to it."""
    return device == 'cuda'


def fused_adamw(device):
    """AdamW's fused kernel where torch has one for the device (CUDA, and MPS in every
    torch of requirements.txt's range); on the CPU the per-tensor loop, whose rounding the
    published runs have."""
    return device in ('cuda', 'mps')


COMPILED_DEVICES = ('cuda',)
COMPILE_OPTIONS = {'dynamic': False}  # tests/test_devices.py adds its own backend


def check_compile(device):
    """--compile's device: CUDA, where a small model waits on kernel launches that fused
    kernels save. On the CPU compiled training measured slower than eager (README: Speed),
    and MPS's compiler is a prototype."""
    if device not in COMPILED_DEVICES:
        raise UserError(f"--compile: for CUDA GPUs only, and this runs on the {device}")


def training_paths(device, processes, eager=False, compile=False, cuda_graph=False):
    """(compile, cuda_graph): whether training compiles the model (torch.compile, only
    with --compile) and replays each step from a CUDA graph (cuda_graphs.py): on CUDA,
    for one process (DDP stays uncaptured), unless --eager. Elsewhere only the flags ask
    for them, and they were checked (check_compile, cuda_graphs.check)."""
    if device != 'cuda' or eager:
        return compile, cuda_graph
    return compile, cuda_graph or processes == 1


def compile_hint(compile, precision):
    """A line for --compile in bf16, whose training diverged where it was measured, else
    None."""
    if compile and precision == 'bf16':
        return (
            "note: --compile with bf16 diverged in our measured pretraining (an H200, torch "
            "2.11: the loss rose from step 30 and became nan by step 500; fp32 learned): "
            "check the loss, or leave out --compile (docs/gpus-and-macs.md)"
        )
    return None


def compile_model(model, device):
    """torch.compile in place (module.compile), so the parameters keep their names and the
    params files do not change; with fixed shapes, as a GPU trains on the whole padded
    batch (a graphed step pads an epoch's shorter last batch: one compilation a phase)."""
    check_compile(device)
    model.compile(**COMPILE_OPTIONS)


def is_compiled(model):
    """Whether model runs compiled (compile_model, and not fallen back since)."""
    return getattr(model, '_compiled_call_impl', None) is not None


def falls_back_uncompiled(step, model):
    """step, a training step of the compiled model, made to go on uncompiled where
    compiling fails (a GPU Triton cannot compile for, code torch.compile cannot take): one
    line says so, and the step runs again on the model as written. An error that is not
    the compiler's comes again from the model's own code."""

    def checked_step(*batch):
        if not is_compiled(model):
            return step(*batch)
        try:
            return step(*batch)
        except UserError:
            raise  # this codebase's own stop (cuda_graphs.py's), not the compiler's
        except Exception as e:  # noqa: BLE001 (whatever the compiler raises)
            model._compiled_call_impl = None  # what module.compile set: the model as written
            note_once(
                f"note: torch.compile failed on this model ({first_cause(e)}); training "
                f"goes on uncompiled, slower"
            )
            return step(*batch)

    return checked_step


def precision_hint(device, choice, precision):
    """A line for a precision that leaves the hardware's fast arithmetic unused, else None:
    a GPU left in fp32 by auto whose tensor cores take fp16 but not bf16 (V100, T4: compute
    capability 7.x), and bf16 asked for on a CPU that emulates it."""
    if device == 'cpu' and precision == 'bf16' and cpu_has_native_bf16() is False:
        return (
            "note: this CPU has no bf16 instructions (avx512_bf16 or AMX), so bf16 is "
            "emulated: on an AVX2 CPU about 25 times slower than fp32, which auto takes here"
        )
    if device != 'cuda' or precision != 'fp32' or choice != 'auto':
        return None
    if (7, 0) <= torch.cuda.get_device_capability() < (8, 0):
        return (
            f"note: the {torch.cuda.get_device_name()} has no native bf16, so auto trains in "
            f"fp32; --precision fp16 puts its tensor cores to work"
        )
    return None


def cpu_has_native_bf16(cpuinfo='/proc/cpuinfo'):
    """Whether the CPU has bf16 instructions, from the flags Linux lists for x86 CPUs; None
    where there is no such list (other systems, other CPUs), which auto takes as no."""
    try:
        with open(cpuinfo, encoding='utf-8') as f:
            flags = f.read()
    except OSError:
        return None
    if not re.search(r'^flags\s*:', flags, re.MULTILINE):
        return None
    return ' avx512_bf16' in flags or ' amx_bf16' in flags


def describe(device):
    """This machine in a line, for reports: the GPU, or the CPU model and count; torch."""
    if device == 'cuda':
        return f"{torch.cuda.get_device_name()}, torch {torch.__version__}"
    name = platform.processor() or platform.machine()
    try:
        with open('/proc/cpuinfo', encoding='utf-8') as f:
            name = next(
                line.split(':', 1)[1].strip() for line in f if line.startswith('model name')
            )
    except (OSError, StopIteration):
        pass
    mps = ', MPS' if device == 'mps' else ''
    return f"{name}, {os.cpu_count()} CPUs{mps}, torch {torch.__version__}"
