"""Params files: what a .params file must hold before a model loads it. load_params
reads a state_dict without running anything in the file (load_weights_only),
accepts the names that wrapped models save (DataParallel, torch.compile), tells the
variant from the file's card (run_cards.py) or else from the names, checks the
vocabulary, the shapes and that every value is finite against the model it loads into,
each problem a one-line UserError. run.py,
analyze.py and bench.py load params with it, resume.py checks its state's model with
check_state_dict; written_params is what every written params file holds.
"""

import torch

from machinery import finetune_methods, run_cards
from machinery.files import UserError, convert_command, load_weights_only

# For a params file refused for holding objects: keep its tensors only (of a pickled
# model, its state_dict's)
KEEP_TENSORS = (
    '{k: v for k, v in getattr(s, "state_dict", lambda: s)().items() if torch.is_tensor(v)}'
)


def load_params(path, gpt, corpus_path, model_name, flag='--reading_params_path'):
    """Loads the state_dict in `path` into gpt, a model (`model_name` in the messages) for
    the vocabulary of corpus_path, adding first the adapters the file holds, if any (params
    finetuned with --finetune_method adapter). The file is loaded without running anything
    in it (tensors and plain values only) and checked to hold a model of gpt's variant with
    exactly the names and shapes of gpt's state_dict. Any problem is one UserError line,
    naming `flag`.
    Returns the state_dict."""
    where = f"{flag} {path}"
    state = read_state_dict(path, where)
    size = finetune_methods.adapter_size(state)
    if size is not None:
        finetune_methods.add_adapters(gpt, size)
    shapes = {name: tensor.shape for name, tensor in gpt.state_dict().items()}
    found, variant = params_variant(state), params_variant(shapes)
    if found != variant:
        raise UserError(f"{where}: holds a {found} model, but the variant is {variant}")
    embedding = state['tok_emb.weight']  # (vocab_size, n_embd) when it has the right shape
    vocab_size = shapes['tok_emb.weight'][0]
    if embedding.dim() == 2 and embedding.size(0) != vocab_size:
        raise UserError(
            f"{where}: made for a vocabulary of {embedding.size(0)} "
            f"symbols, but {corpus_path} gives {vocab_size}"
        )
    basis = state.get('down_block.C')  # the perceiver's, (1, bottleneck_dim, n_embd)
    if basis is not None and basis.dim() == 3 and basis.size(1) != shapes['down_block.C'][1]:
        raise UserError(
            f"{where}: made with --bottleneck_dim {basis.size(1)}, "
            f"but the flag is {shapes['down_block.C'][1]}"
        )
    check_state_dict(state, shapes, where, model_name)
    gpt.load_state_dict(state)
    return state


def variant_and_bottleneck(path, variant=None, bottleneck_dim=None, flag='--reading_params_path'):
    """(variant, bottleneck_dim) of the model to load the params file `path` into: those
    given, and for those left out (None), the file's: as its card says (run_cards.py), or
    for a file without one, the variant told from its names and the perceiver's bottleneck
    from down_block.C's shape (run.py's default, 32, where it cannot be told). load_params
    then checks the file against that model: a variant or a bottleneck given that the file
    contradicts is its one-line error."""
    state = read_state_dict(path, f"{flag} {path}")
    card = run_cards.read(path)
    if card is not None:
        return variant or card['variant'], bottleneck_dim or card['bottleneck_dim'] or 32
    basis = state.get('down_block.C')  # (1, bottleneck_dim, n_embd)
    told = basis.size(1) if basis is not None and basis.dim() == 3 else 32
    return variant or params_variant(state), bottleneck_dim or told


def read_state_dict(path, where):
    """The GPT state_dict in `path`, under the plain model's names; not yet checked to fit."""
    if_trusted = (
        f"If you trust the file, keep only its tensors, in {path}.tensors, with: "
        + convert_command(KEEP_TENSORS, path, path + '.tensors')
    )
    state = load_weights_only(path, where, '.params file', if_trusted)
    if isinstance(state, dict) and 'optimizer' in state and 'model' in state:
        raise UserError(
            f"{where}: this is an interrupted run's resumable state; "
            f"continue that run with --resume"
        )
    check_tensor_dict(state, where)
    state = plain_param_names(state)
    if 'tok_emb.weight' not in state:
        raise UserError(f"{where}: not a GPT state_dict")
    return state


def plain_param_names(state):
    """A state_dict saved from a wrapped model under the plain model's names: DataParallel
    and DistributedDataParallel prefix every name with 'module.', torch.compile with
    '_orig_mod.' (also inside the name when a submodule was compiled)."""

    def plain(name):
        name = name.replace('_orig_mod.', '')
        while name.startswith('module.'):
            name = name[len('module.') :]
        return name

    return {plain(name): value for name, value in state.items()}


def params_variant(state):
    """Which variant a state_dict (or a model's {name: shape}) is, from the names only that
    variant has."""
    if 'down_block.C' in state:
        return 'perceiver'
    if 'blocks.0.attn.rope_cache' in state or (
        'pos_emb' not in state and 'blocks.0.attn.key.weight' in state
    ):
        return 'rope'
    return 'synthesizer' if 'blocks.0.attn.w1.weight' in state else 'vanilla'


def cpu_state_dict(model):
    """The model's state_dict with CPU tensors, so .params files load on any machine."""
    return {k: v.detach().cpu() for k, v in model.state_dict().items()}


def written_params(model):
    """What a .params file of the model holds: its CPU state_dict with LoRA merged into the
    weights, under the plain model's names."""
    return finetune_methods.merge_lora(cpu_state_dict(model), model)


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
