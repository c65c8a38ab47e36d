"""A small synthetic world: invented people with invented birthplaces, their biographies as
a pretraining corpus, and the handout's question files, so that whether pretraining puts
knowledge within reach of questions the finetuning never saw can be measured in minutes
on a CPU, in a world where every fact, and how often and in what words it is stated, is
known (Allen-Zhu & Li, "Physics of Language Models, Part 3.1", 2023).

    python research/small_world.py --seed 0 --outdir world     # 5 paraphrases, permuted
    python research/small_world.py --seed 0 --outdir single --paraphrases 1 --ordered

It writes, into --outdir:
  world.txt          the corpus: each person's biographies, one a line, in a shuffled order,
                     after one line that holds the questions' characters ('W', '?')
  finetune.tsv       "Where was NAME born?<TAB>PLACE" for the people finetuning sees
  heldout.tsv        the same for the held-out people, whose biographies pretraining saw
                     but whose questions finetuning never does
  test_inputs.tsv    the held-out questions without their places
  world.json         the knobs, and every person's facts, split and documents

A biography states a person's birthplace and --attributes more facts (a trade, a
school), a sentence each, every sentence with the whole name, in templates drawn
from --templates per fact. A person has --documents documents (or a number drawn from
A-B, for an exposure curve), which cycle through their --paraphrases distinct
biographies (1: the same text repeated, as many times; fewer where the templates and
orders cannot make that many), each in its own sentence order unless --ordered.

Every document is at most 112 characters: span corruption truncates a document to a
length from 4 to int(block_size * 7/8) = 112 characters, from its start, so anything past
that is never shown. A biography that would be longer is drawn again with other
templates (the shortest ones at the last try), so every fact, the birthplace included,
lies within what the longest truncation keeps. Places are assigned in equal numbers (chance
is 1/--places), and names and places are made of syllables, so no real corpus's prior
helps. The same arguments give byte-identical files.

A world is a corpus like wiki.txt: every document begins with its person's whole name, so
the handout's commands, grid.py and the part-3 tools take world.txt, finetune.tsv and
heldout.tsv where they take wiki.txt, birth_places_train.tsv and birth_dev.tsv.
"""

import import_paths  # noqa: F401 (first: src/ and tools/ on sys.path)

import argparse
import json
import os
import random
import sys

from machinery import files

MAX_CHARS = int(128 * 7 / 8)  # what span corruption can show of a document (block size 128)
# letters at most, so that the shortest templates fit MAX_CHARS with every fact
LONGEST = {'name': 13, 'place': 9, 'school': 8}
VOCABULARY_LINE = "Where was each of them born? Their biographies say."

ONSETS = ['b', 'd', 'f', 'g', 'k', 'l', 'm', 'n', 'p', 'r', 's', 't', 'v', 'z', 'br', 'dr',
          'gr', 'kl', 'st', 'th', 'tr', 'sh']  # fmt: skip
VOWELS = ['a', 'e', 'i', 'o', 'u', 'ai', 'ei', 'ou']
CODAS = ['', '', '', 'n', 'r', 'l', 's', 'k', 'm', 'nd', 'rt']

TRADES = ['potter', 'weaver', 'baker', 'miller', 'cooper', 'tanner', 'mason', 'glazier',
          'smith', 'carver', 'dyer', 'roper']  # fmt: skip
# The facts of a biography and the templates that state them ({n}: the whole name).
BIRTH = [
    "{n} was born in {v}.",
    "{n} is a native of {v}.",
    "{n} came into the world in {v}.",
    "{n} was born in the town of {v}.",
    "{n} first saw the light in {v}.",
    "{n} was born and raised in {v}.",
    "{n} hails from {v} by birth.",
    "{n} has {v} as a birthplace.",
]
ATTRIBUTES = {
    'trade': (
        TRADES,
        [
            "{n} works as a {v}.",
            "{n} is a {v} by trade.",
            "{n} earns a living as a {v}.",
            "{n} is known as a {v}.",
            "{n} became a {v}.",
            "{n} is a skilled {v}.",
            "{n} trained as a {v}.",
            "{n} makes a living as a {v}.",
        ],
    ),
    'school': (
        None,  # invented names, like places
        [
            "{n} studied at {v} Hall.",
            "{n} went to school at {v} Hall.",
            "{n} was taught at {v} Hall.",
            "{n} is a pupil of {v} Hall.",
            "{n} learned to read at {v} Hall.",
            "{n} attended {v} Hall.",
            "{n} was schooled at {v} Hall.",
            "{n} studied at {v} Hall as a child.",
        ],
    ),
}


def word(rng, syllables):
    """An invented word of this many syllables, capitalised."""
    text = ''.join(rng.choice(ONSETS) + rng.choice(VOWELS) for _ in range(syllables - 1))
    text += rng.choice(ONSETS) + rng.choice(VOWELS) + rng.choice(CODAS)
    return text.capitalize()


def distinct_words(rng, count, syllables, taken, longest):
    """`count` invented words of at most `longest` letters, none in `taken` (which they
    join)."""
    words = []
    while len(words) < count:
        candidate = word(rng, rng.choice(syllables))
        if candidate not in taken and len(candidate) <= longest:
            taken.add(candidate)
            words.append(candidate)
    return words


def full_names(rng, count, taken):
    """`count` distinct whole names of at most LONGEST['name'] characters, none the start of
    another's ('Tavo Mer' and 'Tavo Meren'), so that each document begins with exactly one
    person's name."""
    names = set()
    while len(names) < count:
        name = f"{word(rng, rng.choice([1, 2]))} {word(rng, 2)}"
        clash = any(o.startswith(name) or name.startswith(o) for o in names)
        if len(name) <= LONGEST['name'] and name not in taken and not clash:
            names.add(name)
    return sorted(names)


def biography(rng, person, templates, ordered):
    """One biography of `person`: a sentence per fact in templates drawn from the first
    `templates` of each fact's, birth first unless shuffled; drawn again, with the
    shortest templates at the last try, while longer than MAX_CHARS."""
    facts = [('birth', BIRTH)] + [(name, ATTRIBUTES[name][1]) for name in person['facts']]
    for attempt in range(100):
        shortest = attempt == 99
        sentences = []
        for name, options in facts:
            options = options[:templates]
            template = min(options, key=len) if shortest else rng.choice(options)
            value = person['place'] if name == 'birth' else person['facts'][name]
            sentences.append(template.format(n=person['name'], v=value))
        if not ordered:
            rng.shuffle(sentences)
        text = ' '.join(sentences)
        if len(text) <= MAX_CHARS:
            return text
    raise files.UserError(
        f"{person['name']}: a biography of {len(text)} characters, over the {MAX_CHARS} span "
        f"corruption shows: give fewer --attributes"
    )


def documents_per_person(rng, documents, count):
    low, high = documents
    return [rng.randint(low, high) for _ in range(count)]


def make_world(args):
    """(files: {name: text}, world: the JSON record) of the world these arguments make."""
    rng = random.Random(args.seed)
    taken = set()
    places = distinct_words(rng, args.places, [2, 3], taken, LONGEST['place'])
    schools = distinct_words(rng, 12, [2], taken, LONGEST['school'])
    names = full_names(rng, args.people, taken)
    rng.shuffle(names)
    # equal numbers of people per birthplace, in a random order
    births = [places[i % len(places)] for i in range(len(names))]
    rng.shuffle(births)
    chosen = list(ATTRIBUTES)[: args.attributes]
    counts = documents_per_person(rng, args.documents, len(names))
    people = []
    for name, place, count in zip(names, births, counts):
        facts = {}
        for fact in chosen:
            if fact == 'trade':
                facts[fact] = rng.choice(ATTRIBUTES['trade'][0])
            else:
                facts[fact] = rng.choice(schools)
        people.append(dict(name=name, place=place, facts=facts, documents=count))
    finetuned = set(rng.sample(range(len(people)), round(len(people) * args.finetune_share)))
    lines = []
    for i, person in enumerate(people):
        person['split'] = 'finetune' if i in finetuned else 'heldout'
        wanted = min(args.paraphrases or person['documents'], person['documents'])
        bios = []
        for _ in range(100 * wanted):  # distinct, as far as the templates and orders allow
            bio = biography(rng, person, args.templates, args.ordered)
            if bio not in bios:
                bios.append(bio)
            if len(bios) == wanted:
                break
        person['biographies'] = bios
        lines += [bios[k % len(bios)] for k in range(person['documents'])]
    rng.shuffle(lines)
    corpus = '\n'.join([VOCABULARY_LINE, *lines]) + '\n'

    def questions(split, with_places=True):
        rows = [p for p in people if p['split'] == split]
        return ''.join(
            f"Where was {p['name']} born?" + (f"\t{p['place']}" if with_places else '') + '\n'
            for p in rows
        )

    made = {
        'world.txt': corpus,
        'finetune.tsv': questions('finetune'),
        'heldout.tsv': questions('heldout'),
        'test_inputs.tsv': questions('heldout', with_places=False),
    }
    knobs = {k: v for k, v in vars(args).items() if k != 'outdir'}
    record = {'knobs': knobs, 'places': places, 'chance': 1 / len(places), 'people': people}
    made['world.json'] = json.dumps(record, indent=1) + '\n'
    return made


def documents_range(text):
    """--documents: N, or A-B (each person's number drawn from A to B)."""
    low, _, high = text.partition('-')
    try:
        low, high = int(low), int(high or low)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: a number, or A-B") from None
    if not 1 <= low <= high:
        raise argparse.ArgumentTypeError(f"{text!r}: at least 1, and A no more than B")
    return low, high


def at_least(minimum):
    def parse(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: a whole number") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value}: at least {minimum}")
        return value

    return parse


def parse_args(argv):
    argp = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    argp.add_argument('--seed', type=int, default=0, help="the world's seed (default 0)")
    argp.add_argument('--outdir', required=True, help="where the files go")
    argp.add_argument('--people', type=at_least(2), default=400, help="default 400")
    argp.add_argument('--places', type=at_least(2), default=20, help="birthplaces (default 20)")
    argp.add_argument(
        '--documents', type=documents_range, default=(5, 5), metavar='N or A-B',
        help="documents per person, or each person's drawn from A to B (default 5)",
    )  # fmt: skip
    argp.add_argument(
        '--paraphrases', type=at_least(1),
        help="distinct biographies per person, which the documents cycle through (default: "
        "one per document)",
    )  # fmt: skip
    argp.add_argument(
        '--templates', type=at_least(1), default=len(BIRTH),
        help=f"templates per fact to draw from (default {len(BIRTH)}, all)",
    )  # fmt: skip
    argp.add_argument(
        '--attributes', type=at_least(0), default=2, choices=range(len(ATTRIBUTES) + 1),
        metavar=f"0-{len(ATTRIBUTES)}", help="facts besides the birthplace (default 2)",
    )  # fmt: skip
    argp.add_argument(
        '--ordered', action='store_true',
        help="every biography's sentences in one order, birth first (default: shuffled)",
    )  # fmt: skip
    argp.add_argument(
        '--finetune_share', type=float, default=0.5,
        help="the share of people whose questions finetuning sees (default 0.5)",
    )  # fmt: skip
    args = argp.parse_args(argv)
    if not 0 < args.finetune_share < 1:
        argp.error(f"--finetune_share {args.finetune_share}: between 0 and 1")
    return args


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        made = make_world(args)
        os.makedirs(args.outdir, exist_ok=True)
        for name, text in made.items():
            path = os.path.join(args.outdir, name)
            files.atomic_write(path, lambda f, text=text: f.write(text.encode()))
    except files.UserError as e:
        sys.exit(files.report(e))
    record = json.loads(made['world.json'])
    documents = sum(p['documents'] for p in record['people'])
    print(
        f"a world of {len(record['people'])} people and {len(record['places'])} places, "
        f"{documents} documents, written to {args.outdir}"
    )


if __name__ == '__main__':
    main()
