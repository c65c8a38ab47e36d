"""Helpers shared by the scripts: seeding, the device, reading input files, saving and
loading files safely, greedy decoding (the plain reference and the fast batched one) and
scoring."""

import os
import pickle
import random
import re
import secrets
import shlex
from pathlib import Path

import numpy as np
import torch
from torch.nn import functional as F

DATA_DIR = Path(__file__).resolve().parent.parent / 'data'


class UserError(Exception):
    """A problem with the command line or an input file: reported as one line, no traceback."""


def set_seed(seed):
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.cuda.manual_seed_all(seed)


# --- Device ------------------------------------------------------------------------------


def pick_device(requested='auto'):
    """'cuda', 'mps' or 'cpu': the one place the device is chosen. auto: an NVIDIA GPU,
    else Apple's GPU, else the CPU. A device that is asked for but missing is a UserError.
    The model, trainer and decoder use only standard ops (linear, SDPA, layer norm, GELU,
    index_select/index_copy, topk), which torch implements on MPS; this was not run on a
    Mac, and PYTORCH_ENABLE_MPS_FALLBACK=1 would send a missing one to the CPU."""
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


# --- Files -------------------------------------------------------------------------------


def find_data_file(path):
    """`path` itself if it exists, else data/`path` for a bare file name, so that the
    handout's commands (`... wiki.txt ...`) work from the repo root."""
    if not os.path.exists(path) and os.path.dirname(path) == '' and (DATA_DIR / path).exists():
        return str(DATA_DIR / path)
    return path


def read_text(path):
    """The whole file as text, checked: exists, readable, non-empty, valid UTF-8. Line ends
    are normalised as the original's text-mode open() did (universal newlines: CRLF and a
    lone CR become LF), so a file checked out with Windows line ends reads the same."""
    found = find_data_file(path)
    try:
        with open(found, 'rb') as f:
            raw = f.read()
    except FileNotFoundError:
        hint = f' (nor in {DATA_DIR}/; see data/README.md)' if os.path.dirname(path) == '' else ''
        raise UserError(f'{path}: no such file{hint}')
    except OSError as e:
        raise UserError(f'{path}: cannot read: {e.strerror}')
    if not raw.strip():
        raise UserError(f'{found}: file is empty')
    try:
        return universal_newlines(raw.decode('utf-8'))
    except UnicodeDecodeError as e:
        line = universal_newlines(raw[: e.start].decode('utf-8')).count('\n') + 1
        raise UserError(f'{found}, line {line}: not valid UTF-8 (byte {raw[e.start]:#x})')


def universal_newlines(text):
    return text.replace('\r\n', '\n').replace('\r', '\n')


def read_lines(path):
    """read_text(path) split into lines, without the empty string after the final newline."""
    lines = read_text(path).split('\n')
    if lines[-1] == '':
        lines.pop()
    return lines


def atomic_write(path, write):
    """Call write(file_object) on a temporary file beside `path`, then rename it over
    `path`: an interrupted save never leaves a truncated file behind. The file gets the
    mode any new file of the user's gets (0666 less the umask), where tempfile's own
    temporary files would be private (0600)."""
    path = Path(path)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, 'O_BINARY', 0)
    while True:
        tmp = path.parent / f'.{path.name}.{secrets.token_hex(4)}.tmp'
        try:
            fd = os.open(tmp, flags, 0o666)
            break
        except FileExistsError:
            continue
    try:
        with os.fdopen(fd, 'wb') as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def atomic_save(obj, path):
    atomic_write(path, lambda f: torch.save(obj, f))


def cpu_state_dict(model):
    """The model's state_dict with CPU tensors, so .params files load on any machine."""
    return {k: v.detach().cpu() for k, v in model.state_dict().items()}


def load_weights_only(path, where, kind, if_trusted):
    """torch.load(path) with weights_only=True: only tensors and plain Python values (dicts,
    lists, tuples, numbers, strings) are rebuilt, so nothing in the file can run code, which
    any pickled object or function could. A file that needs more is refused with one line
    naming what it holds, followed by `if_trusted` (how a user who trusts it converts it).
    Other problems are one line too; `where` starts each line, `kind` names the file type."""
    try:
        return torch.load(path, map_location='cpu', weights_only=True)
    except FileNotFoundError:
        raise UserError(f"{where}: no such file")
    except IsADirectoryError:
        raise UserError(f"{where}: is a directory")
    except OSError as e:
        raise UserError(f"{where}: cannot read: {e.strerror}")
    except EOFError:
        raise UserError(f"{where}: not a {kind} (the file is empty or cut short)")
    except Exception as e:
        # torch's own test for a refused class or function (a pickle GLOBAL), as in its message
        found = isinstance(e, pickle.UnpicklingError) and re.search(r'GLOBAL (\S+)', str(e))
        if found:
            raise UserError(
                f"{where}: refused: it holds code or objects ({found.group(1)}), which "
                f"are never loaded because loading them can run code; only tensors and "
                f"plain values are. {if_trusted}"
            )
        raise UserError(f"{where}: not a {kind}, or a damaged one (torch.load: {type(e).__name__})")


def convert_command(expression, source, target):
    """A shell command that loads `source` in full (objects included: only for trusted files)
    and saves `expression`, a Python expression of the loaded object s, to `target`."""
    code = (
        "import sys, torch; s = torch.load(sys.argv[1], weights_only=False); "
        f"torch.save({expression}, sys.argv[2])"
    )
    return f"python -c {shlex.quote(code)} {shlex.quote(str(source))} {shlex.quote(str(target))}"


def check_tensor_dict(state, where):
    """`state` must be a non-empty dict whose values are all tensors."""
    if not isinstance(state, dict):
        raise UserError(
            f"{where}: holds a {type(state).__name__}, not a state_dict (a dict of named tensors)"
        )
    if not state:
        raise UserError(f"{where}: the state_dict is empty")
    for name, value in state.items():
        if not torch.is_tensor(value):
            raise UserError(f"{where}: {name!r} is a {type(value).__name__}, not a tensor")


def check_state_dict(state, shapes, where, model_name):
    """`state` must have exactly the names and shapes in `shapes` ({name: torch.Size}, of the
    model it is for) and finite values. Non-finite weights are refused rather than warned
    about: every output they reach is nan, so evaluation would print garbage and training
    would stop at its first logged loss; and our trainer never saves them (it stops on a
    non-finite loss and saves nothing after it), so such a file is broken."""
    check_tensor_dict(state, where)
    for name, shape in shapes.items():
        if name not in state:
            raise UserError(f"{where}: does not fit {model_name} (no {name!r})")
        if state[name].shape != shape:
            raise UserError(
                f"{where}: does not fit {model_name} ({name!r} has shape "
                f"{tuple(state[name].shape)}, expected {tuple(shape)})"
            )
    for name, tensor in state.items():
        if name not in shapes:
            raise UserError(f"{where}: does not fit {model_name} (unexpected {name!r})")
        # any inf or nan makes the sum inf or nan (a sum far cheaper than isfinite on the CPU);
        # a sum of finite values that overflows is checked element by element
        if (
            tensor.is_floating_point()
            and not torch.isfinite(tensor.sum())
            and not torch.isfinite(tensor).all()
        ):
            bad = tensor.numel() - int(torch.isfinite(tensor).sum())
            raise UserError(
                f"{where}: {name!r} has {bad} non-finite value(s) (inf or nan), which "
                f"turn every output they reach into nan"
            )


# --- Decoding ----------------------------------------------------------------------------


def top_k_logits(logits, k):
    v, ix = torch.topk(logits, k)
    out = logits.clone()
    out[out < v[:, [-1]]] = -float('Inf')
    return out


@torch.no_grad()
def sample(model, x, steps, temperature=1.0, sample=False, top_k=None):
    """The original minGPT sampler: take a conditioning sequence of indices x (of shape
    (b, t)) and predict the next index `steps` times, feeding each prediction back in and
    re-running the whole (cropped) context every time. Plain and slow; the reference
    that greedy_complete must match."""
    block_size = model.get_block_size()
    model.eval()
    for _ in range(steps):
        x_cond = x if x.size(1) <= block_size else x[:, -block_size:]  # crop context if needed
        logits, _ = model(x_cond)
        logits = logits[:, -1, :] / temperature  # (b, vocab)
        if top_k is not None:
            logits = top_k_logits(logits, top_k)
        probs = F.softmax(logits, dim=-1)
        if sample:
            ix = torch.multinomial(probs, num_samples=1)
        else:
            _, ix = torch.topk(probs, k=1, dim=-1)
        x = torch.cat((x, ix), dim=1)
    return x


@torch.no_grad()
def greedy_complete(model, prompts, steps, stop_id, batch_size=512):
    """Greedy completions of many prompts at once, equal to sample(model, p, steps) for
    each prompt p but up to the first `stop_id` generated (what follows it is never read).

    Prompts of the same length share a batch, so positions line up without padding; each
    step feeds only the newest character and reuses the cached keys/values of the rest.
    Every prompt plus `steps` must fit in the model's block size. Returns one list of
    generated ids per prompt, ending with stop_id if it was produced."""
    model.eval()
    device = next(model.parameters()).device
    completions = [None] * len(prompts)
    by_length = {}
    for i, p in enumerate(prompts):
        assert len(p) + steps <= model.get_block_size(), 'prompt too long to complete'
        by_length.setdefault(len(p), []).append(i)
    for indices in by_length.values():
        for start in range(0, len(indices), batch_size):
            batch = indices[start : start + batch_size]
            x = torch.stack([torch.as_tensor(prompts[i]) for i in batch]).to(device)  # (b, t)
            generated = _greedy_batch(model, x, steps, stop_id)
            for i, ids in zip(batch, generated):
                completions[i] = ids
    return completions


def _greedy_batch(model, x, steps, stop_id):
    cache = model.new_cache()
    generated = torch.empty(x.size(0), 0, dtype=torch.long, device=x.device)  # (b, 0)
    done = torch.zeros(x.size(0), dtype=torch.bool, device=x.device)  # (b,)
    new = x
    for _ in range(steps):
        logits, _ = model(new, cache=cache)
        # softmax + topk exactly as sample() does, so near-ties break the same way
        _, new = torch.topk(F.softmax(logits[:, -1, :], dim=-1), k=1, dim=-1)  # (b, 1)
        generated = torch.cat((generated, new), dim=1)
        done |= new[:, 0] == stop_id
        if done.all():
            break
    result = []
    for row in generated.tolist():
        result.append(row[: row.index(stop_id) + 1] if stop_id in row else row)
    return result


# --- Scoring -----------------------------------------------------------------------------


def evaluate_places(filepath, predicted_places):
    """Computes percent of correctly predicted birth places.

    Arguments:
      filepath: path to a file with our name, birth place data.
      predicted_places: a list of strings representing the
          predicted birth place of each person.

    Returns: (total, correct), floats
    """
    lines = [x.strip().split('\t') for x in read_lines(filepath)]
    if len(lines[0]) == 1:
        print('No gold birth places provided; returning (0,0)')
        return (0, 0)
    true_places = [x[1] for x in lines]
    total = len(true_places)
    assert total == len(predicted_places)
    correct = len(list(filter(lambda x: x[0] == x[1], zip(true_places, predicted_places))))
    return (float(total), float(correct))
