"""Where the code runs and in what arithmetic: the one place the device and the training
precision are chosen, the --device and --precision options that the scripts share, and
the one-line description of the machine their reports print.

The environment of the CPU's math libraries is set up by cpu_libraries.py, which the
entry points import before torch.
"""

import os
import platform

import torch

from files import UserError

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
        return next(device for device, ok in available.items() if ok)
    if not available[requested]:
        raise UserError(
            f"--device {requested}: not available on this machine (torch {torch.__version__})"
        )
    return requested


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


def cpu_has_native_bf16():
    try:
        with open('/proc/cpuinfo', encoding='utf-8') as f:
            flags = f.read()
    except OSError:
        return False
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
