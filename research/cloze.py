"""Stored or extractable: what a pretrained model says of each dev person before any
finetuning, asked three ways (the cloze probe).

    python research/cloze.py vanilla.pretrain.params --exposure vanilla.exposure.json \\
        --finetuned vanilla.pretrain.dev.predictions --json vanilla.cloze.json

For each person of --eval_corpus_path, the greedy continuation of:
  document  their own wiki.txt document up to where the gold place begins (its first
            whole-word occurrence), as pretraining showed it; a long one keeps its last
            characters that fit
  name      "NAME was born in "
  question  "Where was NAME born?" and MASK, as evaluation asks a finetuned model
A continuation is right when it begins with the gold place followed by a character that
is not a letter or digit (or by nothing); the question's answer (up to its MASK) must be
the place. The document probe also scores the probability of the gold place after the
document (teacher-forced): how strongly it is stored.

Split by the share of pretraining's epochs that showed the place (exposure.py's --json,
with --exposure). With --finetuned, the finetuned model's dev predictions (what run.py
evaluate writes, or analyze.py's --params ... --json report): how often that model is right in
each band, and the AUROC with which the document probe's probability tells its right
answers from its wrong ones.

Every figure has its floor beside it: the same probes of an untrained model of the same
variant, initialised with the --seed of the params' pretraining (their card's; 0 without
one), and its probability's AUROC for the same finetuned answers.
"""

import import_paths  # noqa: F401 (first: src/ and tools/ on sys.path)

import machinery.cpu_libraries  # noqa: F401 (first: it sets up MKL and oneDNN before torch)

import argparse
import json
import math
import sys

import torch

import analyze
from machinery import checks, decoding, files

PROBES = ['document', 'name', 'question']


def right(continuation, place):
    """Whether the continuation begins with the place as a whole word."""
    if not continuation.startswith(place):
        return False
    return len(continuation) == len(place) or not continuation[len(place)].isalnum()


def answered(continuation, place, mask):
    """Whether the question's continuation is the place, up to its MASK: evaluation's
    rule, the answer exactly."""
    return continuation.split(mask)[0] == place


def encode(text, stoi, room):
    """text as ids, characters outside the vocabulary dropped, its last `room` kept."""
    return [stoi[c] for c in text if c in stoi][-room:]


@torch.no_grad()
def probe(gpt, pretrain_dataset, rows, corpus, before=()):
    """A record per (question, person, place) row: each probe's continuation and whether it
    is right, and the document probe's probability of the place (None where the document
    lacks the place, or where the place begins it). before: as analyze.documents takes it."""
    stoi, itos = pretrain_dataset.stoi, pretrain_dataset.itos
    mask = pretrain_dataset.MASK_CHAR
    steps = max(len(place) for _, _, place in rows) + 1  # the place and the character after it
    room = gpt.get_block_size() - 1 - steps  # the synthesizer has block_size - 1 positions
    docs = analyze.documents(corpus, [(person, place) for _, person, place in rows], before)
    spans = [analyze.place_span(doc, place) for doc, (_, _, place) in zip(docs, rows)]
    prompts = {
        # a place at the document's start leaves nothing to continue
        'document': [encode(doc[: span[0]], stoi, room) if span and span[0] else None
                     for doc, span in zip(docs, spans)],
        'name': [encode(f"{person} was born in ", stoi, room) for _, person, _ in rows],
        'question': [encode(question, stoi, room) + [stoi[mask]] for question, _, _ in rows],
    }  # fmt: skip
    records = [{'person': person, 'place': place} for _, person, place in rows]
    for name in PROBES:
        asked = [i for i, p in enumerate(prompts[name]) if p is not None]
        ids = decoding.greedy_complete(gpt, [prompts[name][i] for i in asked], steps, stoi[mask])
        for i, completion in zip(asked, ids):
            text = ''.join(itos[c] for c in completion)
            place = records[i]['place']
            ok = answered(text, place, mask) if name == 'question' else right(text, place)
            records[i][name] = {'continuation': text, 'right': ok}
    asked = [i for i, p in enumerate(prompts['document']) if p is not None]
    pairs = [(prompts['document'][i], encode(records[i]['place'], stoi, steps)) for i in asked]
    for record in records:
        record['document probability'] = None
    for i, log_prob in zip(asked, analyze.log_probs(gpt, pairs)):
        records[i]['document probability'] = math.exp(log_prob)
    return records


def bands(records):
    """{exposure band: people, the share right in each probe (of those asked), the median
    document probability, and with the finetuned answers their accuracy and the AUROC of
    the document probability for them}."""
    split = {}
    for band in analyze.EXPOSURE_BINS:
        group = [r for r in records if analyze.exposure_bin(r['fraction seen']) == band]
        if not group:
            continue
        row = {'people': len(group)}
        for name in PROBES:
            asked = [r[name]['right'] for r in group if name in r]
            row[name] = sum(asked) / len(asked) if asked else None
        scored = [r for r in group if r['document probability'] is not None]
        probabilities = [r['document probability'] for r in scored]
        row['median document probability'] = analyze.median(probabilities) if scored else None
        if 'finetuned right' in group[0]:
            row['finetuned'] = sum(r['finetuned right'] for r in group) / len(group)
            labels = [r['finetuned right'] for r in scored]
            row['auroc'] = analyze.auroc(probabilities, labels)
        split[band] = row
    return split


def print_bands(split):
    finetuned = any('finetuned' in row for row in split.values())
    header = f"  {'':<20} {'people':>6} {'document':>9} {'name':>6} {'question':>9} {'P(place)':>9}"
    print("right, by the share of pretraining's epochs that showed the gold place:")
    print(header + (f" {'finetuned':>9} {'AUROC':>6}" if finetuned else ''))
    share = lambda v: f"{v:.1%}" if v is not None else '-'
    for band, row in split.items():
        line = f"  {band:<20} {row['people']:>6} " + ' '.join(
            f"{share(row[n]):>{w}}" for n, w in zip(PROBES, (9, 6, 9))
        )
        median = row['median document probability']
        line += f" {median:9.3f}" if median is not None else f" {'-':>9}"
        if finetuned:
            auroc = row['auroc']
            line += f" {share(row['finetuned']):>9} " + (
                f"{'-':>6}" if auroc is None else f"{auroc:6.2f}"
            )
        print(line)


def parse_args(argv):
    argp = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    argp.add_argument('params', help="pretrained params (before finetuning)")
    argp.add_argument('--eval_corpus_path', default='birth_dev.tsv')
    argp.add_argument('--pretrain_corpus_path', default='wiki.txt')
    argp.add_argument(
        '--finetune_corpus_path',
        default='birth_places_train.tsv',
        help="the whole finetuning file, whose people's documents come first in wiki.txt",
    )
    argp.add_argument('--exposure', help="exposure.py's --json of the pretraining")
    argp.add_argument(
        '--finetuned',
        help="the finetuned model's dev predictions, or analyze.py's --params ... --json report",
    )
    argp.add_argument('--json', help="write every person's record and the bands here")
    analyze.add_model_arguments(argp)
    return argp.parse_args(argv)


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        checks.check_reports(args, 'json')
        rows = analyze.read_questions(args.eval_corpus_path)
        before = analyze.people_before([args.eval_corpus_path], args.finetune_corpus_path)
        corpus = files.read_text(args.pretrain_corpus_path)
        seen = analyze.read_exposure(args.exposure, args.params) if args.exposure else {}
        finetuned = None
        if args.finetuned:
            answers = analyze.read_predictions(args.finetuned, rows, args.eval_corpus_path)
            finetuned = [answer == place for answer, (_, _, place) in zip(answers, rows)]
        gpt, pretrain_dataset = analyze.load_model(args, corpus)
    except files.UserError as e:
        sys.exit(files.report(e))
    records = probe(gpt, pretrain_dataset, rows, corpus, before)
    untrained, seed = analyze.untrained_model(args, pretrain_dataset)
    floor = probe(untrained, pretrain_dataset, rows, corpus, before)
    for i, (record, unlearned) in enumerate(zip(records, floor)):
        for r in (record, unlearned):
            r['fraction seen'] = seen.get((r['person'], r['place']))
            if finetuned:
                r['finetuned right'] = finetuned[i]
    split, floor_split = bands(records), bands(floor)
    print(f"{args.params}: {len(records)} people of {args.eval_corpus_path}")
    print_bands(split)
    print(f"the floor: an untrained model of the same variant (initialised with --seed {seed}):")
    print_bands(floor_split)
    if args.json:
        made = {'params': args.params, 'bands': split, 'records': records,
                'untrained': {'seed': seed, 'bands': floor_split}}  # fmt: skip
        text = json.dumps(made, indent=1)
        files.atomic_write(args.json, lambda f: f.write(text.encode('utf-8')))


if __name__ == '__main__':
    main()
