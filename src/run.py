"""The assignment's command line: pretrain, finetune or evaluate a GPT, vanilla or the
edition's second variant.

    python src/run.py pretrain vanilla wiki.txt --writing_params_path vanilla.pretrain.params
    python src/run.py finetune vanilla wiki.txt --reading_params_path vanilla.pretrain.params \\
        --writing_params_path vanilla.finetune.params --finetune_corpus_path birth_places_train.tsv
    python src/run.py evaluate vanilla wiki.txt --reading_params_path vanilla.finetune.params \\
        --eval_corpus_path birth_dev.tsv --outputs_path vanilla.pretrain.dev.predictions

The pretraining corpus is always given: the vocabulary comes from it. Bare file names are
also looked for in data/. EDITIONS below holds what differs between the editions;
--edition picks one (default: the variant's own edition). Each phase is a plain function
of the parsed arguments, and everything that can be checked is checked before any
training starts.
"""

import machinery.cpu_libraries  # noqa: F401 (first: it sets up MKL and oneDNN before torch)

import argparse
import os
import shlex
import sys

import torch

import dataset
import model

# [2023]
import perceiver
import trainer
import utils
from machinery import (
    checks,
    cuda_graphs,
    decoding,
    devices,
    distributed,
    files,
    finetune_methods,
    metrics,
    params_files,
    resume,
    run_cards,
)

BLOCK_SIZE = 128
MODEL_SIZE = dict(n_layer=4, n_head=8, n_embd=256)
ANSWER_LENGTH = 32  # characters decoded after each question

# What differs between the editions. Pretraining's cosine schedule reaches its end after
# pretrain_schedule_epochs epochs' tokens (finetuning's always after 200); span-corruption
# strings are padded to pretrain_padded_length, so x and y are one shorter. An edition's
# settings apply to vanilla too (--edition, or a starter's DEFAULT_EDITION).
# second_variant: the one beside vanilla, with the flags its handout's commands pass;
# london_accuracy_file: the submission holds the London baseline's accuracy.
EDITIONS = {
    # [2021]
    '2021': dict(
        pretrain_schedule_epochs=200,
        pretrain_padded_length=BLOCK_SIZE,
        second_variant=('synthesizer', []),
        london_accuracy_file=False,
    ),
    # [2023]
    '2023': dict(
        pretrain_schedule_epochs=200,
        pretrain_padded_length=BLOCK_SIZE,
        second_variant=('perceiver', ['--bottleneck_dim', '64']),
        london_accuracy_file=False,
    ),
    # [2024]
    '2024': dict(
        pretrain_schedule_epochs=650,
        pretrain_padded_length=BLOCK_SIZE + 1,
        second_variant=('rope', []),
        london_accuracy_file=True,
    ),
    # [2024]
    '2025': dict(
        pretrain_schedule_epochs=650,
        pretrain_padded_length=BLOCK_SIZE + 1,
        second_variant=('rope', []),
        london_accuracy_file=True,
    ),
}
# The edition a command follows without --edition: None for the variant's own; a starter
# (grading/starter.py) names the edition it was written for.
DEFAULT_EDITION = None
VARIANT_EDITION = {}  # each variant's own edition: the first that has it
for _name, _settings in EDITIONS.items():
    for _variant in ('vanilla', _settings['second_variant'][0]):
        VARIANT_EDITION.setdefault(_variant, _name)


def parse_args(argv=None):
    argp = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    argp.add_argument(
        'function',
        choices=["pretrain", "finetune", "evaluate"],
        help="Whether to pretrain, finetune or evaluate a model",
    )
    argp.add_argument(
        'variant',
        choices=list(VARIANT_EDITION),
        help="Which variant of the model to run",
    )
    argp.add_argument(
        'pretrain_corpus_path',
        help="Path of the corpus to pretrain on (its characters are the vocabulary)",
    )
    argp.add_argument(
        '--reading_params_path',
        help="If specified, path of the model to load before finetuning/evaluation",
    )
    argp.add_argument(
        '--writing_params_path', help="Path to save the model after pretraining/finetuning"
    )
    argp.add_argument('--finetune_corpus_path', help="Path of the corpus to finetune on")
    argp.add_argument('--eval_corpus_path', help="Path of the corpus to evaluate on")
    argp.add_argument('--outputs_path', help="Path to write one prediction per line to")
    add_later_editions(argp)
    finetune_methods.add_arguments(
        argp.add_argument_group("parameter-efficient finetuning"), positive
    )
    add_overrides(argp.add_argument_group("overrides (defaults: the handout's settings)"))
    args = argp.parse_args(argv)
    args.edition = args.edition or DEFAULT_EDITION or VARIANT_EDITION[args.variant]
    args.finetune_lr_given = args.finetune_lr is not None
    if args.finetune_lr is None:
        args.finetune_lr = finetune_methods.LEARNING_RATES[args.finetune_method]
    return args


def add_later_editions(argp):
    """The flags the later editions added, and --edition to pick one."""
    # [2023]
    argp.add_argument(
        '--bottleneck_dim',
        type=int,
        default=32,
        help="the perceiver's bottleneck positions (2023 edition; default 32)",
    )
    argp.add_argument(
        '--pretrain_lr',
        type=positive(float),
        default=6e-3,
        help="pretraining learning rate (default 6e-3)",
    )
    argp.add_argument(
        '--finetune_lr',
        type=positive(float),
        help="finetuning learning rate (default 6e-4; with --finetune_method lora or "
        "adapter, 6e-3)",
    )
    argp.add_argument(
        '--tb_expt_name',
        default='run',
        help="name of the TensorBoard run, logged in expt/ beside the written params",
    )
    argp.add_argument(
        '--edition',
        choices=sorted(EDITIONS),
        help="the handout edition whose settings to use (default: "
        + (
            DEFAULT_EDITION
            or "the variant's: " + ", ".join(f"{v} {e}" for v, e in VARIANT_EDITION.items())
        )
        + ")",
    )


def add_overrides(quick):
    quick.add_argument('--max_epochs', type=positive(int), help="epochs to train")
    quick.add_argument('--batch_size', type=positive(int), help="examples per step")
    quick.add_argument(
        '--seed', type=int, default=0, help="seed of every random choice (default 0)"
    )
    devices.add_arguments(quick)
    quick.add_argument(
        '--resume',
        action='store_true',
        help="continue an interrupted pretrain/finetune from its saved state",
    )
    quick.add_argument(
        '--eager',
        action='store_true',
        help="on CUDA, train as the code is written, each kernel launched from Python, "
        "instead of replaying each step from a CUDA graph",
    )
    quick.add_argument(
        '--compile',
        action='store_true',
        help="train with torch.compile (CUDA only): fewer, fused kernels; its results are "
        "close to eager's, not identical (with bf16 it diverged where measured)",
    )
    quick.add_argument(
        '--cuda_graph',
        action='store_true',
        help="replay each training step from a CUDA graph (CUDA only, one process), as "
        "CUDA does by default: an error where it cannot",
    )
    quick.add_argument(
        '--save_every',
        type=positive(int),
        help="also write the params after every N epochs, named like --writing_params_path "
        "with .epochN before .params (vanilla.pretrain.epoch050.params)",
    )


def positive(kind):
    def parse(text):
        value = kind(text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be positive, not {text}")
        return value

    parse.__name__ = kind.__name__
    return parse


# --- The phases --------------------------------------------------------------------------


# [part f]
def pretrain(args):
    """Span-corruption pretraining of the variant's model on the corpus, with the handout's
    Trainer settings: 650 epochs, batch 128, learning rate args.pretrain_lr (6e-3), lr_decay,
    warmup_tokens 512*20 and final_tokens = E * len(pretrain_dataset) * BLOCK_SIZE, where E is
    the edition's pretrain_schedule_epochs (EDITIONS).
    Helpers: load_pretrain_dataset(args) and build_model(args, pretrain_dataset) give the
    data and the model, trainer.TrainerConfig(...) the settings, and
    train(args, gpt, pretrain_dataset, config) trains and writes --writing_params_path."""
    pretrain_dataset = load_pretrain_dataset(args)
    gpt = build_model(args, pretrain_dataset)
    schedule_epochs = EDITIONS[args.edition]['pretrain_schedule_epochs']
    config = trainer.TrainerConfig(
        max_epochs=650,
        batch_size=128,
        learning_rate=args.pretrain_lr,
        lr_decay=True,
        warmup_tokens=512 * 20,
        final_tokens=schedule_epochs * len(pretrain_dataset) * BLOCK_SIZE,
    )
    return train(args, gpt, pretrain_dataset, config)


# [part c] [part f]
def finetune(args):
    """Birth-place finetuning of the variant's model on NameDataset(--finetune_corpus_path):
    from scratch (part c), or (part f) from the params of --reading_params_path, which
    check_args has read and checked into args.reading_state. The handout's Trainer settings:
    75 epochs from scratch, 10 from pretrained params; batch 256, learning rate
    args.finetune_lr (6e-4), lr_decay, warmup_tokens 512*20 and
    final_tokens = 200 * len(pretrain_dataset) * BLOCK_SIZE.
    Helpers: load_pretrain_dataset(args) and build_model(args, pretrain_dataset) give the
    vocabulary's data and the model; files.read_text(path) the finetuning corpus's text;
    trainer.TrainerConfig(...) the settings; train(args, gpt, names, config) trains and
    writes --writing_params_path."""
    pretrain_dataset = load_pretrain_dataset(args)
    gpt = build_model(args, pretrain_dataset)
    max_epochs = 75
    if args.reading_params_path:
        gpt.load_state_dict(args.reading_state)
        max_epochs = 10
    names = dataset.NameDataset(pretrain_dataset, files.read_text(args.finetune_corpus_path))
    config = trainer.TrainerConfig(
        max_epochs=max_epochs,
        batch_size=256,
        learning_rate=args.finetune_lr,
        lr_decay=True,
        warmup_tokens=512 * 20,
        final_tokens=200 * len(pretrain_dataset) * BLOCK_SIZE,
    )
    return train(args, gpt, names, config)


def evaluate(args):
    """Greedy answers to each question of --eval_corpus_path, written to --outputs_path;
    prints the accuracy when the file has gold places. Returns (total, correct)."""
    pretrain_dataset = load_pretrain_dataset(args)
    gpt = build_model(args, pretrain_dataset)
    if load_into(gpt, args.reading_state):
        print(
            f"{args.reading_params_path}: evaluating with its adapters (--finetune_method adapter)"
        )
    gpt.to(devices.pick_device(args.device))

    questions = [line.split('\t')[0] for line in files.read_lines(args.eval_corpus_path)]
    predictions = decoding.answer_questions(
        gpt, questions, pretrain_dataset, ANSWER_LENGTH, args.eval_corpus_path, bar=True
    )
    files.atomic_write(
        args.outputs_path, lambda f: f.write(''.join(p + '\n' for p in predictions).encode('utf-8'))
    )

    total, correct = utils.evaluate_places(args.eval_corpus_path, predictions)
    if total > 0:
        print('Correct: {} out of {}: {}%'.format(correct, total, correct / total * 100))
    else:
        print('Predictions written to {}; no targets provided'.format(args.outputs_path))
    return total, correct


PHASES = {'pretrain': pretrain, 'finetune': finetune, 'evaluate': evaluate}


# --- Shared pieces -----------------------------------------------------------------------


def load_pretrain_dataset(args):
    return dataset.CharCorruptionDataset(
        files.read_text(args.pretrain_corpus_path),
        BLOCK_SIZE,
        EDITIONS[args.edition]['pretrain_padded_length'],
    )


def build_model(args, pretrain_dataset):
    utils.set_seed(args.seed)
    return new_model(
        args.variant,
        pretrain_dataset.vocab_size,
        # [2023]
        args.bottleneck_dim,
    )


# [part c] [part g]
def new_model(
    variant,
    vocab_size,
    # [2023]
    bottleneck_dim=32,
):
    """A freshly initialised model of the variant: a GPT of MODEL_SIZE with block size
    BLOCK_SIZE, vanilla (part c) or the edition's second variant (part g).
    Helpers: model.GPTConfig(vocab_size, BLOCK_SIZE, **MODEL_SIZE, ...) takes the variant's
    settings (GPTConfig lists them); model.GPT(config) is the model, and a variant with a
    module of its own has its model class there."""
    config = model.GPTConfig(
        vocab_size,
        BLOCK_SIZE,
        synthesizer=variant == 'synthesizer',
        rope=variant == 'rope',
        bottleneck_dim=bottleneck_dim if variant == 'perceiver' else None,
        **MODEL_SIZE,
    )
    return perceiver.PerceiverGPT(config) if variant == 'perceiver' else model.GPT(config)


def model_name(variant):
    """The variant's model at the assignment's size, as the params checks name it."""
    return f"a {variant} model with {MODEL_SIZE} and block size {BLOCK_SIZE}"


def load_into(gpt, state):
    """Loads a params state_dict (check_args's args.reading_state) into gpt, adding the
    adapters it holds first, if any (params finetuned with --finetune_method adapter).
    Returns whether it held adapters."""
    size = finetune_methods.adapter_size(state)
    if size is not None:
        finetune_methods.add_adapters(gpt, size)
    gpt.load_state_dict(state)
    return size is not None


def train(args, gpt, train_dataset, config):
    """Trains gpt on train_dataset with the phase's handout settings in config (a
    trainer.TrainerConfig), and this codebase's on top of them (add_settings), then writes
    its params (with LoRA merged into the weights). Returns the Trainer."""
    phase = phase_name(args)
    if args.function == 'finetune':
        finetune_methods.apply(gpt, args.finetune_method, **finetune_methods.settings(args))
    device = devices.pick_device(args.device)
    if distributed.PROCESSES > 1 and not torch.distributed.is_initialized():
        distributed.init_distributed(device)  # first: it picks this process's GPU
    add_settings(config, args, device)
    if not args.resume and os.path.exists(config.resume_path):
        print(
            f"note: starting afresh; {config.resume_path} (an interrupted run's state) will be "
            f"replaced. Add --resume to continue that run instead."
        )
    print(
        f"{phase}: {config.max_epochs} epochs, batch {config.batch_size}, "
        f"lr {config.learning_rate:g}, {args.edition} edition settings, "
        f"{finetune_methods.describe_parameters(gpt, config.finetune_method)}, "
        f"on {device}, {devices.PRECISION_NAMES[config.precision]}"
    )
    for hint in (
        devices.precision_hint(device, args.precision, config.precision),
        devices.compile_hint(config.compile, config.precision),
    ):
        if hint:
            print(hint)
    run = trainer.Trainer(gpt, train_dataset, None, config)
    run.train()
    write_params(run, args, phase)
    return run


def write_params(run, args, phase):
    """A trained run's params written to --writing_params_path (by process 0) with their
    card beside them (run_cards.py), its resumable state then removed, and the phase's
    last line."""
    path = args.writing_params_path
    if run.rank == 0:
        files.atomic_save(params_files.written_params(run.model), path)
        run_cards.write(run_cards.make(args, run, path), path)
        # only now: a run stopped before its params are written can still be resumed
        if os.path.exists(run.config.resume_path):
            os.remove(run.config.resume_path)
    seconds = run.elapsed - run.resumed_elapsed  # this process's share of a resumed run
    T = getattr(run.train_dataset, 'padded_length', BLOCK_SIZE) - 1
    print(
        f"{phase} done: {run.steps_run} steps in {format_seconds(seconds)} "
        f"({run.tokens_per_s(run.steps_run, T):,.0f} tokens/s), "
        f"final loss {run.final_loss:.4f}; params written to {path}"
    )


def phase_name(args):
    """'pretrain', 'finetune', or 'finetune from pretrained' (with --reading_params_path)."""
    if args.function == 'finetune' and args.reading_params_path:
        return 'finetune from pretrained'
    return args.function


def add_settings(config, args, device):
    """This codebase's settings, added to the handout's in config: --max_epochs,
    --batch_size and a --finetune_lr given override the handout's, and the rest are off in
    a plain TrainerConfig (device, precision, compiled and graphed steps, resumable state,
    metrics, TensorBoard, checkpoints)."""
    for name in ('max_epochs', 'batch_size'):
        if getattr(args, name) is not None:
            setattr(config, name, getattr(args, name))
    # a finetune that writes the handout's 6e-4 where it could read args.finetune_lr still
    # trains at the rate given (the learning check gives its own)
    if args.function == 'finetune' and getattr(args, 'finetune_lr_given', False):
        config.learning_rate = args.finetune_lr
    path = args.writing_params_path
    config.precision = devices.training_precision(args.precision, device)
    config.device = device
    config.compile, config.cuda_graph = devices.training_paths(
        device, distributed.PROCESSES, args.eager, args.compile, args.cuda_graph
    )
    if args.save_every:
        config.ckpt_path = checkpoint_path(path, config.max_epochs)
        config.save_every = args.save_every
    config.resume_path = path + '.resume'
    config.resume = args.resume
    config.metrics_path = path + '.metrics.csv'
    config.tensorboard_dir = metrics.tensorboard_dir(args)
    method = 'full' if args.function == 'pretrain' else args.finetune_method
    config.finetune_method = finetune_methods.describe(method, **finetune_methods.settings(args))


def checkpoint_path(params_path, max_epochs):
    """--save_every's file names: params_path with .epoch{epoch} before its .params (or at
    its end), the epoch zero-padded to max_epochs' width so that the files sort in order."""
    stem = params_path.removesuffix('.params')
    width = len(str(max_epochs))
    return f"{stem}.epoch{{epoch:0{width}d}}" + params_path[len(stem) :]


def format_seconds(seconds):
    minutes, seconds = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m{seconds:02d}s" if hours else f"{minutes}m{seconds:02d}s"


# --- Checks before any work --------------------------------------------------------------


def check_args(args):
    """Everything that can be checked before any work (checks.py); raises UserError. The
    params of --reading_params_path are read here, once, and kept for the phase in
    args.reading_state (None without the flag)."""
    checks.check_flags(args, BLOCK_SIZE, EDITIONS[args.edition]['pretrain_padded_length'])
    distributed.check_launch(args.function, devices.pick_device(args.device))
    if args.compile:
        devices.check_compile(devices.pick_device(args.device))
    if args.cuda_graph and args.function != 'evaluate':
        cuda_graphs.check(devices.pick_device(args.device), distributed.PROCESSES)
    vocab = checks.check_corpus(args.pretrain_corpus_path, (dataset.PAD_CHAR, dataset.MASK_CHAR))
    if args.function == 'finetune':
        checks.check_tsv(args.finetune_corpus_path, vocab, BLOCK_SIZE, training=True)
    if args.function == 'evaluate':
        checks.check_tsv(args.eval_corpus_path, vocab, BLOCK_SIZE, training=False)
    args.reading_state = None
    if args.reading_params_path:
        # loaded into a model built for the check alone, with the random state put back
        # after its initialisation: checking changes nothing that a seeded run draws
        with torch.random.fork_rng(devices=[]):
            gpt = new_model(
                args.variant,
                len(vocab) + 2,
                # [2023]
                args.bottleneck_dim,
            )
            args.reading_state = params_files.load_params(
                args.reading_params_path, gpt, args.pretrain_corpus_path, model_name(args.variant)
            )
    checks.check_finetune_method(args, args.reading_state)
    checks.check_outputs(args)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if int(os.environ.get('RANK', 0)) > 0:
        sys.stdout = open(os.devnull, 'w')  # under torchrun, process 0 speaks for all
    status = 0
    try:
        check_args(args)
        PHASES[args.function](args)
    except files.UserError as e:
        status = files.report(e)
    except resume.TrainingInterrupted as e:
        print(f"\n{e}. To continue: {continue_command(args, argv)}", file=sys.stderr)
        status = 130
    except metrics.NonFiniteLoss as e:
        print(f"error: {e}", file=sys.stderr)
        status = 3
    except KeyboardInterrupt:  # before training started, or a second Ctrl-C
        state = f"{args.writing_params_path}.resume" if args.function != 'evaluate' else None
        print(f"\n{resume.what_is_kept(state, continue_command(args, argv))}", file=sys.stderr)
        status = 130
    distributed.finish(status)  # under torchrun: exits here
    if status:
        sys.exit(status)


def continue_command(args, argv):
    """The command that continues this interrupted run from its resumable state."""
    processes = distributed.PROCESSES
    launcher = ['torchrun', f'--nproc_per_node={processes}'] if processes > 1 else ['python']
    return shlex.join(launcher + ['src/run.py'] + argv + ([] if args.resume else ['--resume']))


if __name__ == '__main__':
    main()
