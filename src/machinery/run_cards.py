"""What a params file was made with, kept beside it in PATH.json (its card): the variant,
the edition, the seed, the epochs, the corpus (the md5 of its text), and how training's
batches were built: 'stream', the CPU's one stream of span draws as the original builds
them, or 'seeded', each batch from a seed of its own (CUDA's, batch_producer.py), with
the run's batch seed. A finetuned model's card holds its pretraining's card, or the md5
of the params it started from where they have none.

run.py writes a card with every params file; the tools that read params read the card:
the variant without guessing it from the weights' names, and exposure.py the run whose
examples it rebuilds. A params file without a card (made by other code, or before
cards) is read as before.
"""

import hashlib
import json
import os

from machinery import files

# What makes a pretraining's examples: a report of them (exposure.py) is for the runs
# whose cards agree on these (the editions pad the examples differently, and draw the
# same spans: a report of one serves all)
EXAMPLES_MADE_BY = ('seed', 'epochs', 'batch_size', 'batches', 'batch_seed', 'corpus_md5')


def card_path(params_path):
    return params_path + '.json'


def text_md5(text):
    """The md5 of a corpus as read (files.read_text: UTF-8, line ends normalised), so that
    a copy with Windows line ends has the same."""
    return hashlib.md5(text.encode('utf-8')).hexdigest()


def corpus_md5(path):
    """text_md5 of the corpus at path, or None where it can no longer be read: the card is
    written after training, which never ends in an error for it."""
    try:
        return text_md5(files.read_text(path))
    except files.UserError:
        return None


def file_md5(path):
    """files.md5 of the file, or None where it cannot be read."""
    try:
        return files.md5(path)
    except OSError:
        return None


def common(args, params_path):
    """What every card of run.py's args holds: the model, the seed, the corpus, the params."""
    return dict(
        phase=args.function,
        variant=args.variant,
        bottleneck_dim=args.bottleneck_dim if args.variant == 'perceiver' else None,
        edition=args.edition,
        seed=args.seed,
        corpus=os.path.basename(args.pretrain_corpus_path),
        corpus_md5=corpus_md5(args.pretrain_corpus_path),
        params_md5=file_md5(params_path),
    )


def make(args, trainer, params_path):
    """The card of the params file a run.py phase (args) just wrote with this trainer."""
    config = trainer.config
    card = dict(
        common(args, params_path),
        epochs=config.max_epochs,
        batch_size=config.batch_size,
        batches='stream' if trainer.batch_seed is None else 'seeded',
        batch_seed=trainer.batch_seed,
    )
    if args.function == 'finetune':
        card['finetune_corpus_md5'] = corpus_md5(args.finetune_corpus_path)
        card['method'] = config.finetune_method
        started = args.reading_params_path
        card['pretrained'] = started and (pretraining(started) or {'params_md5': file_md5(started)})
    return card


def write(card, params_path):
    """The card written beside its params file."""
    text = json.dumps(card, indent=1).encode('utf-8')
    files.atomic_write(card_path(params_path), lambda f: f.write(text))


def read(params_path):
    """The card beside a params file, or None where it has none, or one that is not a card
    or is another file's (the params replaced since): a params file's card is never needed
    to load it."""
    try:
        with open(card_path(params_path), encoding='utf-8') as f:
            card = json.load(f)
        if not isinstance(card, dict) or 'variant' not in card:
            return None
        return card if card.get('params_md5') == file_md5(params_path) else None
    except (OSError, ValueError):
        return None


def pretraining(params_path):
    """The card of the pretraining a params file comes from: its own for a pretraining's
    params, the one its finetuning started from for finetuned params; None where unknown."""
    card = read(params_path)
    if card is None:
        return None
    if card['phase'] == 'pretrain':
        return card
    started = card.get('pretrained')
    return started if started and 'seed' in started else None


def check_same_examples(report, report_where, params_path, flag):
    """A report of a pretraining's examples (exposure.py's `made_from`) must be of the
    pretraining that the params come from, where their card says which: else a one-line
    UserError naming what differs."""
    card = pretraining(params_path)
    if card is None or report is None:
        return
    keys = EXAMPLES_MADE_BY
    if card.get('batches') == 'stream':  # one stream of draws: the batches' size moves none
        keys = [key for key in keys if key not in ('batch_size', 'batch_seed')]
    differ = [
        f"{key} {report.get(key)} (the params': {card.get(key)})"
        for key in keys
        if report.get(key) != card.get(key)
    ]
    if report.get('params_md5') and report['params_md5'] != card['params_md5']:
        differ.append("made from other params")
    if differ:
        raise files.UserError(
            f"{report_where}: not the report of the pretraining of {flag} {params_path}: "
            + ', '.join(differ)
        )
