"""The assignment's autograder, run locally: what the course's public grader checked, for
every edition, and what it left out.

    python grading/grade.py SUBMISSION                # a folder with src/, or the zip
    python grading/grade.py SUBMISSION --edition 2024 --json results.json
    python grading/grade.py a.zip b.zip c/ --csv grades.csv     # a class at once

SUBMISSION is a folder holding src/ and the handout's outputs (params and predictions),
or the zip collect_submission.sh makes. The data comes from data/ (--data). Each check
of the submission's code runs in a process of its own (probes.py), in a copy of its
files, with a time limit: an exception, a hang or a crash fails that test with a
one-line reason, and the submission itself is only read. Configs are taken by running
the submission's own run.py commands with training intercepted, never by training.

The code is checked against direct computations of the handout's equations with given
weights, under the starter's names; span corruption by its spec's properties on drawn
examples (seeded; the margins are in span_examples); the results by the edition's
accuracy floors. The test-set floors need the answers (--answers), which we do not ship.
"""

import argparse
import csv
import io
import json
import math
import multiprocessing
import os
import random
import re
import shutil
import string
import sys
import tempfile
import time
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
from torch.nn import functional as F

import probes

ROOT = Path(__file__).resolve().parent.parent
ARCHITECTURES = Path(__file__).with_name('architectures.json')
DATA_FILES = ('wiki.txt', 'birth_places_train.tsv', 'birth_dev.tsv', 'birth_test_inputs.tsv')
FETCH_DATA = "python tools/get_data.py fetches the course's four files into data/; data/README.md"
ACCURACY_FILE = 'london_baseline_accuracy.txt'

# What differs between the editions: the variant beside vanilla and the flags its commands
# pass, pretraining's schedule (epochs of tokens), the span-corruption padding beyond
# block_size, and the accuracy floors (%), dev from the handouts, test one point lower
# where the handout names none (the public grader's rule).
EDITIONS = {
    '2021': dict(variant='synthesizer', flags=[], schedule=200, extra_pad=0,
                 vanilla_dev=10, vanilla_test=9, variant_dev=5, variant_test=4,
                 london_file=False),
    '2023': dict(variant='perceiver', flags=['--bottleneck_dim', '64'], schedule=200,
                 extra_pad=0, vanilla_dev=10, vanilla_test=9, variant_dev=6, variant_test=5,
                 london_file=False),
    '2024': dict(variant='rope', flags=[], schedule=650, extra_pad=1, vanilla_dev=15,
                 vanilla_test=14, variant_dev=30, variant_test=30, london_file=True),
}  # fmt: skip
EDITIONS['2025'] = EDITIONS['2024']
BLOCK_SIZE = 128
SPAN_BLOCK = 50  # span corruption is drawn with this block size, as the public grader does
SPAN_DRAWS = 4000
SPAN_SEED = 0  # random, numpy and torch are seeded with it before the draws


class Fail(Exception):
    """A test's failure, with its one-line reason."""


class Unwritten(Fail):
    """A test that could not run: a stub of the starter raised, the test's own part or one
    it goes through (the vanilla model's architecture is read through finetune). stub:
    probes.unwritten's {'parts', 'what', 'in', 'file'}."""

    def __init__(self, line, stub):
        super().__init__(line)
        self.stub = stub

    def reason(self, part):
        """'needs part (c) finetune in src/run.py, not written yet', naming the test's own
        part where the stub has several ([part c] [part f]), else the stub's first."""
        parts = self.stub.get('parts') or ['?']
        letter = part if part in parts else parts[0]
        what, where = self.stub.get('what'), self.stub.get('file')
        if self.stub.get('in'):  # an if's stub, inside a function
            what += f" in {self.stub['in']}" + (f" ({where})" if where else '')
        elif where:
            what += f" in {where}"
        return f"needs part ({letter}) {what}, not written yet"


# --- The tests ----------------------------------------------------------------------------


class Test:
    def __init__(self, name, points, check, editions, probes, answers, hint):
        self.name, self.points, self.check = name, points, check
        self.editions, self.probes, self.answers, self.hint = editions, probes, answers, hint

    def reason(self, failure, edition=None):
        """A failure's line, and what to do where it does not say so itself: for a part not
        written yet, which (Unwritten.reason); for a missing output, the commands that write
        it; else what to check (the hint, for the edition's fields where it is a function)."""
        if isinstance(failure, Unwritten):
            return failure.reason(self.name[1])
        said = str(failure)
        hint = self.hint(edition) if callable(self.hint) else self.hint
        if said.endswith(' is missing'):
            said += f"; {RUN_IT}"
        elif hint and 'check ' not in said:
            said += f"; {hint}"
        return said


TESTS = []


def test(name, points, editions=tuple(EDITIONS), probes=(), answers=False, hint=None):
    """Registers check(g) as a test; `name` starts with the handout's part and may use the
    edition's fields ({variant}, {vanilla_dev}, ...). check raises Fail to fail; `hint`,
    in the handout's terms, says what to check (added to a failure that does not): a
    string, or a function of the edition's fields where it names the edition's settings."""

    def register(check):
        TESTS.append(Test(name, points, check, editions, probes, answers, hint))
        return check

    return register


RUN_IT = "the handout's commands write it (README: The handout's commands)"
ACCURACY = (
    "check the whole pipeline (parts c to g), trained at the handout's settings: `python "
    "grading/learning_check.py` tells in minutes whether it trains as a correct one does, "
    "and where not"
)
# What each edition's part g sets in GPTConfig and builds, and what of it has block_size
# positions (to be cut to T): the hints name the student's edition's alone.
VARIANT_PARTS = {
    'synthesizer': dict(
        config='synthesizer=True', model='model.GPT', positions='the causal mask, w2 and b2'
    ),
    'perceiver': dict(
        config="bottleneck_dim, new_model's argument",
        model='perceiver.PerceiverGPT',
        positions='the causal mask',
    ),
    'rope': dict(config='rope=True', model='model.GPT', positions='the causal mask, rope_cache'),
}
SPAN = (
    "check __getitem__ (part e): truncate to a random length from 4 to int(block_size*7/8) "
    "(at most the document's), mask a span a quarter of that length on average, build "
    "prefix MASK suffix MASK masked, pad with PAD to the padded length, x = string[:-1], "
    "y = string[1:]"
)


@test(
    "(c) the vanilla model: the handout's architecture",
    2,
    probes=['finetune'],
    hint=(
        "check new_model (part c): GPTConfig(vocab_size, block_size, n_layer=4, "
        "n_head=8, n_embd=256) and model.GPT"
    ),
)
def vanilla_architecture(g):
    check_architecture(g.probe('finetune')['shapes'], g.architecture('vanilla'), 'the model')


@test(
    "(c) finetuning without pretraining: the handout's Trainer settings",
    2,
    probes=['finetune'],
    hint=(
        "check finetune (part c): 75 epochs without --reading_params_path, batch 256, "
        "args.finetune_lr, lr_decay, warmup_tokens 512*20, final_tokens "
        "200*len(pretrain_dataset)*block_size"
    ),
)
def finetune_settings(g):
    check_settings(g.probe('finetune')['config'], g.settings(75, 256, 6e-4, 200))


@test("(c) vanilla.model.params loads into the handout's vanilla model", 1)
def vanilla_model_params(g):
    check_params(g, 'vanilla.model.params', 'vanilla')


@test(
    "(d) London baseline: london_baseline.py's accuracy",
    2,
    probes=['london'],
    hint=lambda edition: (
        "check london_baseline.py (part d): it predicts London for every question of "
        "birth_dev.tsv and prints the accuracy utils.evaluate_places gives"
        + (f" and writes it to {ACCURACY_FILE}" if edition['london_file'] else '')
    ),
)
def london_printed(g):
    if not any(
        (g.submission / p).is_file() for p in ('london_baseline.py', 'src/london_baseline.py')
    ):
        raise Fail("london_baseline.py is missing")
    accuracy = g.london_accuracy()
    written = g.probe('london')['written']
    if g.edition['london_file']:
        if written is None:
            raise Fail(f"london_baseline.py wrote no {ACCURACY_FILE}")
        if not has_number(written, [accuracy]):
            raise Fail(f"{ACCURACY_FILE} holds {written.strip()[:40]!r}, not {accuracy:g}")
    elif not printed_accuracy(g.log('london'), accuracy):
        raise Fail(f"london_baseline.py did not print the accuracy, {accuracy:g}%")


@test(
    f"(d) {ACCURACY_FILE} holds the London baseline's accuracy",
    1,
    editions=('2024', '2025'),
    hint=(
        "python london_baseline.py writes it (part d), and collect_submission.sh puts it in the zip"
    ),
)
def london_file(g):
    beside = f"src/{ACCURACY_FILE}"  # where london_baseline.py run from src/ leaves it
    found = [name for name in (ACCURACY_FILE, beside) if (g.submission / name).is_file()]
    if not found:
        raise Fail(f"{ACCURACY_FILE} is missing (neither beside src/ nor in it)")
    text = g.read(found[0])
    if not has_number(text, [g.london_accuracy()]):
        raise Fail(f"it holds {text.strip()[:40]!r}, not {g.london_accuracy():g}")


@test("(d) vanilla without pretraining: dev predictions, at least 1 right", 2)
def nopretrain_dev(g):
    check_accuracy(g, 'vanilla.nopretrain.dev.predictions', 'dev', minimum_right=1)


@test("(d) vanilla without pretraining: test predictions, one per question", 1)
def nopretrain_test_lines(g):
    g.predictions('vanilla.nopretrain.test.predictions', 'test')


@test("(d) vanilla without pretraining: test predictions, at least 1 right", 4, answers=True)
def nopretrain_test(g):
    check_accuracy(g, 'vanilla.nopretrain.test.predictions', 'test', minimum_right=1)


@test("(e) span corruption: the truncated length", 5, probes=['span'], hint=SPAN)
def span_truncation(g):
    examples = span_examples(g)
    cap = int(SPAN_BLOCK * 7 / 8)
    long = [e for e in examples if len(e.document) >= cap]
    for e in examples:
        if e.length is None:
            raise Fail(e.problem)
        low, high = min(4, len(e.document)), min(cap, len(e.document))
        if not low <= e.length <= high:
            raise Fail(
                f"a document of {len(e.document)} characters was truncated to {e.length}; "
                f"with block_size {SPAN_BLOCK} the length must be in {low}..{high}"
            )
    missing = sorted(set(range(4, cap + 1)) - {e.length for e in long})
    if missing:
        raise Fail(
            f"no truncation to {', '.join(map(str, missing[:5]))} characters in {len(long):,} "
            f"draws from documents of {cap} characters or more: every length from 4 to "
            f"int(block_size*7/8) = {cap} must be possible"
        )


@test(
    "(e) span corruption: prefix MASK suffix MASK masked, then PAD", 5, probes=['span'], hint=SPAN
)
def span_rearranged(g):
    for e in span_examples(g):
        if e.problem:
            raise Fail(e.problem)


@test(
    "(e) span corruption: y is x shifted by one",
    5,
    probes=['span'],
    hint=(
        "check __getitem__ (part e): x is the string without its last character, y "
        "without its first (x = string[:-1], y = string[1:]), so that y is what follows "
        "each character of x"
    ),
)
def span_shift(g):
    for e in span_examples(g):
        if e.x[1:] != e.y[:-1]:
            raise Fail(f"x[1:] != y[:-1] for x = {e.x.rstrip(e.pad)!r}, y = {e.y.rstrip(e.pad)!r}")


@test("(e) span corruption: the masked length", 5, probes=['span'], hint=SPAN)
def span_masked_length(g):
    drawn = span_examples(g)
    examples = [e for e in drawn if e.problem is None and e.length >= 8]
    if not examples:
        problems = [e.problem for e in drawn if e.problem]
        raise Fail(f"no example could be read: {problems[0] if problems else 'none drawn'}")
    masked = sum(len(e.masked) for e in examples) / len(examples)
    quarter = sum(e.length / 4 for e in examples) / len(examples)
    if abs(masked - quarter) > 1.5:
        raise Fail(
            f"masked spans average {masked:.2f} characters where a quarter of the truncated "
            f"length averages {quarter:.2f} (allowed: 1.5 apart)"
        )
    by_length = {}
    for e in examples:
        by_length.setdefault(e.length, []).append(len(e.masked) - e.length / 4)
    if not any(min(d) < 0 < max(d) for d in by_length.values() if len(d) >= 30):
        raise Fail(
            "for each truncated length, the masked length is always on the same side of a "
            "quarter of it: it must be random, sometimes more and sometimes less"
        )


SPAN_SAME_START = 0.6  # the most of span_position's pairs that may share a start


@test(
    "(e) span corruption: the masked span's place varies",
    2,
    probes=['span'],
    hint=(
        "check __getitem__ (part e): the handout chooses the span to mask at random in the "
        "truncated document, so its start must be drawn anew for each example (a random "
        "start from 0 to the truncated length minus the masked length, say), not the first "
        "character, the end or one offset every time"
    ),
)
def span_position(g):
    """Two draws of the same truncated and masked lengths (leaving 3 characters or more
    unmasked, so that even a start drawn from 1 to L - m - 1, which never leaves the prefix
    or the suffix empty, has 2 places) must not share their start too often. A start
    decided by the lengths shares it every time; a random one from the k places allowed, 1/k
    of the time: with 4,000 draws, over about 45,000 such pairs, ours and the textbook
    answer's (0..L-m) average 0.15 and the 1..L-m-1 reading 0.25, with standard deviations
    near 0.009 (200 seeds each: at most 0.28), so SPAN_SAME_START (0.6) is 35 of them above
    the highest; a submission whose start is random at all passes."""
    groups = {}
    for e in span_examples(g):
        if e.problem is None and e.length - len(e.masked) >= 3:
            groups.setdefault((e.length, len(e.masked)), []).append(e)
    pairs = sum(len(drawn) * (len(drawn) - 1) // 2 for drawn in groups.values())
    if not pairs:
        raise Fail("no two examples of the same truncated and masked lengths could be read")
    same = 0
    for drawn in groups.values():
        starts = [e.start for e in drawn]
        same += sum(starts.count(s) * (starts.count(s) - 1) // 2 for s in set(starts))
    if same / pairs <= SPAN_SAME_START:
        return
    examples = [e for drawn in groups.values() for e in drawn]
    if all(e.start == 0 for e in examples):
        where = "always starts at the truncated document's first character (no prefix)"
    elif all(e.start + len(e.masked) == e.length for e in examples):
        where = "always ends at the truncated document's last character (no suffix)"
    elif len({e.start for e in examples}) == 1:
        first = examples[0].start
        where = f"always starts after the truncated document's first {first} characters"
    else:
        where = "does not move over the truncated document"
    raise Fail(
        f"the masked span {where}: two draws of the same truncated and masked lengths put "
        f"it at the same place {same / pairs:.0%} of the time ({pairs:,} pairs; a random "
        f"place: about 15-25%; allowed: up to {SPAN_SAME_START:.0%})"
    )


@test("(e) span corruption: padded to the edition's length", 2, probes=['span'], hint=SPAN)
def span_padding(g):
    padded = SPAN_BLOCK + g.edition['extra_pad']
    for e in span_examples(g):
        if len(e.x) != padded - 1 or len(e.y) != padded - 1:
            rule = "block_size" if g.edition['extra_pad'] == 0 else "block_size + 1"
            raise Fail(
                f"x and y are {len(e.x)} and {len(e.y)} long: the string is padded to {rule} "
                f"({padded}), so each must be {padded - 1}"
            )


@test(
    "(e) span corruption: an example of every line of wiki.txt, as each epoch of pretraining "
    "builds",
    1,
    probes=['span_corpus'],
    hint=(
        "wiki.txt ends with a newline, so its last line is empty, and some lines are "
        "shorter than 4 characters: check that __getitem__ (part e) still gives an "
        "example for them (truncate to at most the document's length, mask at most what "
        "there is)"
    ),
)
def span_every_line(g):
    g.probe('span_corpus')


@test(
    "(f) pretraining: the handout's Trainer settings",
    7,
    probes=['pretrain'],
    hint=(
        "check pretrain (part f): 650 epochs, batch 128, args.pretrain_lr, lr_decay, "
        "warmup_tokens 512*20, final_tokens E*len(pretrain_dataset)*block_size with the "
        "edition's E"
    ),
)
def pretrain_settings(g):
    settings = g.settings(650, 128, 6e-3, g.edition['schedule'])
    check_settings(g.probe('pretrain')['config'], settings)


@test(
    "(f) finetuning from pretrained params: the handout's Trainer settings",
    4,
    probes=['finetune_pretrained'],
    hint="check finetune (part f): 10 epochs with --reading_params_path, otherwise as part c",
)
def finetune_pretrained_settings(g):
    check_settings(g.probe('finetune_pretrained')['config'], g.settings(10, 256, 6e-4, 200))


@test(
    "(f) finetuning from pretrained params starts from them",
    2,
    probes=['finetune_pretrained'],
    hint=(
        "check finetune (part f): load --reading_params_path into the model "
        "(load_state_dict) before the Trainer trains it"
    ),
)
def finetune_pretrained_loads(g):
    found = g.probe('finetune_pretrained')
    if found['loaded'] != found['given']:
        raise Fail(
            f"the model given to the Trainer holds {found['loaded']} of the "
            f"{found['given']} tensors of --reading_params_path"
        )


@test("(f) vanilla.finetune.params loads into the handout's vanilla model", 1)
def vanilla_finetune_params(g):
    check_params(g, 'vanilla.finetune.params', 'vanilla')


@test("(f) vanilla pretrained: dev accuracy at least {vanilla_dev}%", 5, hint=ACCURACY)
def vanilla_dev(g):
    check_accuracy(g, 'vanilla.pretrain.dev.predictions', 'dev', g.edition['vanilla_dev'])


@test("(f) vanilla pretrained: test predictions, one per question", 1)
def vanilla_test_lines(g):
    g.predictions('vanilla.pretrain.test.predictions', 'test')


@test(
    "(f) vanilla pretrained: test accuracy at least {vanilla_test}%", 8, answers=True, hint=ACCURACY
)
def vanilla_test(g):
    check_accuracy(g, 'vanilla.pretrain.test.predictions', 'test', g.edition['vanilla_test'])


@test(
    "(g) the {variant} model: the handout's architecture",
    2,
    probes=['variant'],
    hint=lambda edition: (
        "check new_model (part g): the {variant}'s setting in GPTConfig ({config}) and its "
        "model class, {model}".format(**edition, **VARIANT_PARTS[edition['variant']])
    ),
)
def variant_architecture(g):
    variant = g.edition['variant']
    check_architecture(g.probe('variant')['shapes'], g.architecture(variant), 'the model')


@test("(g) {variant}.finetune.params loads into the handout's {variant} model", 1)
def variant_params(g):
    check_params(g, f"{g.edition['variant']}.finetune.params", g.edition['variant'])


@test("(g) {variant} pretrained: dev accuracy at least {variant_dev}%", 5, hint=ACCURACY)
def variant_dev(g):
    name = f"{g.edition['variant']}.pretrain.dev.predictions"
    check_accuracy(g, name, 'dev', g.edition['variant_dev'])


@test("(g) {variant} pretrained: test predictions, one per question", 1)
def variant_test_lines(g):
    g.predictions(f"{g.edition['variant']}.pretrain.test.predictions", 'test')


@test(
    "(g) {variant} pretrained: test accuracy at least {variant_test}%",
    5,
    answers=True,
    hint=ACCURACY,
)
def variant_test(g):
    name = f"{g.edition['variant']}.pretrain.test.predictions"
    check_accuracy(g, name, 'test', g.edition['variant_test'])


@test(
    "(g) the {variant} model reads no later position, and training and evaluate compute what "
    "its forward does: on rows of several lengths (fp32, bf16), one character at a time",
    2,
    probes=['machinery'],
    hint=lambda edition: (
        "check the code you wrote (part g): what has block_size positions ({positions}) "
        "must be cut to the T positions of its input, which training and evaluate often "
        "make fewer than block_size".format(**VARIANT_PARTS[edition['variant']])
    ),
)
def variant_machinery(g):
    g.probe('machinery')


@test(
    "(g) SynthesizerAttention: eq. 11 with given weights",
    4,
    ('2021',),
    ['synthesizer'],
    hint=(
        "check SynthesizerAttention.forward (part g): per head ReLU(x A_i + b_1) B_i + "
        "b_2 with B_i (w2) and b_2 (b2) cut to the input's T, the causal mask before "
        "the softmax, then times (x V_i), the heads side by side, then proj"
    ),
)
def synthesizer_output(g):
    weights, inputs = synthesizer_case()
    expected = [synthesizer_attention(exact(weights), x.double(), n_head=3) for (x,) in inputs]
    check_outputs(g.probe('synthesizer'), expected, 'SynthesizerAttention', inputs)


@test(
    "(g) DownProjectBlock with given weights",
    3,
    ('2023',),
    ['down'],
    hint=(
        "check DownProjectBlock (part g): the basis C (bottleneck_dim x n_embd, "
        "repeated over the batch) attends to x_input with CausalCrossAttention, "
        "LayerNorm before attention and before the MLP, residuals around both"
    ),
)
def down_output(g):
    weights, inputs = perceiver_case('down')
    forms = {
        form: [down_block(exact(weights), x.double(), 2, *form) for (x,) in inputs]
        for form in PERCEIVER_FORMS
    }
    check_forms(g.probe('down'), forms, 'DownProjectBlock', inputs)


@test(
    "(g) UpProjectBlock with given weights",
    3,
    ('2023',),
    ['up'],
    hint=(
        "check UpProjectBlock (part g): x_input attends to y with CausalCrossAttention "
        "(the queries from x_input), LayerNorm before attention and before the MLP, "
        "residuals around both"
    ),
)
def up_output(g):
    weights, inputs = perceiver_case('up')
    forms = {
        form: [up_block(exact(weights), y.double(), x.double(), 2, *form) for y, x in inputs]
        for form in PERCEIVER_FORMS
    }
    check_forms(g.probe('up'), forms, 'UpProjectBlock', inputs)


@test(
    "(g) precompute_rotary_emb: cos and sin of t theta_i",
    2,
    ('2024', '2025'),
    ['rope_table'],
    hint=(
        "check precompute_rotary_emb (part g): theta_i = 10000^(-2(i-1)/d) for i = "
        "1..d/2, and a (max_positions, d/2, 2) tensor of cos(t theta_i), sin(t theta_i)"
    ),
)
def rope_table(g):
    expected = rotary_table(8, 12)
    check_outputs([g.probe('rope_table')], [expected], 'precompute_rotary_emb(8, 12)', None)


@test(
    "(g) apply_rotary_emb: rotates adjacent pairs",
    2,
    ('2024', '2025'),
    ['rope_apply'],
    hint=(
        "check apply_rotary_emb (part g): each adjacent pair (x_{2i-1}, x_{2i}) at "
        "position t rotated by t theta_i, with the first T rows of rope_cache"
    ),
)
def rope_apply(g):
    x, table = rope_apply_inputs()
    expected = rotate(x, table)
    check_outputs([g.probe('rope_apply')], [expected], 'apply_rotary_emb', [(x, table)])


@test(
    "(g) CausalSelfAttention with rope: q and k rotated",
    2,
    ('2024', '2025'),
    ['rope_attention'],
    hint=(
        "check CausalSelfAttention (part g): rope_cache registered as a buffer, q and k "
        "(not v) rotated by apply_rotary_emb after the heads are split"
    ),
)
def rope_attention_output(g):
    weights, inputs = rope_attention_case()
    expected = [rope_attention(exact(weights), x.double(), n_head=2) for (x,) in inputs]
    check_outputs(g.probe('rope_attention'), expected, 'CausalSelfAttention(rope)', inputs)


# --- What the tests compare with ----------------------------------------------------------


def check_architecture(found, expected, what):
    missing = [name for name in expected if name not in found]
    unexpected = [name for name in found if name not in expected]
    if missing or unexpected:
        words = []
        if missing:
            words.append(f"lacks {', '.join(missing[:3])}" + (' ...' if len(missing) > 3 else ''))
        if unexpected:
            words.append(
                f"has {', '.join(unexpected[:3])}" + (' ...' if len(unexpected) > 3 else '')
            )
        raise Fail(f"{what}'s state_dict {' and '.join(words)}")
    for name, shape in expected.items():
        if list(found[name]) != list(shape):
            raise Fail(f"{what}'s {name} has shape {list(found[name])}, not {list(shape)}")


def check_settings(found, expected):
    wrong = []
    for name, value in expected.items():
        got = found.get(name)
        same = got == value
        if isinstance(value, (int, float)) and isinstance(got, (int, float)):
            same = math.isclose(got, value, rel_tol=1e-9)
        if isinstance(value, (tuple, list)):
            same = isinstance(got, (tuple, list)) and list(got) == list(value)
        if not same:
            wrong.append(f"{name} is {got!r}, the handout says {value!r}")
    if wrong:
        raise Fail('; '.join(wrong))


def check_params(g, name, variant):
    path = g.path(name)
    try:
        state = torch.load(path, map_location='cpu', weights_only=True)
    except Exception as e:
        raise Fail(f"{name} cannot be read as a state_dict: {str(e).splitlines()[0][:120]}")
    if not isinstance(state, dict) or not all(torch.is_tensor(t) for t in state.values()):
        raise Fail(f"{name} holds no state_dict (a dict of named tensors)")
    shapes = {key: list(tensor.shape) for key, tensor in state.items()}
    check_architecture(shapes, g.architecture(variant), name)


def check_accuracy(g, name, split, floor=None, minimum_right=None):
    predictions = g.predictions(name, split)
    gold = g.gold(split)
    right = sum(p.strip() == a for p, a in zip(predictions, gold))
    accuracy = 100 * right / len(gold)
    if minimum_right is not None and right < minimum_right:
        raise Fail(f"{right} of {len(gold)} right; at least {minimum_right} expected")
    if floor is not None and accuracy < floor:
        raise Fail(f"{right} of {len(gold)} right, {accuracy:.1f}%: below {floor}%")


def check_forms(found, forms, what, inputs):
    """The perceiver's blocks: the handout leaves open whether attention's output is added
    to its query (C, or x_input) and whether ln1 also normalises the other input; any of
    the four forms passes (ours, Block's pre-LayerNorm form, is the first)."""
    errors = []
    for expected in forms.values():
        try:
            return check_outputs(found, expected, what, inputs)
        except Fail as e:
            errors.append(e)
    raise Fail(
        f"{errors[0]} in every form the handout allows (with or without the residual "
        f"around attention, ln1 on one input or both)"
    )


def check_outputs(found, expected, what, inputs, tolerance=1e-5):
    """Each output within `tolerance` of the direct computation's, relative to 1 + its size:
    the submission computes in float32, the direct computation in float64 from the same
    float32 values."""
    for i, (got, want) in enumerate(zip(found, expected)):
        shape = '' if inputs is None else f" for input shapes {input_shapes(inputs[i])}"
        if not torch.is_tensor(got):
            raise Fail(f"{what} returned a {type(got).__name__}, not a tensor{shape}")
        if list(got.shape) != list(want.shape):
            raise Fail(f"{what} gave shape {list(got.shape)}, not {list(want.shape)}{shape}")
        error = (got.double() - want).abs().max().item()
        if not ((got.double() - want).abs() <= tolerance * (1 + want.abs())).all():
            raise Fail(f"{what}'s output is off by up to {error:.3g}{shape}")


def input_shapes(args):
    return ', '.join(str(list(t.shape)) for t in args)


def printed_accuracy(text, accuracy):
    """Whether text gives the accuracy: as a percentage (a number before %), or a fraction."""
    percentages = re.findall(r'(\d+(?:\.\d+)?)\s*%', text)
    if any(math.isclose(float(p), accuracy, rel_tol=1e-6) for p in percentages):
        return True
    return has_number(text, [accuracy / 100])


def has_number(text, values):
    numbers = [float(n) for n in re.findall(r'-?\d+(?:\.\d+)?(?:[eE]-?\d+)?', text or '')]
    return any(math.isclose(n, v, rel_tol=1e-6, abs_tol=1e-9) for n in numbers for v in values)


class SpanExample:
    """One drawn example, read back: the document, and (when the string has the spec's
    form) the truncated length and the masked span; `problem` says what is wrong if not."""

    def __init__(self, document, x, y, pad, mask):
        self.document, self.x, self.y, self.pad = document, x, y, pad
        self.length, self.masked, self.start, self.problem = None, '', None, None
        whole = x + y[-1:]
        body = whole.rstrip(pad)
        if x[1:] != y[:-1] and y[1:] == x[:-1]:
            self.problem = (
                f"x and y are swapped: y is x shifted right by one, where y must be what "
                f"follows each character of x: x = {shown(y, pad)}, y = {shown(x, pad)} is "
                f"the handout's"
            )
        elif pad in body:
            self.problem = f"PAD inside the string, not only at its end: {shown(whole, pad)}"
        elif body.count(mask) != 2 and not (body.count(mask) == 3 and body.endswith(mask)):
            self.problem = f"{body.count(mask)} MASKs, not 2: {shown(whole, pad)}"
        else:  # a third MASK after the masked span is allowed, as the public grader does
            prefix, suffix, masked = body.split(mask)[:3]
            self.length, self.masked = len(prefix + masked + suffix), masked
            self.start = len(prefix)
            if not document.startswith(prefix + masked + suffix):
                self.problem = (
                    f"prefix + masked + suffix is not the start of the document: "
                    f"{shown(whole, pad)} from {document[:60]!r}"
                )


def shown(text, pad):
    return repr(text.rstrip(pad)[:70])


def span_documents():
    """The documents span corruption is drawn from: 100 longer than the truncation's cap,
    of random letters and spaces, and 6 short ones (4 to 34 characters: the spec says
    nothing of shorter ones)."""
    rng = random.Random(0)
    letters = string.ascii_letters + ' '
    long = [''.join(rng.choice(letters) for _ in range(rng.randint(60, 120))) for _ in range(100)]
    short = [''.join(rng.choice(letters) for _ in range(n)) for n in (4, 5, 8, 13, 21, 34)]
    return long + short


def span_examples(g):
    """The drawn examples. With 4,000 draws, about 3,670 of them from the long documents, each
    of the 40 lengths 4..43 turns up about 92 times when uniform: a length the submission
    draws with probability 1% is missing with probability below 40 e^-36. The masked
    length's mean over those draws has a standard deviation near 0.1 (at most 0.4), far
    inside the allowed 1.5; and for a truncated length drawn 30 times or more, a random
    masked length falls on both sides of a quarter of it except with a tiny probability.
    The masked span's place: span_position states its margin."""
    if g.span is None:
        found = g.probe('span')
        documents = span_documents()
        g.span = [
            SpanExample(documents[i], x, y, found['pad'], found['mask'])
            for i, x, y in found['examples']
        ]
    return g.span


def generator(seed):
    return torch.Generator().manual_seed(seed)


def weights_for(shapes, seed):
    """Random weights of the given shapes (masks lower-triangular ones)."""
    rng = generator(seed)
    state = {}
    for name, shape in shapes.items():
        if name.endswith('mask'):
            state[name] = torch.tril(torch.ones(shape[-1], shape[-1])).view(*shape)
        else:
            state[name] = torch.randn(*shape, generator=rng) * 0.5
    return state


def exact(weights):
    """The weights in float64, for the direct computations."""
    return {name: tensor.double() for name, tensor in weights.items()}


def linear_shapes(prefix, n_in, n_out):
    return {f"{prefix}.weight": [n_out, n_in], f"{prefix}.bias": [n_out]}


def synthesizer_case():
    """SynthesizerAttention(n_head 3, n_embd 6, block_size 8) weights, and inputs with T
    of 5 (w2 and b2 cut to T) and 7 (all of them)."""
    shapes = {**linear_shapes('w1', 6, 6), 'w2': [2, 7], 'b2': [7]}
    shapes.update({**linear_shapes('value', 6, 6), **linear_shapes('proj', 6, 6)})
    shapes['mask'] = [1, 1, 8, 8]
    rng = generator(2)
    inputs = [(torch.randn(11, T, 6, generator=rng),) for T in (5, 7)]
    return weights_for(shapes, 1), inputs


def perceiver_case(block):
    """DownProjectBlock or UpProjectBlock weights (n_head 2, n_embd 6, block_size 8,
    bottleneck_dim 4) and inputs: x (3, 8, 6); for the up block also y (3, 4, 6)."""
    shapes = {}
    if block == 'down':
        shapes['C'] = [1, 4, 6]
    for part in ('key', 'query', 'value', 'proj'):
        shapes.update(linear_shapes(f"attn.{part}", 6, 6))
    shapes['attn.mask'] = [1, 1, 8, 8]
    for norm in ('ln1', 'ln2'):
        shapes.update({f"{norm}.weight": [6], f"{norm}.bias": [6]})
    shapes.update({**linear_shapes('mlp.0', 6, 24), **linear_shapes('mlp.2', 24, 6)})
    rng = generator(4)
    x, y = torch.randn(3, 8, 6, generator=rng), torch.randn(3, 4, 6, generator=rng)
    return weights_for(shapes, 3), [(x,)] if block == 'down' else [(y, x)]


def rope_apply_inputs():
    """x (2, 3, 10, 8) for apply_rotary_emb, and a table for 12 positions."""
    return torch.randn(2, 3, 10, 8, generator=generator(5)), rotary_table(8, 12)


def rope_attention_case():
    """CausalSelfAttention with rope (n_head 2, n_embd 16, block_size 8): weights, the right
    rope_cache, and x (3, 6, 16)."""
    shapes = {}
    for part in ('key', 'query', 'value', 'proj'):
        shapes.update(linear_shapes(part, 16, 16))
    shapes['mask'] = [1, 1, 8, 8]
    weights = weights_for(shapes, 6)
    weights['rope_cache'] = rotary_table(8, 8)
    return weights, [(torch.randn(3, 6, 16, generator=generator(7)),)]


def linear(x, weights, prefix):
    return x @ weights[f"{prefix}.weight"].T + weights[f"{prefix}.bias"]


def heads(x, n_head):
    B, T, C = x.shape
    return x.view(B, T, n_head, C // n_head).transpose(1, 2)  # (B, nh, T, hs)


def causal_softmax(scores):
    """softmax over keys j <= i of each query i (scores (..., Tq, Tk))."""
    Tq, Tk = scores.shape[-2:]
    above = torch.ones(Tq, Tk, dtype=torch.bool).triu(1)
    return scores.masked_fill(above, float('-inf')).softmax(-1)


def merged(y):
    B, nh, T, hs = y.shape
    return y.transpose(1, 2).reshape(B, T, nh * hs)


def synthesizer_attention(w, x, n_head):
    """Handout eq. 11 per head i: softmax(ReLU(X A_i + b_1) B + b_2) (X V_i), B and b_2 cut
    to the T positions and shared by the heads; the heads side by side, then proj."""
    T = x.shape[1]
    a = heads(F.relu(linear(x, w, 'w1')), n_head)  # (B, nh, T, hs)
    scores = a @ w['w2'][:, :T] + w['b2'][:T]  # (B, nh, T, T)
    y = causal_softmax(scores) @ heads(linear(x, w, 'value'), n_head)
    return linear(merged(y), w, 'proj')


def cross_attention(w, prefix, x_kv, x_q, n_head):
    """softmax((x_q Q_i)(x_kv K_i)^T / sqrt(hs)) (x_kv V_i), query i seeing keys 0..i."""
    q = heads(linear(x_q, w, f"{prefix}.query"), n_head)
    k = heads(linear(x_kv, w, f"{prefix}.key"), n_head)
    v = heads(linear(x_kv, w, f"{prefix}.value"), n_head)
    y = causal_softmax(q @ k.transpose(-2, -1) / math.sqrt(k.shape[-1])) @ v
    return linear(merged(y), w, f"{prefix}.proj")


def layer_norm(x, w, prefix):
    return F.layer_norm(x, x.shape[-1:], w[f"{prefix}.weight"], w[f"{prefix}.bias"])


def mlp(x, w):
    return linear(F.gelu(linear(x, w, 'mlp.0')), w, 'mlp.2')


# (residual around attention, ln1 on both inputs): ours first
PERCEIVER_FORMS = [(True, False), (False, False), (True, True), (False, True)]


def down_block(w, x, n_head, residual=True, norm_both=False):
    """y = C + attn(kv=x, q=ln1(C)), then y + mlp(ln2(y)); without the residual
    y = attn(...); with norm_both kv = ln1(x)."""
    basis = w['C'].expand(x.shape[0], -1, -1)
    kv = layer_norm(x, w, 'ln1') if norm_both else x
    y = cross_attention(w, 'attn', kv, layer_norm(basis, w, 'ln1'), n_head)
    y = basis + y if residual else y
    return y + mlp(layer_norm(y, w, 'ln2'), w)


def up_block(w, y, x, n_head, residual=True, norm_both=False):
    """out = x + attn(kv=ln1(y), q=x), then out + mlp(ln2(out)); without the residual
    out = attn(...); with norm_both q = ln1(x)."""
    q = layer_norm(x, w, 'ln1') if norm_both else x
    out = cross_attention(w, 'attn', layer_norm(y, w, 'ln1'), q, n_head)
    out = x + out if residual else out
    return out + mlp(layer_norm(out, w, 'ln2'), w)


def rotary_table(dim, positions):
    """(positions, dim/2, 2): cos and sin of t theta_i, theta_i = 10000^(-2(i-1)/dim)."""
    i = torch.arange(1, dim // 2 + 1, dtype=torch.float64)
    theta = 10000.0 ** (-2 * (i - 1) / dim)
    angles = torch.arange(positions, dtype=torch.float64)[:, None] * theta
    return torch.stack((angles.cos(), angles.sin()), dim=-1).float()


def rotate(x, table):
    """(x_{2i-1} + i x_{2i}) e^{i t theta_i} for each adjacent pair, t = 0..T-1."""
    T = x.shape[-2]
    pairs = torch.view_as_complex(x.double().reshape(*x.shape[:-1], -1, 2).contiguous())
    turns = torch.view_as_complex(table[:T].double().contiguous())  # (T, hs/2)
    return torch.view_as_real(pairs * turns).flatten(-2)


def rope_attention(w, x, n_head):
    q = rotate(heads(linear(x, w, 'query'), n_head), w['rope_cache'])
    k = rotate(heads(linear(x, w, 'key'), n_head), w['rope_cache'])
    v = heads(linear(x, w, 'value'), n_head)
    y = causal_softmax(q @ k.transpose(-2, -1) / math.sqrt(k.shape[-1])) @ v
    return linear(merged(y), w, 'proj')


# --- The probes: what each runs of the submission ------------------------------------------


def probe_arguments(g, key):
    """(probe name, arguments, files to put in its folder) of a probe of g's submission."""
    edition, variant = g.edition, g.edition['variant']
    flags = ['--edition', g.edition_name] if g.takes_edition else []
    writing = ['--writing_params_path', f"{key}.params"]
    finetune = ['--finetune_corpus_path', 'birth_places_train.tsv']
    if key == 'finetune':
        return 'command', dict(
            argv=['finetune', 'vanilla', 'wiki.txt'] + writing + finetune + flags
        )
    if key == 'pretrain':
        return 'command', dict(argv=['pretrain', 'vanilla', 'wiki.txt'] + writing + flags)
    if key == 'finetune_pretrained':
        argv = ['finetune', 'vanilla', 'wiki.txt', '--reading_params_path', 'pretrained.params']
        argv += writing + finetune + flags
        return 'command', dict(argv=argv, reading_params='pretrained.params')
    if key == 'variant':
        argv = ['finetune', variant, 'wiki.txt'] + writing + finetune + edition['flags'] + flags
        return 'command', dict(argv=argv)
    if key == 'span':
        padded = SPAN_BLOCK + edition['extra_pad']
        text = '\n'.join(span_documents())
        return 'span', dict(
            text=text, block_size=SPAN_BLOCK, padded_length=padded, draws=SPAN_DRAWS,
            seed=SPAN_SEED,
        )  # fmt: skip
    if key == 'span_corpus':
        return 'span_corpus', dict(
            block_size=BLOCK_SIZE, padded_length=BLOCK_SIZE + edition['extra_pad']
        )
    if key == 'synthesizer':
        weights, inputs = synthesizer_case()
        config = dict(vocab_size=10, block_size=8, n_layer=1, n_head=3, n_embd=6)
        return 'module', dict(
            modules=['attention'], name='SynthesizerAttention', config=config, state=weights,
            inputs=inputs,
        )  # fmt: skip
    if key in ('down', 'up'):
        weights, inputs = perceiver_case(key)
        config = dict(vocab_size=10, block_size=8, n_layer=4, n_head=2, n_embd=6,
                      bottleneck_dim=4, perceiver=True)  # fmt: skip
        name = 'DownProjectBlock' if key == 'down' else 'UpProjectBlock'
        return 'module', dict(
            modules=['perceiver', 'model', 'models'],
            name=name,
            config=config,
            state=weights,
            inputs=inputs,
        )
    if key == 'rope_table':
        return 'function', dict(module_name='attention', name='precompute_rotary_emb', args=(8, 12))
    if key == 'rope_apply':
        args = rope_apply_inputs()
        return 'function', dict(module_name='attention', name='apply_rotary_emb', args=args)
    if key == 'rope_attention':
        weights, inputs = rope_attention_case()
        config = dict(vocab_size=10, block_size=8, n_layer=1, n_head=2, n_embd=16, rope=True)
        # precompute_rotary_emb stands in as the right table: this test is the wiring's
        stand_ins = {'precompute_rotary_emb': weights['rope_cache']}
        return 'module', dict(
            modules=['attention'], name='CausalSelfAttention', config=config, state=weights,
            inputs=inputs, stand_ins=stand_ins,
        )  # fmt: skip
    if key == 'machinery':
        return 'machinery', dict(variant=variant)
    if key == 'london':
        return 'london', dict(accuracy_file=ACCURACY_FILE)
    raise KeyError(key)


def start_method():
    """A fresh process per probe: on Linux forked from a server that has torch loaded
    already, elsewhere started from scratch (a few seconds more each)."""
    if sys.platform.startswith('linux'):  # macOS forks badly once system frameworks load
        context = multiprocessing.get_context('forkserver')
        # what every probe loads, once: creating an optimizer imports torch._dynamo (1.5 s)
        context.set_forkserver_preload(['torch', 'torch._dynamo', 'numpy', 'probes'])
        return context
    return multiprocessing.get_context('spawn')


CONTEXT = start_method()


def run_probe(folder, name, arguments, timeout):
    """Runs one probe in a process of its own: {'ok': result} or {'error': reason}."""
    inputs, log, result = folder / 'probe.inputs', folder / 'probe.log', folder / 'probe.result'
    torch.save(arguments, inputs)
    process = CONTEXT.Process(
        target=probes.run_probe, args=(name, str(folder), str(inputs), str(log), str(result))
    )
    process.start()
    process.join(timeout)
    if process.is_alive():
        process.kill()
        process.join()
        return {'error': f"timed out after {timeout:g} s"}
    if not result.exists():
        tail = last_line(log)
        return {
            'error': f"the process ended without a result (exit code {process.exitcode})"
            + (f": {tail}" if tail else '')
        }
    try:
        outcome = torch.load(result, weights_only=True)
    except Exception as e:
        return {'error': f"its result cannot be read: {str(e).splitlines()[0][:120]}"}
    if outcome.get('error', '').endswith('printed:'):
        outcome['error'] += ' ' + (last_line(log) or 'nothing')
    return outcome


def tail(path, size=65536):
    """The end of a text file (a submission may print without end)."""
    try:
        with open(path, 'rb') as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - size))
            return f.read().decode('utf-8', errors='replace')
    except OSError:
        return ''


def last_line(path):
    lines = [line.strip() for line in tail(path).split('\n')]
    lines = [line for line in lines if line]
    return lines[-1][:200] if lines else ''


# --- Grading a submission -----------------------------------------------------------------


class Grading:
    """One submission being graded: its files, the edition, the data, the probes' results."""

    def __init__(self, submission, edition_name, data, answers, work, timeout):
        self.submission, self.edition_name = submission, edition_name
        self.edition = EDITIONS[edition_name]
        self.data, self.answers, self.work, self.timeout = data, answers, work, timeout
        self.results, self.span = {}, None
        run_py = submission / 'src' / 'run.py'
        text = run_py.read_text(errors='replace') if run_py.exists() else ''
        self.takes_edition = "'--edition'" in text or '"--edition"' in text
        corpus = (data / 'wiki.txt').read_text(encoding='utf-8')
        self.vocab_size, self.corpus_lines = len(set(corpus)) + 2, len(corpus.split('\n'))

    def path(self, name):
        path = self.submission / name
        if not path.is_file():
            raise Fail(f"{name} is missing")
        return path

    def read(self, name):
        return self.path(name).read_text(encoding='utf-8', errors='replace')

    def probe(self, key):
        outcome = self.results[key]
        if outcome.get('unwritten'):
            raise Unwritten(outcome['error'], outcome['unwritten'])
        if 'error' in outcome:
            raise Fail(outcome['error'])
        return outcome['ok']

    def log(self, key):
        return tail(self.work / key / 'probe.log')

    def architecture(self, variant):
        shapes = json.loads(ARCHITECTURES.read_text())[variant]
        return {
            name: [self.vocab_size if d == 'vocab' else d for d in shape]
            for name, shape in shapes.items()
        }

    def settings(self, epochs, batch, lr, schedule_epochs):
        return dict(
            max_epochs=epochs, batch_size=batch, learning_rate=lr, betas=[0.9, 0.95],
            grad_norm_clip=1.0, weight_decay=0.1, lr_decay=True, warmup_tokens=512 * 20,
            final_tokens=schedule_epochs * self.corpus_lines * BLOCK_SIZE, ckpt_path=None,
        )  # fmt: skip

    def gold(self, split):
        if split == 'dev':
            lines = read_lines(self.data / 'birth_dev.tsv')
        else:
            lines = self.answers
        return [line.split('\t')[1].strip() for line in lines]

    def predictions(self, name, split):
        """The prediction file's lines, one per question of the split's file."""
        questions = read_lines(
            self.data / ('birth_dev.tsv' if split == 'dev' else 'birth_test_inputs.tsv')
        )
        lines = read_lines(self.path(name))
        if len(lines) != len(questions):
            raise Fail(f"{name} has {len(lines)} lines for {len(questions)} questions")
        return lines

    def london_accuracy(self):
        gold = self.gold('dev')
        return 100 * sum(place == 'London' for place in gold) / len(gold)

    def run_probes(self, keys, jobs):
        def one(key):
            folder = self.work / key
            prepare_folder(folder, self.submission, self.data)
            if key == 'finetune_pretrained':
                state = weights_for(self.architecture('vanilla'), 8)
                torch.save(state, folder / 'pretrained.params')
            name, arguments = probe_arguments(self, key)
            return key, run_probe(folder, name, arguments, self.timeout)

        with ThreadPoolExecutor(max_workers=jobs) as pool:
            self.results.update(pool.map(one, keys))


def read_lines(path):
    """The lines of a text file, without line ends, the empty one after a final newline
    dropped (as files.read_lines does)."""
    lines = Path(path).read_text(encoding='utf-8', errors='replace').split('\n')
    if lines and lines[-1] == '':
        lines.pop()
    return [line.rstrip('\r') for line in lines]


def prepare_folder(folder, submission, data):
    """A probe's folder: copies of the submission's src/ and london_baseline.py, and the data."""
    folder.mkdir(parents=True)
    outputs = ('__pycache__', '*.pyc', '*.params', '*.resume', '*.predictions', 'expt', '*.zip')
    shutil.copytree(submission / 'src', folder / 'src', ignore=shutil.ignore_patterns(*outputs))
    if (submission / 'london_baseline.py').is_file():
        shutil.copy(submission / 'london_baseline.py', folder)
    for name in DATA_FILES:
        shutil.copy(data / name, folder)


def tests_for(edition_name, answers):
    """The edition's tests, named for it."""
    edition = EDITIONS[edition_name]
    chosen = []
    for t in TESTS:
        if edition_name in t.editions and (answers or not t.answers):
            chosen.append((t.name.format(**edition), t))
    return chosen


def grade(submission, edition_name, data, answers=None, timeout=60, jobs=None, only=None):
    """Grades one submission folder: [(test name, score, max score, reason or None)].
    `only`: the names of the tests to run (all by default)."""
    jobs = jobs or max(1, min(4, os.cpu_count() or 1))
    chosen = [
        (n, t) for n, t in tests_for(edition_name, answers is not None) if not only or n in only
    ]
    if not (Path(submission) / 'src' / 'machinery').is_dir():
        # made from the course's own starter: its parts train in its own code, not through
        # our packed step and decoder, so what those would do is not the submission's to pass
        chosen = [(n, t) for n, t in chosen if 'machinery' not in t.probes]
    with tempfile.TemporaryDirectory(prefix='grading-') as work:
        g = Grading(submission, edition_name, data, answers, Path(work), timeout)
        keys = sorted({key for _, t in chosen for key in t.probes})
        g.run_probes(keys, jobs)
        rows = []
        for name, t in chosen:
            try:
                t.check(g)
                rows.append((name, t.points, t.points, None))
            except Fail as e:
                rows.append((name, 0, t.points, t.reason(e, g.edition)))
            except Exception as e:  # what the grader did not foresee fails one test, not all
                rows.append((name, 0, t.points, f"grader error: {type(e).__name__}: {e}"))
    return rows


# --- The command line ----------------------------------------------------------------------


class UserError(Exception):
    """Bad input: one line, exit status 2."""


def unpacked(path, into):
    """The folder holding src/ in the submission `path` (a folder, or a zip unpacked into
    `into`)."""
    if path.is_file() and zipfile.is_zipfile(path):
        target = into / f"{len(list(into.iterdir()))}"
        with zipfile.ZipFile(path) as z:
            z.extractall(target)  # zipfile drops absolute paths and '..' from the names
        path = target
    elif not path.is_dir():
        raise UserError(f"{path}: neither a folder nor a zip file")
    if (path / 'src').is_dir():
        return path
    inner = [p for p in path.iterdir() if (p / 'src').is_dir()]
    if len(inner) == 1:
        return inner[0]
    raise UserError(f"{path}: no src/ folder in it (a submission holds src/ and the outputs)")


def guess_edition(path, submission):
    """The starter's edition (run.py's DEFAULT_EDITION), else the second variant's whose
    files are there, else 2021 (2024 for the 2024 zip's name)."""
    run_py = submission / 'src' / 'run.py'
    text = run_py.read_text(errors='replace') if run_py.is_file() else ''
    named = re.search(r"^DEFAULT_EDITION = '(\d{4})'", text, re.M)
    if named and named.group(1) in EDITIONS:
        return named.group(1)
    for edition_name in ('2021', '2023', '2024'):
        variant = EDITIONS[edition_name]['variant']
        if any(submission.glob(f"{variant}.*")):
            return edition_name
    return '2024' if path.name == 'assignment4_submission.zip' else '2021'


def check_data(data):
    """Refuses a --data folder that lacks one of the assignment's data files."""
    for name in DATA_FILES:
        if not (data / name).is_file():
            raise UserError(f"--data {data}: {name} is missing ({FETCH_DATA})")


def read_answers(path, data):
    if path is None:
        return None
    if not path.is_file():
        raise UserError(f"--answers {path}: no such file")
    lines = read_lines(path)
    questions = read_lines(data / 'birth_test_inputs.tsv')
    if len(lines) != len(questions):
        raise UserError(
            f"--answers {path}: {len(lines)} lines, but birth_test_inputs.tsv has {len(questions)}"
        )
    for number, line in enumerate(lines, start=1):
        if len(line.split('\t')) != 2:
            raise UserError(f"--answers {path}, line {number}: not 'question<TAB>place'")
    return lines


def table(rows, title, seconds):
    out = io.StringIO()
    print(title, file=out)
    for name, score, points, reason in rows:
        print(f"  {score:>2}/{points:<2}  {name}", file=out)
        if reason:
            print(f"          {reason}", file=out)
    score = sum(r[1] for r in rows)
    points = sum(r[2] for r in rows)
    print(f"  total {score}/{points}  ({seconds:.1f} s)", file=out)
    return out.getvalue()


def results_json(rows, after_published=(), seconds=None):
    """Gradescope's results.json: the tests named in `after_published` (the test-set
    floors) are shown once the grades are published; `seconds`, the grading's time."""
    results = {
        'score': sum(r[1] for r in rows),
        'tests': [
            dict(
                name=name, score=score, max_score=points,
                status='passed' if reason is None else 'failed',
                output=reason or 'passed',
                visibility='after_published' if name in after_published else 'visible',
            )
            for name, score, points, reason in rows
        ],
    }  # fmt: skip
    if seconds is not None:
        results['execution_time'] = round(seconds)
    return results


def parse_args(argv):
    argp = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    argp.add_argument('submissions', nargs='+', type=Path, help="folders or zip files")
    argp.add_argument('--edition', choices=sorted(EDITIONS), help="default: told from the files")
    argp.add_argument('--data', type=Path, default=ROOT / 'data', help="the data files' folder")
    argp.add_argument('--answers', type=Path, help="birth_test_inputs.tsv with the places")
    argp.add_argument('--json', type=Path, help="write Gradescope's results.json here")
    argp.add_argument('--csv', type=Path, help="write a row per submission here")
    argp.add_argument('--timeout', type=float, default=60, help="seconds per probe (60)")
    argp.add_argument('--jobs', type=int, help="probes run at once (default: up to 4)")
    argp.add_argument(
        '--learning_check',
        action='store_true',
        help="also run learning_check.py's few minutes of training (a row of no points)",
    )
    return argp.parse_args(argv)


def learning_row(submission, edition_name, data):
    """learning_check.py's training stages on the submission, as a row of no points (the
    grader's checks it starts from are the table's own)."""
    import learning_check

    variant = EDITIONS[edition_name]['variant']
    with tempfile.TemporaryDirectory(prefix='learning-') as work:
        report, learns = learning_check.check(submission, edition_name, 0, Path(work), data=data)
    trains = "trains as a correct one does"
    name = f"learning check (optional, no points): the {variant} model {trains}"
    return name, 0, 0, None if learns else ' '.join(line.strip() for line in report)


def main(argv=None):
    args = parse_args(argv)
    try:
        check_data(args.data)
        if args.json and len(args.submissions) > 1:
            raise UserError(
                "--json takes one submission (results.json is Gradescope's, per student)"
            )
        answers = read_answers(args.answers, args.data)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    graded, status = [], 0
    with tempfile.TemporaryDirectory(prefix='submissions-') as unpack:
        for path in args.submissions:
            try:
                submission = unpacked(path, Path(unpack))
            except UserError as e:  # one unreadable submission; the others are still graded
                print(f"error: {e}", file=sys.stderr)
                graded.append((path, None, [], str(e)))
                status = 2
                continue
            edition = args.edition or guess_edition(path, submission)
            start = time.perf_counter()
            rows = grade(submission, edition, args.data, answers, args.timeout, args.jobs)
            if args.learning_check:
                rows.append(learning_row(submission, edition, args.data))
            seconds = time.perf_counter() - start
            guessed = '' if args.edition else ', told from its files; --edition to choose'
            print(table(rows, f"{path} ({edition} edition{guessed})", seconds))
            graded.append((path, edition, rows, ''))
    if args.json and graded[0][2]:
        args.json.write_text(json.dumps(results_json(graded[0][2]), indent=2) + '\n')
    if args.csv:
        write_csv(args.csv, graded)
    return status


def write_csv(path, graded):
    """A row per submission: its edition, score and each test's points (the columns are
    every test any of them had), or why it could not be read."""
    names = list(dict.fromkeys(row[0] for _, _, rows, _ in graded for row in rows))
    with open(path, 'w', newline='', encoding='utf-8') as f:
        writer = csv.writer(f)
        writer.writerow(['submission', 'edition', 'score', 'max_score', 'note'] + names)
        for submission, edition, rows, note in graded:
            scores = {r[0]: r[1] for r in rows}
            total, points = sum(r[1] for r in rows), sum(r[2] for r in rows)
            cells = [scores.get(n, '') for n in names]
            writer.writerow([str(submission), edition or '', total, points, note] + cells)


if __name__ == '__main__':
    sys.exit(main())
