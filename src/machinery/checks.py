"""What run.py checks before any work, so that a run never dies at its end for something
that could have been seen at its start: the flags each phase needs, the corpus's reserved
characters, every line of the question files, and where the outputs go (the research
tools beside it check theirs with check_reports). Each problem is
a one-line UserError naming the flag, the file or the line. (The params a phase reads are
checked by params_files.py, the launch under torchrun by distributed.py.)
"""

import inspect
import os
import random
import re
import traceback
from pathlib import Path

import numpy as np
import torch

from machinery import files, finetune_methods
from machinery.files import UserError

# The flags each phase cannot do without.
NEEDS = {
    'pretrain': ['writing_params_path'],
    'finetune': ['writing_params_path', 'finetune_corpus_path'],
    'evaluate': ['reading_params_path', 'eval_corpus_path', 'outputs_path'],
}


def check_flags(args, block_size, padded_length):
    """The flags the phase needs, and flags that fit together; padded_length is the
    length of the edition's pretraining examples."""
    for name in NEEDS[args.function]:
        if not getattr(args, name):
            raise UserError(f"{args.function} needs --{name}")
    for flag in ('resume', 'save_every', 'compile'):
        if getattr(args, flag) and args.function == 'evaluate':
            raise UserError(f"--{flag} applies to pretrain and finetune only")
    for flag in ('compile', 'cuda_graph'):
        if getattr(args, 'eager', False) and getattr(args, flag, False):
            raise UserError(f"--eager: leave out --{flag}, which it turns off")
    bottleneck_dim = getattr(args, 'bottleneck_dim', None)  # a flag of the 2023 edition's
    if bottleneck_dim is not None and not 0 < bottleneck_dim <= block_size:
        raise UserError(
            f"--bottleneck_dim {args.bottleneck_dim}: must be between 1 and the "
            f"block size, {block_size}"
        )
    if args.function == 'pretrain' and args.variant == 'synthesizer' and padded_length > block_size:
        raise UserError(
            f"--edition {args.edition}: its {block_size}-long pretraining examples do not "
            f"fit the synthesizer's {block_size - 1} positions"
        )


def check_finetune_method(args, state):
    """--finetune_method and its flags fit the phase and the params it reads (`state`)."""
    method = args.finetune_method
    if method != 'full' and args.function != 'finetune':
        raise UserError(f"--finetune_method {method} applies to finetune only")
    for flag, owner in (('lora_rank', 'lora'), ('lora_alpha', 'lora'), ('adapter_size', 'adapter')):
        if getattr(args, flag) is not None and method != owner:
            raise UserError(f"--{flag} applies to --finetune_method {owner} only")
    if method != 'full' and state is None:
        raise UserError(
            f"--finetune_method {method} trains a few new weights on a frozen pretrained "
            f"model: it needs --reading_params_path"
        )
    if args.function == 'finetune' and state is not None and finetune_methods.adapter_size(state):
        raise UserError(
            f"--reading_params_path {args.reading_params_path}: holds adapters (a model "
            f"finetuned with --finetune_method adapter); finetune from the pretrained params"
        )


def check_corpus(path, reserved_chars):
    """The pretraining corpus's set of characters, which must not hold the vocabulary's
    reserved ones (dataset.py's PAD and MASK)."""
    corpus = files.read_text(path)
    for reserved in reserved_chars:
        if reserved in corpus:
            line = corpus[: corpus.index(reserved)].count('\n') + 1
            raise UserError(
                f"{path}, line {line}: contains {reserved!r}, "
                f"which the vocabulary reserves for PAD/MASK"
            )
    return set(corpus)


def check_outputs(args):
    """The output can be written, and --resume has a state to continue from."""
    output = 'outputs_path' if args.function == 'evaluate' else 'writing_params_path'
    check_writable(getattr(args, output), output)
    if args.resume and not os.path.exists(args.writing_params_path + '.resume'):
        raise UserError(
            f"--resume: no saved state at {args.writing_params_path}.resume "
            f"(it is written when a run is interrupted)"
        )


def check_tsv(path, vocab, block_size, training):
    """Training files: every line "question<TAB>place", fitting the block and the
    vocabulary. Evaluation files: all lines with a place (dev) or none (test)."""
    lines = files.read_lines(path)
    found = files.find_data_file(path)
    first_tabs = lines[0].count('\t')
    for number, line in enumerate(lines, 1):
        where = f"{found}, line {number}"
        tabs = line.count('\t')
        if training and tabs != 1:
            raise UserError(
                f"{where}: expected 'question<TAB>place' (exactly one tab), found {tabs} tabs"
            )
        if not training and (tabs > 1 or tabs != first_tabs):
            expected = 'question<TAB>place' if first_tabs else 'a question alone'
            raise UserError(f"{where}: expected {expected} like line 1, found {tabs} tabs")
        if not line.split('\t')[0].strip():
            raise UserError(f"{where}: empty question")
        if training:
            ascii_line = line.encode('ascii', errors='ignore').decode('ascii')  # NameDataset's
            missing = sorted(set(ascii_line) - vocab - {'\t'})
            if missing:
                raise UserError(
                    f"{where}: character {missing[0]!r} does not occur in the pretraining corpus"
                )
            if len(ascii_line) - 1 + 2 > block_size:
                raise UserError(
                    f"{where}: question and place are {len(ascii_line) - 1} characters; "
                    f"at most {block_size - 2} fit in the block"
                )


def check_reports(args, *flags):
    """The files a research tool writes at its end (--json, --plot, ...), checked before
    its work. A missing folder is made: README's recipes write into cloze/ and the like."""
    for flag in flags:
        path = getattr(args, flag)
        if path:
            directory = os.path.dirname(os.path.abspath(path))
            try:
                os.makedirs(directory, exist_ok=True)
            except OSError as e:
                raise UserError(f"--{flag} {path}: cannot make directory {directory}: {e.strerror}")
            check_writable(path, flag)


def check_writable(path, flag):
    directory = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise UserError(f"--{flag} {path}: is a directory")
    if not os.path.isdir(directory):
        raise UserError(f"--{flag} {path}: directory {directory} does not exist")
    if not os.access(directory, os.W_OK):
        raise UserError(f"--{flag} {path}: directory {directory} is not writable")


def check_examples(examples):
    """Builds every example of the training set once, as each epoch will, so that an
    example the dataset's code cannot build (a short or empty line of the corpus, say)
    stops the run now, not an epoch in: a one-line UserError naming the example, its
    line and where in the dataset's code it failed. The random states are put back
    afterwards, so the run draws what it would have drawn without the check."""
    states = random.getstate(), np.random.get_state(), torch.get_rng_state()
    try:
        for i in range(len(examples)):
            try:
                examples[i]
            except Exception as e:
                raise UserError(unbuildable(examples, i, e))
    finally:
        random.setstate(states[0])
        np.random.set_state(states[1])
        torch.set_rng_state(states[2])


def unbuildable(examples, i, error):
    """'CharCorruptionDataset[2937] (the line '') raised ValueError: ... (src/dataset.py:63)'."""
    source = inspect.getsourcefile(type(examples))
    where = [f for f in traceback.extract_tb(error.__traceback__) if f.filename == source]
    place = f" ({os.path.relpath(where[-1].filename)}:{where[-1].lineno})" if where else ''
    line = getattr(examples, 'data', None)
    line = f" (the line {line[i][:40]!r})" if isinstance(line, list) and i < len(line) else ''
    message = str(error).split('\n')[0]
    return (
        f"{type(examples).__name__}[{i}]{line} raised {type(error).__name__}: {message}{place}; "
        f"each epoch builds an example of every line"
    )


def example_failure(examples, i, error, path):
    """Why `examples` could not build example i, the line i + 1 of the file `path`, in a
    line numbered as the grader numbers it: "the example of line 2938 of wiki.txt ('')
    raised ValueError: empty range for randrange() (src/dataset.py:74)", or where a
    starter's stub raised, "the example of line 1 of wiki.txt ('...') needs part (e)
    CharCorruptionDataset.__getitem__ in src/dataset.py, not written yet"."""
    src = Path(inspect.getsourcefile(type(examples))).resolve().parent
    lines = getattr(examples, 'data', None)
    number = i % len(examples) + 1
    shown = f" ({lines[i][:40]!r})" if isinstance(lines, list) else ''
    what = f"the example of line {number} of {path}{shown}"
    stub = unwritten(error, src.parent)
    if stub:
        return f"{what} {stub}"
    frames = traceback.extract_tb(error.__traceback__)
    where = [f for f in frames if Path(f.filename).resolve().is_relative_to(src)]
    place = ''
    if where:
        place = f" ({Path(where[-1].filename).resolve().relative_to(src.parent).as_posix()}"
        place += f":{where[-1].lineno})"
    message = str(error).strip().split('\n')[0]
    return f"{what} raised {type(error).__name__}{': ' + message if message else ''}{place}"


# the starter's stubs' message: '[part c] [part f] write finetune (its docstring says what)'
STUB = re.compile(r'^((?:\[part [a-g]\] )+)(.*)$')


def unwritten(error, root):
    """'needs part (e) CharCorruptionDataset.__getitem__ in src/dataset.py, not written yet'
    where `error` is a starter's stub's NotImplementedError (its message '[part e] write
    ...'; for an if's stub, its words and the function it is in), the file named from
    `root`, the folder of src/; else None. (The grader's probes.unwritten says the same.)"""
    match = STUB.match(str(error)) if isinstance(error, NotImplementedError) else None
    if not match:
        return None
    tb = error.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    frame = tb.tb_frame if tb is not None else None
    labels, said = match.groups()
    part = re.findall(r'\[part ([a-g])\]', labels)[0]
    named = re.match(r'write ([\w.]+)', said)
    what = named.group(1) if named else re.split(r':| \(', said)[0].strip()
    where = ''
    if frame is not None:
        source = Path(frame.f_code.co_filename).resolve()
        where = source.relative_to(root).as_posix() if source.is_relative_to(root) else source.name
    if not named and frame is not None:
        owner = frame.f_locals.get('self')
        function = frame.f_code.co_name
        function = f"{type(owner).__name__}.{function}" if owner is not None else function
        where = f" in {function} ({where})"
    elif where:
        where = f" in {where}"
    return f"needs part ({part}) {what}{where}, not written yet"
