"""What the grader runs of a submission's code, each probe in its own process
(probe_runner.run_probe): the process works in a folder of its own holding a copy of the
submission's src/ and london_baseline.py and the data files, imports the submission's
modules from there, and leaves its result in a file. This module imports nothing of ours
besides torch and numpy, so that only the submission's code answers.

  command     a handout command, run.py as the student wrote it, with Trainer.train
              intercepted: the TrainerConfig and the model it was given, never training
  span        examples drawn from the submission's CharCorruptionDataset
  span_corpus an example of every line of wiki.txt from it, as each epoch of pretraining
  module      a module (SynthesizerAttention, DownProjectBlock, ...) built from the
              submission's class with given weights, and its outputs on given inputs
  function    one of the submission's functions (RoPE's) on given inputs
  machinery   the variant's model, built of the submission's parts: that it reads no later
              position, and what training and evaluation run on it (the Trainer's packed
              step on the CPU in fp32 and bf16, the fast decoder) against its plain forward;
              its failures say what they mean for the student's code
  london      london_baseline.py run as the handout says, and what it printed and wrote
"""

import importlib
import inspect
import math
import os
import random
import re
import runpy
import sys
import traceback

import numpy as np
import torch

# the TrainerConfig fields a phase's settings are checked by
CONFIG_FIELDS = (
    'max_epochs',
    'batch_size',
    'learning_rate',
    'betas',
    'grad_norm_clip',
    'weight_decay',
    'lr_decay',
    'warmup_tokens',
    'final_tokens',
    'ckpt_path',
    'num_workers',
)


class Failure(Exception):
    """What went wrong, in a line for the student."""


class Captured(BaseException):
    """Raised in place of training: a BaseException, so that no `except Exception` in the
    submission stops it."""


def run_probe(name, folder, inputs, log, result, box=None, seconds=None):
    """The process's whole work: the probe `name` on the arguments saved in `inputs`, in
    `folder`, its stdout and stderr in `log`; {'ok': what it found} or {'error': a line},
    with 'unwritten' (unwritten's) where a starter's stub raised, saved to `result`. `box`:
    the sandbox it enters first, for a probe of at most `seconds` (grading/sandbox.py)."""
    if box is not None:
        box.enter(folder, seconds)
    arguments = torch.load(inputs, weights_only=True)
    os.environ['CUDA_VISIBLE_DEVICES'] = ''  # on the CPU, as the checks' numbers are
    descriptor = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(descriptor, 1)
    os.dup2(descriptor, 2)
    os.chdir(folder)
    # the submission's modules first, and no other assignment's src/ (a test run's) at all
    others = [p for p in sys.path if not os.path.exists(os.path.join(p or '.', 'run.py'))]
    sys.path[:] = [os.path.join(folder, 'src'), folder] + others
    sys.argv = [name]
    torch.set_num_threads(1)  # probes run side by side
    stub = None
    try:
        outcome = {'ok': PROBES[name](**arguments)}
    except Failure as e:
        outcome = {'error': str(e)}
        stub = unwritten(e, folder)
    except BaseException as e:  # the submission's exception, exit or interrupt, in a line
        outcome = {'error': one_line(e, folder)}
        stub = unwritten(e, folder)
    if stub:
        outcome['unwritten'] = stub
    sys.stdout.flush()
    sys.stderr.flush()
    torch.save(outcome, result)


def one_line(error, folder):
    """'NotImplementedError: [part e] ... (src/dataset.py:63)': the exception and the last
    place in the submission's files it went through."""
    message = str(error).strip().split('\n')[0]
    text = type(error).__name__ + (f": {message}" if message else '')
    if isinstance(error, SystemExit):
        text = f"exited with status {error.code}"
    if isinstance(error, SyntaxError) and error.filename:  # where it is, not where it was read
        where = os.path.relpath(error.filename, folder)
        return f"{type(error).__name__}: {error.msg} ({where}:{error.lineno})"
    where = [
        f"{os.path.relpath(frame.filename, folder)}:{frame.lineno}"
        for frame in traceback.extract_tb(error.__traceback__)
        if os.path.abspath(frame.filename).startswith(os.path.abspath(folder) + os.sep)
    ]
    return text + (f" ({where[-1]})" if where else '')


# the starter's stubs' message: '[part c] [part f] write finetune (its docstring says what)'
STUB = re.compile(r'^((?:\[part [a-g]\] )+)(.*)$')


def unwritten(error, folder):
    """The starter's stub that `error` comes from, directly or as what it was raised while
    handling (a probe's Failure, say): {'parts': ['c', 'f'], 'what': 'finetune', 'in':
    None, 'file': 'src/run.py'}, where `what` is the function the stub stands for ('write
    X' in its message) or else its words ('the buffer rope_cache') and `in` the function
    it is in ('CausalSelfAttention.__init__'); None where no stub raised."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        match = STUB.match(str(error)) if isinstance(error, NotImplementedError) else None
        if match:
            return stub_place(error, match, folder)
        error = error.__cause__ or error.__context__
    return None


def stub_place(error, match, folder):
    """unwritten's answer for the stub's NotImplementedError and its message's match."""
    tb = error.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    frame = tb.tb_frame if tb is not None else None
    inside = frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(
        os.path.abspath(folder) + os.sep
    )
    where = os.path.relpath(frame.f_code.co_filename, folder) if inside else None
    labels, said = match.groups()
    found = {'parts': re.findall(r'\[part ([a-g])\]', labels), 'file': where, 'in': None}
    named = re.match(r'write ([\w.]+)', said)
    if named:
        found['what'] = named.group(1)
    else:  # an if's stub: its words up to their explanation, and the function it is in
        found['what'] = re.split(r':| \(', said)[0].strip()
        if frame is not None:
            owner = frame.f_locals.get('self')
            function = frame.f_code.co_name
            found['in'] = f"{type(owner).__name__}.{function}" if owner is not None else function
    return found


def plain(value):
    """A config value as numbers, strings and lists only (the result file holds nothing else)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (tuple, list)):
        return [plain(v) for v in value]
    if isinstance(value, np.generic) or (torch.is_tensor(value) and value.numel() == 1):
        return value.item()
    return repr(value)


def command(argv, reading_params=None):
    """`python src/run.py ARGV` up to the training: the Trainer's config and its model's
    state_dict shapes (and, given reading_params, how many of that file's tensors the
    model holds)."""
    import trainer

    found = {}

    def intercepted_train(self):
        found['config'] = {name: plain(getattr(self.config, name, None)) for name in CONFIG_FIELDS}
        state = self.model.state_dict()
        found['shapes'] = {name: list(tensor.shape) for name, tensor in state.items()}
        if reading_params:
            given = torch.load(reading_params, map_location='cpu', weights_only=True)
            found['loaded'] = sum(
                name in state and torch.equal(state[name].detach().cpu(), tensor)
                for name, tensor in given.items()
            )
            found['given'] = len(given)
        raise Captured

    trainer.Trainer.train = intercepted_train
    sys.argv = ['src/run.py'] + argv
    try:
        runpy.run_path(os.path.join('src', 'run.py'), run_name='__main__')
    except Captured:
        return found
    except SystemExit as e:
        if e.code in (None, 0):
            raise Failure("run.py ended without training")
        raise Failure(f"run.py stopped before training, with status {e.code}; it printed:")
    raise Failure("run.py ended without training")


def span_corruption(text, block_size, padded_length):
    """The submission's CharCorruptionDataset(text, block_size), given padded_length (the
    2024 rule) where the class takes it."""
    import dataset

    cls = dataset.CharCorruptionDataset
    extra = {}
    if padded_length and 'padded_length' in inspect.signature(cls).parameters:
        extra['padded_length'] = padded_length
    return cls(text, block_size, **extra)


def span(text, block_size, padded_length, draws, seed):
    """`draws` examples from CharCorruptionDataset(text, block_size), taking the documents in
    turn, after seeding random, numpy and torch: [(document index, x, y)] as strings."""
    corpus = span_corruption(text, block_size, padded_length)
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    examples = []
    for i in range(draws):
        index = i % len(corpus)
        x, y = corpus[index]
        examples.append((index, decode(x, corpus.itos), decode(y, corpus.itos)))
    return {'examples': examples, 'pad': corpus.PAD_CHAR, 'mask': corpus.MASK_CHAR}


def span_corpus(block_size, padded_length):
    """One example of every line of wiki.txt, as each epoch of pretraining builds: the
    number of lines, or a Failure naming the first line whose example raised."""
    with open('wiki.txt', encoding='utf-8') as f:
        corpus = span_corruption(f.read(), block_size, padded_length)
    random.seed(0)
    for i in range(len(corpus)):
        try:
            corpus[i]
        except Exception as e:
            line = corpus.data[i][:40] if i < len(getattr(corpus, 'data', [])) else '?'
            raise Failure(
                f"the example of line {i + 1} ({line!r}) raised {one_line(e, os.getcwd())}"
            )
    return {'lines': len(corpus)}


def decode(ids, itos):
    ids = ids.tolist() if torch.is_tensor(ids) else list(ids)
    return ''.join(itos[int(i)] for i in ids)


def module(modules, name, config, state, inputs, stand_ins=None):
    """The class `name` of the first of `modules` that has it, built from the submission's
    GPTConfig(**config), given `state` (exactly its names and shapes), in eval mode: its
    output for each tuple of `inputs`. stand_ins: {function of the class's module: the
    tensor it returns here}, so that another test's function cannot fail this one."""
    cls = find(modules, name)
    config_class = find(['model', 'models'], 'GPTConfig')  # the 2024 starter's is models.py
    for function, value in (stand_ins or {}).items():
        setattr(sys.modules[cls.__module__], function, lambda *args, value=value: value.clone())
    vocab_size, block_size = config.pop('vocab_size'), config.pop('block_size')
    built = cls(config_class(vocab_size, block_size, **config))
    check_names(built.state_dict(), state, name)
    built.load_state_dict(state)
    built.eval()
    with torch.no_grad():
        return [built(*args) for args in inputs]


def function(module_name, name, args):
    """The submission's module_name.name(*args)."""
    found = importlib.import_module(module_name)
    if not hasattr(found, name):
        raise Failure(f"src/{module_name}.py has no function {name}")
    return getattr(found, name)(*args)


def find(modules, name):
    for module_name in modules:
        try:
            found = importlib.import_module(module_name)
        except ModuleNotFoundError as e:
            if e.name != module_name:
                raise
            continue
        if hasattr(found, name):
            return getattr(found, name)
    raise Failure(f"no class {name} in {' or '.join(f'src/{m}.py' for m in modules)}")


def check_names(own, given, name):
    """The module's state_dict must hold exactly the given names, with their shapes."""
    missing = sorted(set(given) - set(own))
    unexpected = sorted(set(own) - set(given))
    if missing or unexpected:
        words = [f"lacks {', '.join(missing)}" if missing else '']
        words += [f"has {', '.join(unexpected)} besides" if unexpected else '']
        raise Failure(f"{name}'s state_dict {' and '.join(w for w in words if w)}")
    for key, tensor in given.items():
        if list(own[key].shape) != list(tensor.shape):
            raise Failure(
                f"{name}'s {key} has shape {list(own[key].shape)}, not {list(tensor.shape)}"
            )


def machinery(variant, vocab_size=40, block_size=128):
    """The variant's model at a small size (3 layers, 4 heads, n_embd 32; the perceiver a
    bottleneck of 16), built of the submission's classes with dropout off and sharp random
    weights (attention far from uniform), through what its training and evaluation run:
      - the Trainer's loss on a batch of rows of many lengths (packed on the CPU) and its
        gradients, in fp32 against the model's own forward on the padded batch; in bf16,
        a finite loss near fp32's;
      - decoding.greedy_complete against utils.sample, the plain decoder, on prompts of
        several lengths (a different character only where the plain decoder's two best
        are within rounding of each other).
    Raises Failure naming the stage and where in the submission it failed."""
    import torch.nn as nn

    import trainer
    import utils
    from machinery import decoding

    extra = {'synthesizer': dict(synthesizer=True), 'rope': dict(rope=True)}.get(variant, {})
    if variant == 'perceiver':
        extra = dict(perceiver=True, bottleneck_dim=16)
    config = find(['model', 'models'], 'GPTConfig')(
        vocab_size, block_size, n_layer=3, n_head=4, n_embd=32,
        embd_pdrop=0.0, resid_pdrop=0.0, attn_pdrop=0.0, **extra,
    )  # fmt: skip
    name = 'PerceiverGPT' if variant == 'perceiver' else 'GPT'
    modules = ['perceiver', 'model', 'models'] if variant == 'perceiver' else ['model', 'models']
    torch.manual_seed(0)
    gpt = stage('building the model', lambda: find(modules, name)(config))
    with torch.no_grad():  # sharp: a wrong mask or position would show
        for parameter in gpt.parameters():
            parameter.normal_(0.0, 0.5)
        for layer in gpt.modules():
            if isinstance(layer, nn.LayerNorm):
                layer.weight.add_(1.0)
    x, y = ragged_batch(vocab_size, block_size - 1)

    def gradients():
        grads = {n: p.grad.clone() for n, p in gpt.named_parameters() if p.grad is not None}
        gpt.zero_grad(set_to_none=True)
        return grads

    gpt.eval()
    reads_no_later_position(gpt, vocab_size, block_size - 1)
    gpt.train()
    plain = stage("the model's own forward, training", lambda: gpt(x, y)[1])
    plain.backward()
    plain_grads = gradients()
    for precision in ('fp32', 'bf16'):
        settings = dict(device='cpu', precision=precision, batch_size=len(x))
        run = trainer.Trainer(gpt, [None] * len(x), None, trainer.TrainerConfig(**settings))
        what = f"training ({precision}) on rows of several lengths, each cut after its last target"
        loss = stage(what, lambda run=run: run.loss(x, y))
        stage(what, loss.backward)
        grads = gradients()
        if not torch.isfinite(loss) or not all(torch.isfinite(g).all() for g in grads.values()):
            raise Failure(f"{what}: the loss or a gradient is not finite")
        if precision == 'fp32':
            differs = not math.isclose(loss.item(), plain.item(), rel_tol=1e-4, abs_tol=1e-5)
            if differs:
                raise Failure(
                    f"{what}: loss {loss.item():.6g}, where your model on the whole padded rows "
                    f"gives {plain.item():.6g}: {depends_on_later(variant)}"
                )
            for n, g in plain_grads.items():
                error = (grads[n] - g).abs().max().item()
                if error > 1e-3 * (1 + g.abs().max().item()):
                    raise Failure(
                        f"{what}: the gradient of {n} is off by {error:.3g} from the whole "
                        f"padded rows' gradient: {depends_on_later(variant)}"
                    )
        elif abs(loss.item() - plain.item()) > 0.05 * plain.item():
            raise Failure(
                f"{what}: loss {loss.item():.4g} in bf16 where fp32 gives {plain.item():.4g}: "
                f"check the code you wrote (part g) for a mask value bf16 cannot hold (use "
                f"float('-inf')), or a step that loses precision"
            )
    gpt.eval()
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(2, vocab_size, (n,), generator=g) for n in (5, 9, 5, 17, 40, 1)]
    steps = 16
    what = "answering one character at a time, as evaluate does"
    fast = stage(what, lambda: decoding.greedy_complete(gpt, prompts, steps, stop_id=1))
    for prompt, ours in zip(prompts, fast):
        whole = stage(
            'utils.sample (the whole sequence each step)',
            lambda p=prompt: utils.sample(gpt, p[None], steps),
        )
        plain_ids = whole[0, len(prompt) :].tolist()
        plain_ids = plain_ids[: plain_ids.index(1) + 1] if 1 in plain_ids else plain_ids
        if ours == plain_ids:
            continue
        k = next((i for i, (a, b) in enumerate(zip(ours, plain_ids)) if a != b), None)
        if k is None:
            raise Failure(
                f"{what}: {len(ours)} characters, where utils.sample, running the whole "
                f"sequence each step, gives {len(plain_ids)}: {positions(variant)}"
            )
        with torch.no_grad():
            logits = gpt(whole[:, : len(prompt) + k])[0][0, -1]
        best = torch.softmax(logits.double(), -1).topk(2).values
        if best[0] - best[1] > 1e-4:
            raise Failure(
                f"{what}: character {k + 1} after a prompt of {len(prompt)} differs from "
                f"utils.sample's, which runs the whole sequence each step: {positions(variant)}"
            )
    return {'loss': plain.item()}


# What a mismatch between the same model's two ways of running means for the student's
# code, in the variant's terms: what its part g cuts to the input's T positions
CUT_TO_T = {'synthesizer': "the mask, the synthesizer's w2 and b2", 'rope': 'the mask, rope_cache'}


def depends_on_later(variant):
    """What a loss or gradient of training unlike the model's own forward's means."""
    return (
        "your model's output at a position depends on the positions after it, or on how many "
        "positions the input has; check the causal mask (part g) and that what you cut to the "
        f"input's T positions ({CUT_TO_T.get(variant, 'the mask')}) is cut to T, not to "
        "block_size"
    )


def positions(variant):
    """What decoding one character at a time unlike utils.sample means."""
    rope = " and, with RoPE, that position t is rotated by t theta_i whatever the input's length"
    return (
        "the output at a position must depend only on the characters up to it and on the "
        f"position's number; check the causal mask{rope if variant == 'rope' else ''} (part g)"
    )


def reads_no_later_position(gpt, vocab_size, T):
    """Changing the character at one position must leave the outputs at every earlier
    position as they were (the model in eval mode); a Failure naming the first that moved."""
    g = torch.Generator().manual_seed(2)
    x = torch.randint(2, vocab_size, (1, T), generator=g)
    with torch.no_grad():
        before = stage("your model's forward", lambda: gpt(x)[0])
        for t in (T - 1, T // 2, 5):
            changed = x.clone()
            changed[0, t] = 2 + (x[0, t] - 1) % (vocab_size - 2)  # another character
            after = stage("your model's forward", lambda c=changed: gpt(c)[0])
            moved = (after[0, :t] - before[0, :t]).abs().amax(-1) > 1e-5  # (t,)
            if moved.any():
                s = int(moved.nonzero()[0])
                raise Failure(
                    f"your model's output at position {s} changes when the character at "
                    f"position {t} changes: it reads positions after the one it predicts; "
                    f"check the causal mask in the attention you wrote (part g: every score "
                    f"of a key after the query masked before the softmax, the mask cut to T)"
                )


def stage(what, work):
    """work(), its exception (the submission's) as a Failure saying in which stage."""
    try:
        return work()
    except Failure:
        raise
    except Exception as e:
        raise Failure(f"{what}: {one_line(e, os.getcwd())}")


def ragged_batch(vocab_size, T, B=12):
    """(B, T) rows of many lengths, padded with 0 as both datasets pad, some with no
    targets at their start as NameDataset's questions."""
    g = torch.Generator().manual_seed(0)
    x = torch.randint(2, vocab_size, (B, T), generator=g)
    y = torch.randint(2, vocab_size, (B, T), generator=g)
    for b, n in enumerate([T, 3, 40, 41, 17, 90, 64, 5, 33, 120, 8, 70][:B]):
        x[b, n:] = 0
        y[b, n - 1 :] = 0
        if b % 2:
            y[b, : n // 3] = 0
    return x, y


def london(accuracy_file):
    """`python london_baseline.py` in this folder: what it wrote to accuracy_file (None if
    nothing); part_d.py reads what it printed from the log."""
    script = (
        'london_baseline.py' if os.path.exists('london_baseline.py') else 'src/london_baseline.py'
    )
    sys.argv = [script]
    with open(script, encoding='utf-8', errors='replace') as f:
        if '--eval_corpus_path' in f.read():  # where the script takes the file as a flag
            sys.argv += ['--eval_corpus_path', 'birth_dev.tsv']
    try:
        runpy.run_path(script, run_name='__main__')
    except SystemExit as e:
        if e.code not in (None, 0):
            raise Failure(f"london_baseline.py stopped with status {e.code}; it printed:")
    written = None
    if os.path.exists(accuracy_file):
        with open(accuracy_file, encoding='utf-8', errors='replace') as f:
            written = f.read()
    return {'written': written}


PROBES = {
    'command': command,
    'span': span,
    'span_corpus': span_corpus,
    'module': module,
    'function': function,
    'machinery': machinery,
    'london': london,
}
