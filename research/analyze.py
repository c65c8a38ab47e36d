"""What the model knows: evidence for the handout's part 3, from a predictions file.

    python research/analyze.py vanilla.pretrain.dev.predictions
    python research/analyze.py vanilla.pretrain.dev.predictions \\
        --params vanilla.finetune.params --json vanilla.analysis.json
    python research/analyze.py vanilla.analysis.json --exposure vanilla.exposure.json \\
        --json new.json
        # an earlier report (its predictions and confidence) split by exposure.py's report
    python research/analyze.py --coverage_plot coverage.png --exposure_plot exposure.png \
        vanilla.analysis.json rope.analysis.json
        # the reports side by side: a table, and the pictures of accuracy against coverage
        # and against exposure (with a table of the exposure picture's figures)

Every dev person has a wiki.txt document that begins with their name. Each prediction is
sorted into one of four categories: correct; wrong but found in the person's own document
(the right page, the wrong place); wrong and among the ten most frequent places of the
finetuning file (the prior: "London"); anything else (made up). Accuracy is split by
whether the gold place occurs in the person's document, by where it ends there (span
corruption trains on the first 4 to 112 characters of a document), by how often the name
occurs in the corpus at each such position, and by how often the place is the answer in
the finetuning file; with exposure.py's report of the pretraining (--exposure), by the
share of its epochs that showed the place. The last two splits give each band's
categories and median confidence too.

With the params that made the predictions, the model's confidence in each answer (the
probability of the answer and its closing MASK, from one batched forward pass) tells how
well it knows when it is right: the area under the ROC curve, and the accuracy when it
answers only its most confident 25, 50, 75 or 100% of the questions. It is also asked
where invented people were born: names made of first and last names of the finetuning
file that occur nowhere in wiki.txt or the finetuning file (part 3c).
"""

import import_paths  # noqa: F401 (first: src/ and tools/ on sys.path)

import machinery.cpu_libraries  # noqa: F401 (first: it sets up MKL and oneDNN before torch)

import argparse
import collections
import json
import math
import os
import random
import re
import sys

import torch
from torch.nn import functional as F

import dataset
import plot
import run
from machinery import checks, decoding, devices, files, params_files, run_cards

CATEGORIES = ['correct', 'own document', 'prior', 'made up']
PRIOR_PLACES = 10  # the most frequent finetuning places that count as the prior
COVERAGES = [0.25, 0.5, 0.75, 1.0]
NAME_BINS = [(0, 0), (1, 1), (2, 3), (4, 7), (8, None)]  # occurrences of a name in wiki.txt
# how often the gold place is the answer in the finetuning file
ANSWER_BINS = [('0', 0), ('1-4', 4), ('5-19', 19), ('20+', None)]
NEVER, RARELY, OFTEN = 'never', 'rarely (under 25%)', 'often (25% or more)'
EXPOSURE_BINS = [NEVER, RARELY, OFTEN, 'unknown']
WINDOW = int(run.BLOCK_SIZE * 7 / 8)  # the longest window span corruption draws


# --- Reading the inputs -------------------------------------------------------------------


def read_questions(path, need_places=True):
    """[(question, person, place)] of a "question<TAB>place" file; the person is the name
    in "Where was NAME born?" (the whole question if it has another form)."""
    rows = []
    for number, line in enumerate(files.read_lines(path), 1):
        parts = line.split('\t')
        if need_places and (len(parts) != 2 or not parts[1].strip()):
            raise files.UserError(f"{path}, line {number}: expected 'question<TAB>place'")
        match = re.fullmatch(r'Where was (.+) born\?', parts[0].strip())
        rows.append((parts[0], match.group(1) if match else parts[0], parts[-1]))
    return rows


def read_predictions(path, questions, questions_path):
    """One prediction a line (empty ones too, which evaluation writes for a model that
    answers nothing), as many as there are questions; or, from a .json, an earlier report's
    (report_predictions)."""
    if str(path).endswith('.json'):
        return report_predictions(read_report(path), path, questions, questions_path)
    try:
        with open(path, 'rb') as f:
            text = files.universal_newlines(f.read().decode('utf-8', errors='replace'))
    except OSError as e:
        raise files.UserError(f"{path}: cannot read: {e.strerror}")
    predictions = text.split('\n')[:-1] if text.endswith('\n') else text.split('\n')
    if len(predictions) != len(questions):
        raise files.UserError(
            f"{path}: {len(predictions)} predictions for the {len(questions)} questions "
            f"of {questions_path}"
        )
    return predictions


def report_predictions(report, path, questions, questions_path):
    """The predictions of an earlier report of analyze.py (read from path) on the same
    questions, in the same order."""
    if [r['person'] for r in report['records']] != [person for _, person, _ in questions]:
        raise files.UserError(f"{path}: its questions are not those of {questions_path}")
    return [r['prediction'] for r in report['records']]


def document_lines(lines, people):
    """The index in lines of each (name, place) person's document, or None: a line that
    begins with their whole name (and not with a longer name of the people's, as "George
    Bruce Malleson"'s is not George Bruce's), preferring one that holds their place (a
    place of None: any). The corpus may hold the documents in any order: each person
    with a place is matched first by how few lines could be theirs, so two people of one
    name, whose documents name their places, each get their own. Only people whose lines
    cannot be told apart (wiki.txt repeats a few documents word for word) are matched in
    the order given: the first one asked gets the first line."""
    starts = lambda line, p: line.startswith(p) and not line[len(p) : len(p) + 1].isalnum()
    first_word = lambda text: re.match(r'\w*', text).group()
    by_first_word = {}
    for i, line in enumerate(lines):
        by_first_word.setdefault(first_word(line), []).append(i)
    names = {name for name, _ in people}
    choices = []
    for name, place in people:
        longer = [q for q in names if len(q) > len(name) and q.startswith(name)]
        lines_of = [
            i
            for i in by_first_word.get(first_word(name), [])
            if starts(lines[i], name) and not any(starts(lines[i], q) for q in longer)
        ]
        holding = [i for i in lines_of if place is not None and occurs(lines[i], place)]
        choices.append((holding, lines_of))
    fewest_first = sorted(
        range(len(people)),
        key=lambda k: (len(choices[k][0]) or math.inf, len(choices[k][1]), k),
    )
    taken, found = set(), [None] * len(people)
    for k in fewest_first:
        holding, lines_of = choices[k]
        found[k] = next((i for i in holding + lines_of if i not in taken), None)
        taken.add(found[k])
    return found


def documents(corpus, people, before=()):
    """Each (name, place) person's document (document_lines), or '': `before` are the
    other people the corpus holds documents of (dev's: the finetuning file's), matched
    first."""
    lines = corpus.split('\n')
    found = document_lines(lines, [*before, *people])[len(before) :]
    return ['' if i is None else lines[i] for i in found]


def same_file(a, b):
    """Whether two paths (bare names found in data/ as the handout's commands find them)
    name one file."""
    found = [os.path.realpath(files.find_data_file(str(p))) for p in (a, b)]
    return found[0] == found[1]


def people_before(paths, finetune_path):
    """The finetuning file's people, (name, place), matched to their documents before
    those of the question files at paths (document_lines), or none when it is one of them."""
    if any(same_file(path, finetune_path) for path in paths):
        return []
    return [(person, place) for _, person, place in read_questions(finetune_path)]


def top_places(finetune_rows, n=PRIOR_PLACES):
    """The n most frequent places of the finetuning file, most frequent first."""
    return [
        place for place, _ in collections.Counter(p for _, _, p in finetune_rows).most_common(n)
    ]


def whole_words(phrase):
    """A regular expression for phrase as whole words."""
    return r'(?<!\w)' + re.escape(phrase) + r'(?!\w)'


def occurs(text, phrase):
    """Whether phrase occurs in text as whole words."""
    return bool(phrase) and re.search(whole_words(phrase), text) is not None


# --- Categories and splits ----------------------------------------------------------------


def category(prediction, place, document, prior):
    if prediction == place:
        return 'correct'
    if occurs(document, prediction):
        return 'own document'
    if prediction in prior:
        return 'prior'
    return 'made up'


def name_bin(count):
    for low, high in NAME_BINS:
        if low <= count and (high is None or count <= high):
            return f"{low}+" if high is None else (f"{low}" if low == high else f"{low}-{high}")


def categorize(rows, predictions, corpus, prior, before=()):
    """One record per question: its category, whether the gold place occurs in the
    person's document, and how often the person's name occurs in the corpus (before: as
    documents takes it)."""
    docs = documents(corpus, [(person, place) for _, person, place in rows], before)
    records = []
    for (_, person, place), prediction, doc in zip(rows, predictions, docs):
        records.append({
            'person': person,
            'place': place,
            'prediction': prediction,
            'category': category(prediction, place, doc, prior),
            'gold in document': occurs(doc, place),
            'place end': place_end(doc, place),
            'name count': len(re.findall(whole_words(person), corpus)),
        })  # fmt: skip
    return records


def place_span(document, place):
    """(start, end) of the place's first whole-word occurrence in the document, or None."""
    found = re.search(whole_words(place), document) if place else None
    return found.span() if found else None


def place_end(document, place):
    """Where the place's first whole-word occurrence in the document ends (characters from
    its start), or None: pretraining's window, 4 to WINDOW characters from the start,
    shows it only when it reaches that far."""
    span = place_span(document, place)
    return span[1] if span else None


def position_bin(end):
    """The split by where the gold place ends in the person's document."""
    if end is None:
        return 'not in it'
    if end > WINDOW:
        return f"after {WINDOW}"
    return next(f"{low}-{high}" for low, high in ((1, 40), (41, 80), (81, WINDOW)) if end <= high)


def exposure_bin(fraction):
    """The split by the fraction of epochs pretraining showed the place (exposure.py)."""
    if fraction is None:
        return 'unknown'
    if fraction == 0:
        return NEVER
    return RARELY if fraction < 0.25 else OFTEN


def answer_count_bin(count):
    """The split by how often the gold place is the answer in the finetuning file."""
    return next(label for label, high in ANSWER_BINS if high is None or count <= high)


def breakdown(records, key):
    """{value of key: questions, correct, the count of each category and the median
    confidence (None without one)} over the records."""
    split = {}
    for value in sorted({str(key(r)) for r in records}):
        group = [r for r in records if str(key(r)) == value]
        scores = [r['confidence'] for r in group if 'confidence' in r]
        counts = collections.Counter(r['category'] for r in group)
        split[value] = {
            'questions': len(group),
            'correct': counts['correct'],
            'categories': {c: counts[c] for c in CATEGORIES},
            'median confidence': median(scores) if scores else None,
        }
    return split


def split_accuracy(records, key):
    """{value of key: [correct, total]} over the records: the breakdown's accuracy alone."""
    return {
        value: [row['correct'], row['questions']] for value, row in breakdown(records, key).items()
    }


# --- Confidence ---------------------------------------------------------------------------


@torch.no_grad()
def confidences(gpt, questions, answers, pretrain_dataset, batch_size=256):
    """P(answer + MASK | question + MASK) for each pair, as the model computes it in one
    forward pass per batch: the product of the probabilities of the answer's characters
    and of the closing MASK. Characters outside the vocabulary are dropped, as evaluation
    drops them from questions."""
    gpt.eval()
    stoi, mask = pretrain_dataset.stoi, pretrain_dataset.MASK_CHAR
    room = decoding.question_room(gpt.get_block_size(), run.ANSWER_LENGTH)
    rows = []
    for question, answer in zip(questions, answers):
        prompt = decoding.encode_question(question, pretrain_dataset, room).ids.tolist()
        target = [stoi[c] for c in answer[: run.ANSWER_LENGTH] if c in stoi] + [stoi[mask]]
        rows.append((prompt, target))
    return [math.exp(lp) for lp in log_probs(gpt, rows, batch_size)]


def log_probs(gpt, rows, batch_size=256):
    """log P(target | prompt) of each (prompt, target) pair of ids, batch_size at a time."""
    device = next(gpt.parameters()).device
    result = []
    for start in range(0, len(rows), batch_size):
        result += batch_log_probs(gpt, rows[start : start + batch_size], device)
    return result


def batch_log_probs(gpt, rows, device):
    """log P(target | prompt) of each (prompt, target) pair, padded into one batch."""
    length = max(len(p) + len(t) - 1 for p, t in rows)
    idx = torch.zeros(len(rows), length, dtype=torch.long)  # (B, T), PAD after each row
    for i, (prompt, target) in enumerate(rows):
        sequence = prompt + target[:-1]
        idx[i, : len(sequence)] = torch.tensor(sequence)
    logits, _ = gpt(idx.to(device))
    log_probs = F.log_softmax(logits.float(), dim=-1).cpu()  # (B, T, vocab)
    result = []
    for i, (prompt, target) in enumerate(rows):
        positions = torch.arange(len(prompt) - 1, len(prompt) - 1 + len(target))
        result.append(float(log_probs[i, positions, torch.tensor(target)].sum()))
    return result


def auroc(scores, labels):
    """The probability that a random right answer scores above a random wrong one (ties
    count half): the area under the ROC curve. None without both kinds."""
    right = [s for s, ok in zip(scores, labels) if ok]
    wrong = [s for s, ok in zip(scores, labels) if not ok]
    if not right or not wrong:
        return None
    above = sum((r > w) + 0.5 * (r == w) for r in right for w in wrong)
    return above / (len(right) * len(wrong))


def coverage_accuracy(scores, labels, coverages=COVERAGES):
    """{coverage: accuracy over the ceil(coverage x n) most confident answers}."""
    order = sorted(range(len(scores)), key=lambda i: -scores[i])
    result = {}
    for coverage in coverages:
        kept = order[: max(1, math.ceil(coverage * len(order)))]
        result[str(coverage)] = sum(labels[i] for i in kept) / len(kept)
    return result


# --- Invented people (part 3c) ------------------------------------------------------------


def invent_names(finetune_rows, corpus, finetune_text, n, seed=0):
    """n names made of a first name and a last name of the finetuning file's people, none
    of which occurs in the corpus or the finetuning file; the same n for the same seed."""
    people = [person.split() for _, person, _ in finetune_rows]
    firsts = sorted({p[0] for p in people if len(p) >= 2})
    lasts = sorted({p[-1] for p in people if len(p) >= 2})
    rng, names = random.Random(seed), []
    for _ in range(100 * n):
        if len(names) == n:
            break
        name = f"{rng.choice(firsts)} {rng.choice(lasts)}"
        if name not in names and name not in corpus and name not in finetune_text:
            names.append(name)
    return names


def invented_people(gpt, names, pretrain_dataset, prior):
    """What the model answers about each invented person, and how sure it is."""
    questions = [f"Where was {name} born?" for name in names]
    answers = decoding.answer_questions(
        gpt, questions, pretrain_dataset, run.ANSWER_LENGTH, 'invented names'
    )
    scores = confidences(gpt, questions, answers, pretrain_dataset)
    common = collections.Counter(answers).most_common(5)
    return {
        'people': len(names),
        'share among the top places': sum(a in prior for a in answers) / len(answers),
        'most common answers': [[answer, count] for answer, count in common],
        'median confidence': median(scores),
        'answers': [[n, a, s] for n, a, s in zip(names, answers, scores)],
    }


def median(values):
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


# --- The report ---------------------------------------------------------------------------


def analyze(args):
    """The report on args.predictions, as a dict that json.dump writes as it is."""
    rows = read_questions(args.eval_corpus_path)
    seen = read_exposure(args.exposure, args.params) if args.exposure else None  # checked first
    earlier = read_report(args.predictions) if args.predictions.endswith('.json') else None
    if earlier and args.params:
        raise files.UserError(
            f"--params: {args.predictions} already holds the confidence its params gave"
        )
    if earlier:  # read once, for its name and confidence too
        predictions = report_predictions(earlier, args.predictions, rows, args.eval_corpus_path)
    else:
        predictions = read_predictions(args.predictions, rows, args.eval_corpus_path)
    corpus = files.read_text(args.pretrain_corpus_path)
    finetune_text = files.read_text(args.finetune_corpus_path)
    finetune_rows = read_questions(args.finetune_corpus_path)
    prior = top_places(finetune_rows)
    before = people_before([args.eval_corpus_path], args.finetune_corpus_path)
    records = categorize(rows, predictions, corpus, prior, before)
    answers = collections.Counter(place for _, _, place in finetune_rows)
    for record in records:
        record['answer count'] = answers[record['place']]
    counts = collections.Counter(r['category'] for r in records)
    report = {
        'name': args.name or (earlier['name'] if earlier else args.predictions),
        'questions': len(records),
        'accuracy': counts['correct'] / len(records),
        'categories': {c: counts[c] for c in CATEGORIES},
        'prior places': prior,
        'by gold in document': split_accuracy(records, lambda r: r['gold in document']),
        'by name count': split_accuracy(records, lambda r: name_bin(r['name count'])),
        'by place position': split_accuracy(records, lambda r: position_bin(r['place end'])),
        # names that occur once put the place earlier: compared at the same position
        'by name count at each place position': {
            position: split_accuracy(
                [r for r in records if position_bin(r['place end']) == position],
                lambda r: name_bin(r['name count']),
            )
            for position in sorted({position_bin(r['place end']) for r in records})
        },
    }
    if args.params or earlier:
        if earlier:  # the confidence the earlier report's params gave
            scores = [r['confidence'] for r in earlier['records']]
            report['invented people'] = earlier['invented people']
        else:
            gpt, pretrain_dataset = load_model(args, corpus)
            questions = [question for question, _, _ in rows]
            scores = confidences(gpt, questions, predictions, pretrain_dataset)
            names = invent_names(finetune_rows, corpus, finetune_text, args.invented, args.seed)
            report['invented people'] = invented_people(gpt, names, pretrain_dataset, prior)
        labels = [r['category'] == 'correct' for r in records]
        for record, score in zip(records, scores):
            record['confidence'] = score
        report['auroc'] = auroc(scores, labels)
        report['accuracy at coverage'] = coverage_accuracy(scores, labels)
        report['median confidence'] = median(scores)
    report['by answer count'] = breakdown(records, lambda r: answer_count_bin(r['answer count']))
    if seen is not None:
        for record in records:
            record['fraction seen'] = seen.get((record['person'], record['place']))
        report['by exposure'] = breakdown(records, lambda r: exposure_bin(r['fraction seen']))
    report['records'] = records
    return report


def read_exposure(path, params=None):
    """{(person, place): the share of epochs that showed the place} of exposure.py's --json
    (by person and place: a name can be two people's). With `params`, the report must be of
    the pretraining they come from, where their card says which (run_cards.py)."""
    try:
        made = json.loads(files.read_text(path))
        if isinstance(made, list):  # written before reports named their run
            made = {'made_from': None, 'people': made}
        seen = {(r['name'], r['place']): r['fraction_seen'] for r in made['people']}
    except (ValueError, TypeError, KeyError):
        raise files.UserError(f"--exposure {path}: not the --json of exposure.py")
    if params is not None:
        run_cards.check_same_examples(made['made_from'], f"--exposure {path}", params, 'params')
    return seen


def add_model_arguments(argp):
    """The options load_model reads, beside the params file's path."""
    argp.add_argument(
        '--variant', choices=list(run.VARIANT_EDITION), help="default: the params file's"
    )
    argp.add_argument('--bottleneck_dim', type=run.positive(int), help="default: the params file's")
    argp.add_argument('--device', choices=devices.DEVICES, default='auto')


def load_model(args, corpus):
    """The model of args.params, in evaluation's fp32, and the vocabulary's dataset; its
    variant and bottleneck are the file's where --variant and --bottleneck_dim leave them out."""
    pretrain_dataset = dataset.CharCorruptionDataset(corpus, run.BLOCK_SIZE)
    variant, bottleneck_dim = params_files.variant_and_bottleneck(
        args.params, args.variant, args.bottleneck_dim, '--params'
    )
    gpt = run.new_model(variant, pretrain_dataset.vocab_size, bottleneck_dim)
    params_files.load_params(
        args.params, gpt, args.pretrain_corpus_path, run.model_name(variant), '--params'
    )
    return gpt.to(devices.pick_device(args.device)), pretrain_dataset


def untrained_model(args, pretrain_dataset):
    """A probe's floor: a model of args.params' variant (and bottleneck) as run.py
    initialises it before training, with the --seed of the pretraining the params come
    from (their card's; 0, run.py's default, without one), in fp32 on the same device.
    Returns (the model, its seed)."""
    variant, bottleneck_dim = params_files.variant_and_bottleneck(
        args.params, args.variant, args.bottleneck_dim, '--params'
    )
    seed = (run_cards.pretraining(args.params) or {}).get('seed', 0)
    with torch.random.fork_rng(devices=[]):  # the initialisation draws from torch's only
        torch.manual_seed(seed)
        gpt = run.new_model(variant, pretrain_dataset.vocab_size, bottleneck_dim)
    return gpt.to(devices.pick_device(args.device)), seed


def percent(correct, total):
    return f"{correct / total:6.1%} ({correct}/{total})" if total else "     - (0/0)"


def print_report(report):
    n = report['questions']
    print(f"{report['name']}: accuracy {percent(report['categories']['correct'], n)}")
    print("categories:")
    for name, count in report['categories'].items():
        print(f"  {name:<14} {percent(count, n)}")
    print("accuracy by whether the gold place is in the person's document:")
    for value, (correct, total) in sorted(report['by gold in document'].items(), reverse=True):
        print(f"  {'in it' if value == 'True' else 'not in it':<14} {percent(correct, total)}")
    print("accuracy by how often the name occurs in the pretraining corpus:")
    for low, _ in NAME_BINS:
        key = name_bin(low)
        correct, total = report['by name count'].get(key, [0, 0])
        label = 'once' if key == '1' else f"{key} times"
        print(f"  {label:<14} {percent(correct, total)}")
    print("accuracy by where the gold place ends in the person's document (characters),")
    print("and by how often the name occurs at that position (once / 2-3 times):")
    for key in ('1-40', '41-80', f"81-{WINDOW}", f"after {WINDOW}", 'not in it'):
        by_name = report['by name count at each place position'].get(key, {})
        once, few = (percent(*by_name.get(k, [0, 0])).strip() for k in ('1', '2-3'))
        print(
            f"  {key:<14} {percent(*report['by place position'].get(key, [0, 0]))}   {once} / {few}"
        )
    print("by how often the gold place is the answer in the finetuning file:")
    print_breakdown(report['by answer count'], [label for label, _ in ANSWER_BINS])
    if 'by exposure' in report:
        print("by the share of pretraining's epochs that showed the gold place (exposure.py):")
        print_breakdown(report['by exposure'], EXPOSURE_BINS)
    if 'auroc' in report:
        auroc_text = 'n/a' if report['auroc'] is None else f"{report['auroc']:.3f}"
        print(f"confidence: median {report['median confidence']:.3f}, AUROC {auroc_text}")
        for coverage, accuracy in report['accuracy at coverage'].items():
            print(f"  answering the {float(coverage):.0%} most confident: {accuracy:.1%} right")
        invented = report['invented people']
        common = ', '.join(f"{a or '(empty)'} {c}" for a, c in invented['most common answers'])
        print(
            f"invented people ({invented['people']}): "
            f"{invented['share among the top places']:.1%} of answers among the top "
            f"{PRIOR_PLACES} places; median confidence {invented['median confidence']:.3f}; "
            f"most common: {common}"
        )


def print_breakdown(split, order):
    """A breakdown's rows in the given order: questions, accuracy, the categories' shares
    and the median confidence."""
    print(
        f"  {'':<20} {'questions':>9} " + ' '.join(f"{c:>12}" for c in CATEGORIES) + "  confidence"
    )
    for key in order:
        if key in split:
            row = split[key]
            n, confidence = row['questions'], row['median confidence']
            shares = ' '.join(f"{row['categories'][c] / n:12.1%}" for c in CATEGORIES)
            median_text = '' if confidence is None else f"{confidence:11.3f}"
            print(f"  {key:<20} {n:>9} {shares} {median_text}")


def comparison(reports):
    """A markdown table of the reports' categories, confidence and invented people."""
    lines = [
        '| model | correct | own document | prior | made up | AUROC | right among its 25% / '
        '50% / 75% / 100% most confident | median confidence: dev / invented | answers among '
        f'the top {PRIOR_PLACES} places: dev / invented | commonest answers for invented people |',
        '|---|---|---|---|---|---|---|---|---|---|',
    ]
    for report in reports:
        n, counts = report['questions'], report['categories']
        shares = ' | '.join(f"{counts[c] / n:.1%}" for c in CATEGORIES)
        auroc_text = 'n/a' if report['auroc'] is None else f"{report['auroc']:.2f}"
        covered = ' / '.join(f"{a:.1%}" for a in report['accuracy at coverage'].values())
        prior = set(report['prior places'])
        dev_prior = sum(r['prediction'] in prior for r in report['records']) / n
        invented = report['invented people']
        common = ', '.join(f"{a or '(empty)'} {c}" for a, c in invented['most common answers'][:3])
        lines.append(
            f"| {report['name']} | {shares} | {auroc_text} ({counts['correct']} right) | "
            f"{covered} | {report['median confidence']:.3f} / {invented['median confidence']:.3f}"
            f" | {dev_prior:.1%} / {invented['share among the top places']:.1%} | {common} |"
        )
    return '\n'.join(lines)


def coverage_plot(reports, out):
    """Accuracy against coverage, a line per report."""
    plt = plot.pyplot('--coverage_plot')
    fig, ax = plt.subplots(figsize=(6, 4))
    for report in reports:
        scores = [r['confidence'] for r in report['records']]
        labels = [r['category'] == 'correct' for r in report['records']]
        steps = [i / 20 for i in range(1, 21)]
        curve = coverage_accuracy(scores, labels, steps)
        ax.plot([100 * c for c in steps], [100 * a for a in curve.values()], label=report['name'])
    ax.set_xlabel('questions answered, most confident first (%)')
    ax.set_ylabel('accuracy of those answered (%)')
    ax.set_xlim(0, 100)
    ax.set_ylim(bottom=0)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=120)


PLOT_EXPOSURE = [(0, 0), (0, 0.2), (0.2, 0.4), (0.4, 0.6), (0.6, 1)]  # shares of epochs


def in_band(fraction, low, high):
    """Whether a share of epochs falls in (low, high]; (0, 0] is never."""
    return fraction == 0 if high == 0 else low < fraction <= high


PLOT_LABELS = ['never', 'up to 20%'] + [f"{low:.0%}-{high:.0%}" for low, high in PLOT_EXPOSURE[2:]]


def exposure_bands(report):
    """[(correct, questions)] of the report's records in each band of PLOT_EXPOSURE (the
    report made with --exposure)."""
    if any(r.get('fraction seen') is None for r in report['records']):
        raise files.UserError(f"--exposure_plot: {report['name']} was made without --exposure")
    bands = []
    for low, high in PLOT_EXPOSURE:
        group = [r for r in report['records'] if in_band(r['fraction seen'], low, high)]
        bands.append((sum(r['category'] == 'correct' for r in group), len(group)))
    return bands


def exposure_table(reports):
    """A markdown table of the reports' accuracy in each band: what exposure_plot draws."""
    lines = ['| model | ' + ' | '.join(PLOT_LABELS) + ' |', '|---' * (1 + len(PLOT_LABELS)) + '|']
    for report in reports:
        cells = [f"{correct / n:.1%} of {n}" if n else '-' for correct, n in exposure_bands(report)]
        lines.append(f"| {report['name']} | " + ' | '.join(cells) + ' |')
    return '\n'.join(lines)


def exposure_plot(reports, out):
    """Accuracy against the share of pretraining's epochs that showed the gold place, a
    line per report (made with --exposure)."""
    plt = plot.pyplot('--exposure_plot')
    fig, ax = plt.subplots(figsize=(6, 4))
    for report in reports:
        accuracies = [100 * c / n if n else float('nan') for c, n in exposure_bands(report)]
        ax.plot(PLOT_LABELS, accuracies, marker='o', label=report['name'])  # nan: a gap
    ax.set_xlabel("share of pretraining's epochs whose window held the gold place")
    ax.set_ylabel('dev accuracy (%)')
    ax.set_ylim(bottom=0)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=120)


def read_report(path):
    try:
        with open(path, encoding='utf-8') as f:
            report = json.load(f)
        needed = ['name', 'questions', 'categories', 'prior places', 'auroc',
                  'accuracy at coverage', 'median confidence', 'invented people']  # fmt: skip
        records = report['records']
        if any(k not in report for k in needed) or any('confidence' not in r for r in records):
            raise KeyError('confidence')
        return report
    except OSError as e:
        raise files.UserError(f"{path}: cannot read: {e.strerror}")
    except (ValueError, KeyError, TypeError):
        raise files.UserError(f"{path}: not a report of analyze.py --params ... --json")


def parse_args(argv):
    argp = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    argp.add_argument('inputs', nargs='+', help="a predictions file or an earlier --json report "
                      "(with --coverage_plot or --exposure_plot, the reports to draw)")  # fmt: skip
    argp.add_argument('--eval_corpus_path', default='birth_dev.tsv')
    argp.add_argument('--pretrain_corpus_path', default='wiki.txt')
    argp.add_argument(
        '--finetune_corpus_path',
        default='birth_places_train.tsv',
        help="the whole finetuning file: the prior places, and the people whose documents "
        "come first in wiki.txt",
    )
    argp.add_argument('--params', help="the params that made the predictions: adds confidence")
    argp.add_argument(
        '--exposure', help="exposure.py's --json of the pretraining: adds the split by exposure"
    )
    argp.add_argument('--invented', type=run.positive(int), default=300, help="invented people")
    argp.add_argument('--seed', type=int, default=0, help="of the invented names (default 0)")
    argp.add_argument('--name', help="the model's name in the report (default: the file's)")
    argp.add_argument('--json', help="write the report, every question's record included")
    argp.add_argument('--coverage_plot', help="draw the reports' accuracy against coverage")
    argp.add_argument(
        '--exposure_plot', help="draw the reports' accuracy against exposure (--exposure's)"
    )
    add_model_arguments(argp)
    args = argp.parse_args(argv)
    args.comparing = bool(args.coverage_plot or args.exposure_plot)
    if not args.comparing and len(args.inputs) != 1:
        argp.error("give one predictions file (several inputs are for the plots)")
    args.predictions = args.inputs[0]
    return args


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        checks.check_reports(args, 'json', 'coverage_plot', 'exposure_plot')
        if args.comparing:
            reports = [read_report(path) for path in args.inputs]
            print(comparison(reports))
            if args.coverage_plot:
                coverage_plot(reports, args.coverage_plot)
                print(f"accuracy against coverage written to {args.coverage_plot}")
            if args.exposure_plot:
                print(exposure_table(reports))
                exposure_plot(reports, args.exposure_plot)
                print(f"accuracy against exposure written to {args.exposure_plot}")
            return
        report = analyze(args)
        print_report(report)
        if args.json:
            text = json.dumps(report, indent=1)
            files.atomic_write(args.json, lambda f: f.write(text.encode('utf-8')))
    except files.UserError as e:
        sys.exit(files.report(e))


if __name__ == '__main__':
    main()
