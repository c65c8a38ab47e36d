"""What pretraining showed the model, document by document and epoch by epoch: the exposure
ledger, replayed without the model.

    python research/exposure.py --params vanilla.pretrain.params --json vanilla.exposure.json
    python research/exposure.py --ledger vanilla.exposure.npz         # the 2021 CPU run, seed 0
    python research/exposure.py --batches seeded --json cuda.exposure.json  # a CUDA run, seed 0

Pretraining takes the documents in file order every epoch. On the CPU (and MPS) each
example's spans come from one stream of Python's random, which run.py seeds (--seed)
before the model is built and nothing else draws from before the first batch; on CUDA,
batch k is built after Python's, numpy's and torch's generators are seeded from the
run's batch seed and k (batch_producer.py; --batches seeded). A resumed run restores
either. So the run's own CharCorruptionDataset, called as the run's path called it,
gives exactly the examples the run trained on, and this is what the ledger does: each
example is read back into its window (the truncated length) and the masked span's start
and length, for every epoch and document (--ledger, a .npz of three (epochs, documents)
arrays, and what they were made from). example() rebuilds any training example from them.

--params takes the run's settings from the card run.py writes beside its params
(run_cards.py) and ties the reports to them: the tools that read a report with params
refuse one of another run.

For each person of the question files (--people; default the finetuning and dev files),
--json says (under `people`, beside `made_from`) where the gold place sits in their
document (its first whole-word occurrence) and, epoch by epoch, whether pretraining
showed it: in the text before the masked span or after it (each character a target),
overlapping the masked span (all or part of it to be recalled), or not at all (it ends
beyond the window). `by_epoch` has a
letter an epoch (b before, a after, m masked, - not shown); then the counts, the last
epoch it was in the window, and the fraction of epochs it was.

--subsets DIR writes parts of the finetuning file (its lines in file order) for finetuning
on known and unknown facts: seen.tsv without the people whose place pretraining never
showed, often.tsv with only those it showed in 25% or more of its epochs, and for each a
control of as many lines drawn at random from the whole file (seen.control.tsv,
often.control.tsv), so that a difference is not the smaller file's.
"""

import import_paths  # noqa: F401 (first: src/ and tools/ on sys.path)

import argparse
import json
import os
import random
import sys

import numpy as np
import torch

import analyze
import dataset
import run
from machinery import batch_producer, checks, files, run_cards


def replay(
    corpus_text,
    edition='2021',
    seed=0,
    epochs=650,
    batches='stream',
    batch_size=128,
    batch_seed=None,
):
    """(window, masked_start, masked_length), each an (epochs, documents) int16 array: the
    spans of every example a pretraining of the edition with this seed trained on, its
    batches built as `batches` says (run_cards.py): 'stream', the CPU's one stream of
    draws, or 'seeded', CUDA's, each batch of `batch_size` from its own seed (the run's
    batch_seed; by default the one a run of this seed takes: run_batch_seed)."""
    corpus = dataset.CharCorruptionDataset(
        corpus_text, run.BLOCK_SIZE, run.EDITIONS[edition]['pretrain_padded_length']
    )
    spans = np.zeros((3, epochs, len(corpus)), dtype=np.int16)
    if batches == 'stream':
        random.seed(seed)  # as run.py's build_model seeds it (utils.set_seed)
        for epoch in range(epochs):
            for index in range(len(corpus)):
                x, y = corpus[index]
                spans[:, epoch, index] = read_back(x, y, corpus)
        return spans[0], spans[1], spans[2]
    seeded = batch_producer.SeededBatches(corpus, run_batch_seed(seed, batch_seed))
    run_batches = batch_producer.RunBatches(len(corpus), batch_size, 0, 0, epochs)
    for k, indices in run_batches:
        epoch = k // run_batches.steps_per_epoch
        for index, x, y in zip(indices, *map(torch.from_numpy, seeded[k, indices])):
            spans[:, epoch, index] = read_back(x, y, corpus)
    return spans[0], spans[1], spans[2]


def run_batch_seed(seed, batch_seed=None):
    """The batch seed of a run with this --seed (batch_seed: the one its card records):
    the trainer draws it from the random state that run.py's seeding leaves, and nothing
    draws from that state before."""
    if batch_seed is not None:
        return batch_seed
    state = random.getstate()
    random.seed(seed)
    try:
        return batch_producer.batch_seed()
    finally:
        random.setstate(state)


def read_back(x, y, corpus):
    """(window, masked start, masked length) of the example x, y:
    prefix MASK suffix MASK masked PAD..."""
    text = dataset.decode(x, corpus.itos) + dataset.decode(y[-1:], corpus.itos)
    prefix, suffix, masked = text.rstrip(corpus.PAD_CHAR).split(corpus.MASK_CHAR)[:3]
    return len(prefix) + len(suffix) + len(masked), len(prefix), len(masked)


def example(document, window, start, length, padded_length):
    """The training example's string (before encoding; x is all of it but the last
    character, y all but the first) from the ledger's entry for its document."""
    truncated = document[:window]
    prefix, masked = truncated[:start], truncated[start : start + length]
    suffix = truncated[start + length :]
    text = prefix + dataset.MASK_CHAR + suffix + dataset.MASK_CHAR + masked
    return text + dataset.PAD_CHAR * (padded_length - len(text))


def people_exposure(corpus_text, rows, window, start, length, before=()):
    """For each (name, place) of rows: where the place sits in the person's document and
    what pretraining showed of it, epoch by epoch (see the module's docstring). before: the
    other people the corpus holds documents of, as analyze.documents takes them."""
    lines = corpus_text.split('\n')
    found = analyze.document_lines(lines, [*before, *rows])[len(before) :]
    report = []
    for (name, place), d in zip(rows, found):
        where = analyze.place_span(lines[d], place) if d is not None else None
        entry = dict(name=name, place=place, document=d)
        if where is None:
            report.append(dict(entry, place_start=None, place_end=None, **tally('-' * len(window))))
            continue
        d, (begin, end) = entry['document'], where
        mask_from, mask_to = start[:, d], start[:, d] + length[:, d]  # (epochs,)
        seen = window[:, d] >= end  # (epochs,)
        in_mask = (mask_from < end) & (mask_to > begin)
        letters = np.where(~seen, '-', np.where(in_mask, 'm', np.where(end <= mask_from, 'b', 'a')))
        report.append(dict(entry, place_start=begin, place_end=end, **tally(''.join(letters))))
    return report


def tally(by_epoch):
    """A person's letters (one an epoch: b, a, m or -) and what they add up to."""
    seen = [e for e, letter in enumerate(by_epoch, 1) if letter != '-']
    return dict(
        by_epoch=by_epoch, shown=by_epoch.count('b') + by_epoch.count('a'),
        masked=by_epoch.count('m'), not_shown=by_epoch.count('-'),
        last_epoch_seen=seen[-1] if seen else None, fraction_seen=len(seen) / len(by_epoch),
    )  # fmt: skip


def shown_late(report, epochs, final):
    """How many people of the report pretraining last showed their place in its final
    `final` epochs (of `epochs`)."""
    return sum(r['last_epoch_seen'] is not None and r['last_epoch_seen'] > epochs - final
               for r in report)  # fmt: skip


def where_shown(report):
    """{letter: share}: where the place was in the epochs that showed it, over the report's
    people (b before the masked span, a after it, m overlapping it)."""
    letters = ''.join(r['by_epoch'] for r in report)
    shown = sum(letters.count(c) for c in 'bam')
    return {c: letters.count(c) / shown if shown else 0.0 for c in 'bam'}


def finetuning_subsets(lines, report, seed=0):
    """{file name: lines}: the subsets of the finetuning file's lines (report: people_exposure
    of each line's person, in order) that --subsets writes; the controls are drawn with
    random.Random(seed)."""
    wanted = {'seen': lambda f: f > 0, 'often': lambda f: f >= 0.25}  # analyze.exposure_bin's
    rng = random.Random(seed)
    subsets = {}
    for name, keep in wanted.items():
        chosen = [line for line, r in zip(lines, report, strict=True) if keep(r['fraction_seen'])]
        subsets[f"{name}.tsv"] = chosen
        drawn = sorted(rng.sample(range(len(lines)), len(chosen)))
        subsets[f"{name}.control.tsv"] = [lines[i] for i in drawn]
    return subsets


def parse_args(argv):
    argp = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    argp.add_argument('--pretrain_corpus_path', default='wiki.txt')
    argp.add_argument(
        '--params',
        help="the pretraining's params (or params finetuned from them): the run's settings "
        "come from their card (PATH.json), and the reports are tied to them",
    )
    run_settings = argp.add_argument_group(
        "the run, for params without a card (default: the 2021 pretraining on the CPU, seed 0)"
    )
    run_settings.add_argument('--edition', choices=sorted(run.EDITIONS))
    run_settings.add_argument('--seed', type=int, help="the run's --seed (0)")
    run_settings.add_argument(
        '--max_epochs', type=run.positive(int), help="the run's epochs (650, the handout's)"
    )
    run_settings.add_argument(
        '--batches',
        choices=['stream', 'seeded'],
        help="how the run built its batches: stream, on the CPU and MPS (the original's one "
        "stream of span draws); seeded, on CUDA (each batch from its own seed) (stream)",
    )
    run_settings.add_argument(
        '--batch_size', type=run.positive(int), help="the run's --batch_size (128; seeded only)"
    )
    argp.add_argument('--ledger', help="write the spans of every example here (.npz)")
    argp.add_argument('--json', help="write each person's exposure here")
    argp.add_argument('--subsets', help="write parts of the finetuning file into this folder")
    argp.add_argument(
        '--finetune_corpus_path',
        default='birth_places_train.tsv',
        help="the whole finetuning file (--subsets' source; its people are matched to their "
        "documents first)",
    )
    argp.add_argument(
        '--people',
        nargs='+',
        default=['birth_places_train.tsv', 'birth_dev.tsv'],
        help="question files whose people to report, the finetuning file's first (default: "
        "finetuning and dev)",
    )
    return argp.parse_args(argv)


RUN_FLAGS = ('edition', 'seed', 'max_epochs', 'batches', 'batch_size')


def the_run(args, text):
    """What made the pretraining's examples (run_cards.EXAMPLES_MADE_BY, the corpus's name
    and the params'): from the card of --params, else from the flags."""
    if args.params is None:
        made_from = dict(
            edition=args.edition or '2021', seed=args.seed or 0, epochs=args.max_epochs or 650,
            batches=args.batches or 'stream', batch_size=args.batch_size or 128,
        )  # fmt: skip
        seeded = made_from['batches'] == 'seeded'
        made_from['batch_seed'] = run_batch_seed(made_from['seed']) if seeded else None
        return dict(made_from, corpus=os.path.basename(args.pretrain_corpus_path),
                    corpus_md5=run_cards.text_md5(text), params=None, params_md5=None)  # fmt: skip
    given = [f"--{flag}" for flag in RUN_FLAGS if getattr(args, flag) is not None]
    if given:
        raise files.UserError(
            f"{' '.join(given)}: --params {args.params} says the run's (its card)"
        )
    if not os.path.exists(args.params):
        raise files.UserError(f"--params {args.params}: no such file")
    card = run_cards.pretraining(args.params)
    if card is None:
        raise files.UserError(
            f"--params {args.params}: no card ({run_cards.card_path(args.params)}) says how it "
            "was pretrained; give the run's --seed, --max_epochs and --batches instead"
        )
    if card['corpus_md5'] != run_cards.text_md5(text):
        raise files.UserError(
            f"--pretrain_corpus_path {args.pretrain_corpus_path}: not the corpus {args.params} "
            f"was pretrained on ({card['corpus']}, md5 of its text {card['corpus_md5']})"
        )
    made_from = {key: card[key] for key in ('edition', *run_cards.EXAMPLES_MADE_BY)}
    return dict(made_from, corpus=card['corpus'], params=args.params, params_md5=card['params_md5'])


def main(argv=None):
    args = parse_args(argv)
    try:
        if not (args.ledger or args.json or args.subsets):
            raise files.UserError("nothing to write: give --ledger, --json or --subsets")
        checks.check_reports(args, 'ledger', 'json')
        text = files.read_text(args.pretrain_corpus_path)
        made_from = the_run(args, text)
        # the finetuning file's people first, as the other tools match them (document_lines)
        people = sorted(
            args.people, key=lambda p: not analyze.same_file(p, args.finetune_corpus_path)
        )
        rows = [
            (person, place)
            for path in people if args.json
            for _, person, place in analyze.read_questions(path)
        ]  # fmt: skip
        before = analyze.people_before(people, args.finetune_corpus_path) if args.json else []
        if args.subsets:
            finetuning = analyze.read_questions(args.finetune_corpus_path)
            lines = files.read_lines(args.finetune_corpus_path)
            try:
                os.makedirs(args.subsets, exist_ok=True)
            except OSError as e:
                raise files.UserError(f"--subsets {args.subsets}: cannot make it: {e.strerror}")
            checks.check_writable(os.path.join(args.subsets, 'seen.tsv'), 'subsets')
    except files.UserError as e:
        sys.exit(files.report(e))
    window, start, length = replay(
        text, made_from['edition'], made_from['seed'], made_from['epochs'],
        made_from['batches'], made_from['batch_size'], made_from['batch_seed'],
    )  # fmt: skip
    if args.ledger:
        files.atomic_write(args.ledger, lambda f: np.savez_compressed(
            f, window=window, masked_start=start, masked_length=length,
            made_from=json.dumps(made_from),
        ))  # fmt: skip
        empty = " (the last: the empty line after the corpus's last)" if text.endswith('\n') else ""
        print(f"{args.ledger}: {window.shape[0]} epochs x {window.shape[1]} examples{empty}")
    if args.json:
        report = people_exposure(text, rows, window, start, length, before)
        made = dict(made_from=made_from, people=report)
        files.atomic_write(args.json, lambda f: f.write(json.dumps(made, indent=1).encode()))
        never = sum(r['fraction_seen'] == 0 for r in report)
        final = min(50, made_from['epochs'])  # whether the last epoch seen can tell people apart
        print(
            f"{args.json}: {len(report)} people, {never} whose place pretraining never showed; "
            f"of the others, {shown_late(report, made_from['epochs'], final)} last shown in the "
            f"final {final} epochs"
        )
        shares = where_shown(report)
        print(
            f"in the epochs that showed a place: overlapping the masked span {shares['m']:.1%}, "
            f"in the text before it {shares['b']:.1%}, after it {shares['a']:.1%}"
        )
    if args.subsets:
        people = [(person, place) for _, person, place in finetuning]
        report = people_exposure(text, people, window, start, length)
        subsets = finetuning_subsets(lines, report)
        for name, chosen in subsets.items():
            path = os.path.join(args.subsets, name)
            data = ''.join(line + '\n' for line in chosen).encode('utf-8')
            files.atomic_write(path, lambda f, data=data: f.write(data))
            print(f"{path}: {len(chosen)} of the {len(lines)} lines of {args.finetune_corpus_path}")


if __name__ == '__main__':
    main()
