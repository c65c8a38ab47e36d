"""The starter (grading/starter.py) and the local autograder (grading/grade.py): our code
gets full marks in every edition and the starter none; each classic student mistake,
planted in a copy of our code, loses exactly the tests it should; a hang, a crash or a
syntax error fails its tests with a one-line reason and the grading goes on."""

import csv
import hashlib
import json
import math
import re
import shutil
import sys
import time
import zipfile

import pytest
import torch

import run
from conftest import NO_DATA, ROOT

sys.path.insert(0, str(ROOT / 'grading'))
import editions  # noqa: E402
import grade  # noqa: E402
import marking  # noqa: E402
import probe_runner  # noqa: E402
import sandbox  # noqa: E402
import starter  # noqa: E402
import suite  # noqa: E402

EDITIONS = ['2021', '2023', '2024']
SECOND = {'2021': 'synthesizer', '2023': 'perceiver', '2024': 'rope'}


def make_submission(folder, source=ROOT):
    """A submission as collect_submission.sh packs it, for every edition at once: src/,
    london_baseline.py, untrained params of the handout's models, the published
    predictions and the London baseline's accuracy file."""
    shutil.copytree(source / 'src', folder / 'src', ignore=shutil.ignore_patterns('__pycache__'))
    shutil.copy(source / 'london_baseline.py', folder)
    vocab = len(set((ROOT / 'data' / 'wiki.txt').read_text(encoding='utf-8'))) + 2
    for name, variant in [('vanilla.model', 'vanilla'), ('vanilla.finetune', 'vanilla')] + [
        (f"{v}.finetune", v) for v in SECOND.values()
    ]:
        gpt = run.new_model(variant, vocab, 64 if variant == 'perceiver' else 32)
        torch.save(gpt.state_dict(), folder / f"{name}.params")
    for path in (ROOT / 'results').glob('*.predictions'):
        shutil.copy(path, folder)
    (folder / editions.ACCURACY_FILE).write_text('5.0\n')
    return folder


@pytest.fixture(scope='module')
def ours(tmp_path_factory):
    if not (ROOT / 'data' / 'wiki.txt').exists():
        pytest.skip(NO_DATA)
    return make_submission(tmp_path_factory.mktemp('ours'))


@pytest.fixture(scope='module')
def our_grades(ours):
    return {e: marking.grade(ours, e, ROOT / 'data') for e in EDITIONS}


def snapshot(folder):
    return {
        p.relative_to(folder).as_posix(): hashlib.md5(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob('*'))
        if p.is_file()
    }


@pytest.mark.parametrize('edition', EDITIONS)
def test_our_code_gets_full_marks(ours, our_grades, edition):
    rows = our_grades[edition]
    assert [(name, reason) for name, score, points, reason in rows if score < points] == []
    names = [name for name, *_ in rows]
    assert any(name.startswith(f"(g) the {SECOND[edition]} model") for name in names)
    assert all(name[:4] in ('(c) ', '(d) ', '(e) ', '(f) ', '(g) ') for name in names)


def test_grading_writes_nothing_into_the_submission(ours):
    before = snapshot(ours)
    marking.grade(
        ours, '2021', ROOT / 'data', only={'(d) London baseline: london_baseline.py\'s accuracy'}
    )
    assert snapshot(ours) == before


@pytest.mark.parametrize('edition', EDITIONS)
def test_the_starter_gets_no_marks(tmp_path, edition):
    if not (ROOT / 'data' / 'wiki.txt').exists():
        pytest.skip(NO_DATA)
    starter.write_starter(edition, tmp_path)
    rows = marking.grade(tmp_path, edition, ROOT / 'data')
    assert sum(score for _, score, _, _ in rows) == 0
    reasons = {name: reason for name, _, _, reason in rows}
    code = [n for n, t in marking.tests_for(edition, False) if t.probes]
    for name in code:  # each fails at a stub, which it names (tests/test_messages.py)
        assert re.fullmatch(r"needs part \([a-g]\) .+, not written yet", reasons[name]), (
            name,
            reasons[name],
        )
    for name in set(reasons) - set(code):  # the handout's outputs are not made yet
        reason = reasons[name]  # and what writes it
        assert re.search(r" is missing( \(.*\))?; .*writes? it", reason), (name, reason)
    assert "DEFAULT_EDITION = '%s'" % edition in (tmp_path / 'src' / 'run.py').read_text()
    assert f'edition="${{1:-{edition}}}"' in (tmp_path / 'collect_submission.sh').read_text()
    readme = (tmp_path / 'README.md').read_text()
    assert f"python grading/grade.py . --edition {edition}" in readme
    assert 'src/dataset.py: [part e] write CharCorruptionDataset.__getitem__' in readme
    assert not (tmp_path / 'tests').exists() and not (tmp_path / 'grading' / 'starter.py').exists()
    # the quickstart's commands: each run.py line parses, and the second variant's phases
    # pass its handout's flags
    commands = [line.split()[2:] for line in readme.split('\n') if 'python src/run.py' in line]
    assert len(commands) == 1 + 3 + 2 * 4
    for argv in commands:
        run.parse_args(argv)
    variant = [a for a in commands if a[1] not in ('vanilla',)]
    assert len(variant) == 4 and all(a[1] == SECOND[edition] for a in variant)
    assert all(('--bottleneck_dim' in a) == (edition == '2023') for a in variant)
    assert f"bash collect_submission.sh {edition}" in readme


# what each edition's starter stubs: (file, the stub's first words)
STUBS = {
    '2021': {
        ('src/dataset.py', '[part e] write CharCorruptionDataset.__getitem__'),
        ('src/run.py', '[part f] write pretrain'),
        ('src/run.py', '[part c] [part f] write finetune'),
        ('src/run.py', '[part c] [part g] write new_model'),
        ('src/attention.py', '[part g] write SynthesizerAttention.forward'),
        ('london_baseline.py', '[part d] write london_baseline'),
    },
    '2023': {
        ('src/perceiver.py', '[part g] write DownProjectBlock.__init__'),
        ('src/perceiver.py', '[part g] write DownProjectBlock.forward'),
        ('src/perceiver.py', '[part g] write UpProjectBlock.__init__'),
        ('src/perceiver.py', '[part g] write UpProjectBlock.forward'),
    },
    '2024': {
        ('src/attention.py', '[part g] write precompute_rotary_emb'),
        ('src/attention.py', '[part g] write apply_rotary_emb'),
        ('src/attention.py', '[part g] the buffer rope_cache'),
        ('src/attention.py', '[part g] rotate q and k'),
    },
}


@pytest.mark.parametrize('edition', EDITIONS)
def test_each_edition_stubs_its_parts_and_a_completed_starter_is_our_code(edition):
    """The starter differs from our code in the marked bodies only: put back, they give
    our files (the edition's default aside), so a completed starter trains through the
    code put into those bodies."""
    common = {s for s in STUBS['2021'] if 'Synthesizer' not in s[1]}
    expected = common | (STUBS['2021'] - common if edition == '2021' else STUBS[edition])
    found = set()
    for relative, text in starter.starter_files(edition).items():
        if text is None:
            continue
        ours = (ROOT / relative).read_text(encoding='utf-8')
        for line in text.split('\n'):
            if starter.STUB in line:
                found.add((relative, line.strip()[len(starter.STUB) :]))
        if relative.endswith('.py'):
            ours = starter.for_edition(ours, edition)
        regions = starter.stubs(ours, edition) if relative.endswith('.py') else []
        originals = [ours.split('\n')[first - 1 : last] for first, last, _ in regions]
        completed, lines = [], iter(originals)
        for line in text.split('\n'):
            if line.strip().startswith('# TODO [part') or starter.STUB in line:
                completed.extend(next(lines))
            else:
                completed.append(line)
        for old, new in starter.replacements(relative, edition):
            ours = ours.replace(old, new)
        assert '\n'.join(completed) == ours, relative
    for relative, words in expected:
        assert any(f == relative and w.startswith(words) for f, w in found), (words, found)
    assert len(found) == len(expected)


# words of the variants of other editions, none of which an edition's starter may hold in
# the files a student reads
OTHER_EDITIONS = {
    '2021': r'\brope\b|rotary|perceiver|bottleneck|CrossAttention|ProjectBlock',
    '2023': r'synthesizer|\brope\b|rotary',
    '2024': r'synthesizer|perceiver|bottleneck|CrossAttention|ProjectBlock',
}


@pytest.mark.parametrize('edition', EDITIONS)
def test_a_starter_holds_its_edition_only(edition):
    files = starter.starter_files(edition)
    read = [r for r in files if r.endswith('.py') and r.count('/') <= 1 and 'grading' not in r]
    assert 'src/run.py' in read and 'london_baseline.py' in read
    assert ('src/perceiver.py' in files) == (edition == '2023')
    words = OTHER_EDITIONS['2024' if edition == '2025' else edition]
    for relative in read:
        text = files[relative] or (ROOT / relative).read_text(encoding='utf-8')
        found = re.findall(words, text, flags=re.IGNORECASE)
        assert not found, (relative, found)
        assert not re.search(r'# \[\d{4}\]', text), relative  # no marker left
        compile(text, relative, 'exec')
    for relative, text in files.items():  # no path of this project's machines
        if text is None and not relative.endswith(('.ipynb', '.json')):
            text = (ROOT / relative).read_text(encoding='utf-8')
        assert not re.search(r'\.\./shared|longrun|/work/', text or ''), relative
    # every other file of src/ is the machinery's, in its folder
    assert {r for r in files if r.startswith('src/')} - set(read) == {
        r for r in files if r.startswith('src/machinery/')
    }


def test_an_edition_marker_leaves_out_its_statement_elsewhere():
    text = (
        "x = dict(\n"
        "    # [2023]\n"
        "    a=(1,\n"
        "       2),\n"
        "    b=3,\n"
        ")\n"
        "# [2024] the rope case\n"
        "if rope:\n"
        "    y = 1\n"
        "else:\n"
        "    y = 2\n"
        "    z = 3\n"
        "\n"
        "\n"
        "# [2021]\n"
        "class S:\n"
        "    # [part g, 2021]\n"
        "    def f(self):\n"
        "        return 1\n"
        "\n"
        "\n"
        "w = 4\n"
    )
    assert starter.for_edition(text, '2021') == (
        "x = dict(\n    b=3,\n)\ny = 2\nz = 3\n\n\n"
        "class S:\n    # [part g, 2021]\n    def f(self):\n        return 1\n\n\nw = 4\n"
    )
    assert starter.for_edition(text, '2025') == (
        "x = dict(\n    b=3,\n)\n# the rope case\nif rope:\n    y = 1\nelse:\n    y = 2\n"
        "    z = 3\n\n\nw = 4\n"
    )
    assert starter.for_edition(text, '2023').startswith("x = dict(\n    a=(1,\n       2),\n")


def test_a_marker_must_sit_on_a_def_or_an_if():
    with pytest.raises(
        ValueError, match="line 1: '\\[part e\\]' is not right above a def or an if"
    ):
        starter.stubs("# [part e]\nx = 1\n", '2021')
    assert starter.stubs("# [part g, 2023]\ndef f():\n    return 1\n", '2021') == []


# the test that runs a variant's parts through our training step and decoder
MACHINERY = (
    "(g) the {variant} model reads no later position, and training and evaluate compute what "
    "its forward does: on rows of several lengths (fp32, bf16), one character at a time"
)
# A mistake: (file, our text, the mistaken text, edition, the tests it must lose)
MISTAKES = {
    'randint one short': (
        'src/dataset.py',
        'random.randint(4, int(self.block_size * 7 / 8))',
        'random.randint(4, int(self.block_size * 7 / 8) - 1)',
        '2021',
        {"(e) span corruption: the truncated length"},
    ),
    'a fixed masked length': (
        'src/dataset.py',
        'masked_len = min(n, int(span + random.random()))',
        'masked_len = min(n, max(1, n // 4))',
        '2021',
        {"(e) span corruption: the masked length"},
    ),
    'an empty line not allowed for': (
        'src/dataset.py',
        'masked_len = min(n, int(span + random.random()))',
        'masked_len = int(span + random.random())',
        '2021',
        {
            "(e) span corruption: an example of every line of wiki.txt, as each epoch of "
            "pretraining builds"
        },
    ),
    'padding one short': (
        'src/dataset.py',
        'self.PAD_CHAR * (self.padded_length - len(masked_string))',
        'self.PAD_CHAR * (self.padded_length - 1 - len(masked_string))',
        '2021',
        {"(e) span corruption: padded to the edition's length"},
    ),
    "2021's padding in 2024": (
        'src/dataset.py',
        'self.PAD_CHAR * (self.padded_length - len(masked_string))',
        'self.PAD_CHAR * (self.block_size - len(masked_string))',
        '2024',
        {"(e) span corruption: padded to the edition's length"},
    ),
    'x and y not shifted': (
        'src/dataset.py',
        'encode(masked_string[1:], self.stoi)',
        'encode(masked_string[:-1], self.stoi)',
        '2021',
        {"(e) span corruption: y is x shifted by one"},
    ),
    "the synthesizer's w2 not cut to T": (
        'src/attention.py',
        'att = a @ self.w2[:, :T] + self.b2[:T]',
        'att = a @ self.w2 + self.b2',
        '2021',
        {
            "(g) SynthesizerAttention: eq. 11 with given weights",
            MACHINERY.format(variant='synthesizer'),
        },
    ),
    "RoPE's angle with the 2024 starter's sign": (
        'src/attention.py',
        'theta = 10000.0 ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)',
        'theta = 10000.0 ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)',
        '2024',
        {"(g) precompute_rotary_emb: cos and sin of t theta_i"},
    ),
    '75 epochs from pretrained params': (
        'src/run.py',
        'max_epochs = 10',
        'max_epochs = 75',
        '2021',
        {"(f) finetuning from pretrained params: the handout's Trainer settings"},
    ),
    'the wrong learning rate': (
        'src/run.py',
        'learning_rate=args.pretrain_lr,',
        'learning_rate=args.finetune_lr,',
        '2021',
        {"(f) pretraining: the handout's Trainer settings"},
    ),
    "the perceiver's residuals left out (allowed)": (
        'src/perceiver.py',
        'y = basis + self.attn(x_input, self.ln1(basis))',
        'y = self.attn(x_input, self.ln1(basis))',
        '2023',
        set(),
    ),
    "the up block's queries and keys swapped": (
        'src/perceiver.py',
        'x = x_input + self.attn(self.ln1(y), x_input)',
        'x = x_input + self.attn(x_input, self.ln1(y))',
        '2023',
        {"(g) UpProjectBlock with given weights", MACHINERY.format(variant='perceiver')},
    ),
    "London's computation": (
        'london_baseline.py',
        "['London'] * len(",
        "['Paris'] * len(",
        '2024',
        {"(d) London baseline: london_baseline.py's accuracy"},
    ),
    'pretrained params not loaded': (
        'src/run.py',
        '        gpt.load_state_dict(args.reading_state)\n',
        '',
        '2021',
        {"(f) finetuning from pretrained params starts from them"},
    ),
    "the synthesizer without its causal mask": (
        'src/attention.py',
        "self.b2[:T]  # (B, nh, T, T)\n        att = att.masked_fill(self.mask[:, :, :T, :T] == 0, "
        "float('-inf'))",
        "self.b2[:T]  # (B, nh, T, T)",
        '2021',
        {
            "(g) SynthesizerAttention: eq. 11 with given weights",
            MACHINERY.format(variant='synthesizer'),
        },
    ),
    "the synthesizer's b2 not cut to T": (
        'src/attention.py',
        'att = a @ self.w2[:, :T] + self.b2[:T]',
        'att = a @ self.w2[:, :T] + self.b2',
        '2021',
        {
            "(g) SynthesizerAttention: eq. 11 with given weights",
            MACHINERY.format(variant='synthesizer'),
        },
    ),
    'x and y swapped': (
        'src/dataset.py',
        'return encode(masked_string[:-1], self.stoi), encode(masked_string[1:], self.stoi)',
        'return encode(masked_string[1:], self.stoi), encode(masked_string[:-1], self.stoi)',
        '2024',
        {
            "(e) span corruption: the truncated length",
            "(e) span corruption: prefix MASK suffix MASK masked, then PAD",
            "(e) span corruption: y is x shifted by one",
            "(e) span corruption: the masked length",
            "(e) span corruption: the masked span's place varies",
        },
    ),
    'rope_cache not cut to T': (
        'src/attention.py',
        'cos, sin = rope_cache[:T, :, 0], rope_cache[:T, :, 1]',
        'cos, sin = rope_cache[:, :, 0], rope_cache[:, :, 1]',
        '2024',
        {
            "(g) apply_rotary_emb: rotates adjacent pairs",
            "(g) CausalSelfAttention with rope: q and k rotated",
            MACHINERY.format(variant='rope'),
        },
    ),
    'v rotated too': (
        'src/attention.py',
        'k = apply_rotary_emb(k, self.rope_cache)  # (B, nh, T, hs)\n',
        'k = apply_rotary_emb(k, self.rope_cache)  # (B, nh, T, hs)\n'
        '            v = apply_rotary_emb(v, self.rope_cache)\n',
        '2024',
        {"(g) CausalSelfAttention with rope: q and k rotated"},
    ),
    'the masked span always at the start': (
        'src/dataset.py',
        'start = random.randint(0, n - masked_len)',
        'start = 0',
        '2021',
        {"(e) span corruption: the masked span's place varies"},
    ),
    'the masked span always ending at the end': (
        'src/dataset.py',
        'start = random.randint(0, n - masked_len)',
        'start = n - masked_len',
        '2024',
        {"(e) span corruption: the masked span's place varies"},
    ),
    'the masked span at a fixed offset': (
        'src/dataset.py',
        'start = random.randint(0, n - masked_len)',
        'start = min(2, n - masked_len)',
        '2023',
        {"(e) span corruption: the masked span's place varies"},
    ),
    'new_model without the synthesizer': (
        'src/run.py',
        "synthesizer=variant == 'synthesizer',",
        'synthesizer=False,',
        '2021',
        {"(g) the synthesizer model: the handout's architecture"},
    ),
}
# what no message a student can get may speak of: our machinery's words
MACHINERY_WORDS = re.compile(r'pack|(?<!rope_)cache|machinery|fast decoder', re.I)


def planted(ours, folder, relative, old, new):
    shutil.copytree(ours, folder, ignore=shutil.ignore_patterns('__pycache__'))
    text = (folder / relative).read_text(encoding='utf-8')
    assert text.count(old) == 1, (relative, old)
    (folder / relative).write_text(text.replace(old, new), encoding='utf-8')
    return folder


# one mistake of each file and variant in the quick suite, the others in the slow checks
QUICK_MISTAKES = {'randint one short', "2021's padding in 2024", "the synthesizer's w2 not cut to T",
                  "RoPE's angle with the 2024 starter's sign", "the up block's queries and keys swapped",
                  'pretrained params not loaded', "London's computation"}  # fmt: skip


@pytest.mark.parametrize(
    'mistake',
    [m if m in QUICK_MISTAKES else pytest.param(m, marks=pytest.mark.slow) for m in MISTAKES],
)
def test_a_classic_mistake_loses_exactly_its_tests(ours, our_grades, tmp_path, mistake):
    relative, old, new, edition, lost = MISTAKES[mistake]
    rows = marking.grade(
        planted(ours, tmp_path / 'copy', relative, old, new), edition, ROOT / 'data'
    )
    passed = {name for name, score, points, _ in our_grades[edition] if score == points}
    assert {name for name, score, points, _ in rows if score < points} == lost
    assert lost <= passed
    for name, score, points, reason in rows:  # in the handout's terms: a part and a cause
        if score < points:
            assert '(part ' in reason and 'check ' in reason, (name, reason)
            assert not MACHINERY_WORDS.search(reason), (name, reason)


def test_2024s_padding_is_right_in_2021(ours, tmp_path):
    """The padding mistake of 2024 loses nothing in 2021, where block_size is the length."""
    relative, old, new, _, _ = MISTAKES["2021's padding in 2024"]
    copy = planted(ours, tmp_path / 'copy', relative, old, new)
    names = {n for n, _ in marking.tests_for('2021', False) if n.startswith('(e)')}
    rows = marking.grade(copy, '2021', ROOT / 'data', only=names)
    assert all(score == points for _, score, points, _ in rows)


# Another correct span corruption: the masked length drawn as randint(1, L // 2) (a mean
# half a character above L/4), and a third MASK after the masked span
OTHER_SPANS = """document = self.data[idx]
        truncated = document[: random.randint(4, int(self.block_size * 7 / 8))]
        n = len(truncated)
        masked_len = min(n, random.randint(1, max(1, n // 2)))
        start = random.randint(0, n - masked_len)
        prefix, masked = truncated[:start], truncated[start : start + masked_len]
        suffix = truncated[start + masked_len :]
        s = prefix + self.MASK_CHAR + suffix + self.MASK_CHAR + masked + self.MASK_CHAR
        s += self.PAD_CHAR * (self.padded_length - len(s))
        return encode(s[:-1], self.stoi), encode(s[1:], self.stoi)
"""


# One more, read from several public solutions: the start drawn from 1 to L - m - 1, so that
# neither the prefix nor the suffix is ever empty (where the document leaves room)
INNER_SPANS = OTHER_SPANS.replace(
    'start = random.randint(0, n - masked_len)',
    'start = random.randint(1, n - masked_len - 1) if n - masked_len >= 2 else 0',
).replace(' + self.MASK_CHAR\n', '\n')


def span_body(implementation):
    """The body of __getitem__ of each correct span corruption, indented as in dataset.py."""
    if implementation == 'textbook':
        import test_textbook

        lines = test_textbook.GETITEM.strip('\n').split('\n')
        return '\n'.join(lines[:1] + ['        ' + line for line in lines[1:]]) + '\n'
    return {'another': OTHER_SPANS, 'inner': INNER_SPANS}[implementation]


@pytest.mark.parametrize('seed', [1, 2, 3])
@pytest.mark.parametrize('implementation', ['ours', 'another', 'inner', 'textbook'])
def test_correct_span_corruption_passes_whatever_the_draws(
    ours, tmp_path, monkeypatch, implementation, seed
):
    submission = ours
    if implementation != 'ours':
        text = (ours / 'src' / 'dataset.py').read_text()
        body = text[text.index('document = self.data[idx]') : text.index('\n\n\nclass NameDataset')]
        submission = planted(
            ours, tmp_path / 'copy', 'src/dataset.py', body + '\n', span_body(implementation)
        )
    monkeypatch.setattr(probe_runner, 'SPAN_SEED', seed)
    names = {n for n, _ in marking.tests_for('2021', False) if n.startswith('(e)')}
    rows = marking.grade(submission, '2021', ROOT / 'data', only=names)
    assert [(n, why) for n, score, points, why in rows if score < points] == []


@pytest.mark.parametrize(
    'body, reason',
    [
        ('while True:\n            pass', 'timed out after {timeout} s'),
        ('import os\n        os._exit(3)', 'the process ended without a result (exit code 3)'),
        ('return (', 'SyntaxError: '),
        (
            'return undefined_name',
            "NameError: name 'undefined_name' is not defined (src/dataset.py:",
        ),
    ],
)
def test_broken_code_fails_its_tests_with_a_line_and_grading_goes_on(ours, tmp_path, body, reason):
    copy = planted(
        ours, tmp_path / 'copy', 'src/dataset.py', 'document = self.data[idx]\n', body + '\n'
    )
    synthesizer = "(g) SynthesizerAttention: eq. 11 with given weights"
    only = {"(e) span corruption: the truncated length", synthesizer}
    timeout = 60  # marking's own
    if 'timed out' in reason:  # the code hangs: a limit that a working probe meets here
        start = time.perf_counter()
        marking.grade(ours, '2021', ROOT / 'data', only={synthesizer})
        timeout = max(3, math.ceil(3 * (time.perf_counter() - start)))
    rows = {
        name: (score, why)
        for name, score, _, why in marking.grade(
            copy, '2021', ROOT / 'data', timeout=timeout, only=only
        )
    }
    score, why = rows["(e) span corruption: the truncated length"]
    assert score == 0 and reason.format(timeout=timeout) in why and '\n' not in why
    assert rows["(g) SynthesizerAttention: eq. 11 with given weights"][0] == 4


def test_original_starter_layouts_are_graded(ours, tmp_path):
    """The course's starters keep london_baseline.py in src/; a crashing
    precompute_rotary_emb fails its own test, not the attention's that uses it."""
    copy = planted(
        ours,
        tmp_path / 'copy',
        'src/attention.py',
        '    theta = 10000.0',
        '    1 / 0\n    theta = 10000.0',
    )
    (copy / 'london_baseline.py').rename(copy / 'src' / 'london_baseline.py')
    only = {
        n
        for n, t in marking.tests_for('2024', False)
        if 'london' in t.probes or n.startswith('(g) ')
    }
    rows = {
        n: (score, why)
        for n, score, _, why in marking.grade(copy, '2024', ROOT / 'data', only=only)
    }
    assert rows.pop("(g) precompute_rotary_emb: cos and sin of t theta_i")[1].startswith(
        'ZeroDivisionError: division by zero (src/attention.py:'
    )
    # its __init__ calls it
    assert rows.pop("(g) the rope model: the handout's architecture")[0] == 0
    assert rows.pop(MACHINERY.format(variant='rope'))[0] == 0
    assert all(score > 0 for score, _ in rows.values()), rows


def test_a_course_starters_submission_is_not_held_to_our_machinery(ours, tmp_path):
    """A submission without src/machinery/ (made from the course's own starter) trains in
    its own code: the test of our packed step and decoder is not among its tests."""
    copy = tmp_path / 'course'
    shutil.copytree(ours, copy)
    shutil.rmtree(copy / 'src' / 'machinery')
    machinery = MACHINERY.format(variant='synthesizer')
    assert marking.grade(copy, '2021', ROOT / 'data', only={machinery}) == []
    assert [r[0] for r in marking.grade(ours, '2021', ROOT / 'data', only={machinery})] == [
        machinery
    ]


def test_test_answers_grade_the_test_predictions(ours, tmp_path):
    questions = editions.read_lines(ROOT / 'data' / 'birth_test_inputs.tsv')
    predictions = editions.read_lines(ours / 'vanilla.pretrain.test.predictions')
    answers = [f"{q.split(chr(9))[0]}\t{p}" for q, p in zip(questions, predictions)]
    name = "(f) vanilla pretrained: test accuracy at least 9%"
    assert name not in [n for n, _ in marking.tests_for('2021', False)]
    rows = marking.grade(ours, '2021', ROOT / 'data', answers=answers, only={name})
    assert rows == [(name, 8, 8, None)]
    wrong = [f"{q.split(chr(9))[0]}\tNowhere" for q in questions]
    rows = marking.grade(ours, '2021', ROOT / 'data', answers=wrong, only={name})
    assert rows == [(name, 0, 8, f"0 of 437 right, 0.0%: below 9%; {suite.ACCURACY}")]


@pytest.fixture
def unsandboxed(monkeypatch):
    """grade.main in this process grades as the user running the tests: as root, the
    sandbox would refuse pytest's Python where its user cannot read it (pyenv's, under
    /root here); test_hostile_submissions.py runs the command in the sandbox."""
    monkeypatch.setattr(sandbox, 'current', lambda: None)


def test_the_command_line_grades_zips_and_writes_json_and_csv(ours, tmp_path, capsys, unsandboxed):
    archive = tmp_path / 'assignment5.zip'
    with zipfile.ZipFile(archive, 'w') as z:
        for path in ours.rglob('*'):
            if path.is_file() and '__pycache__' not in path.parts:
                z.write(path, path.relative_to(ours).as_posix())
    starter.write_starter('2021', tmp_path / 'starter')
    results = tmp_path / 'results.json'
    assert grade.main([str(tmp_path / 'starter'), '--json', str(results)]) == 0
    out = capsys.readouterr().out
    assert '(2021 edition, told from its files; --edition to choose)' in out
    tests = json.loads(results.read_text())['tests']
    assert tests[0]['name'].startswith('(c) ') and tests[0]['status'] == 'failed'
    assert set(tests[0]) == {'name', 'score', 'max_score', 'status', 'output', 'visibility'}
    table = tmp_path / 'grades.csv'
    argv = [str(archive), str(tmp_path / 'starter'), 'nowhere', '--edition', '2021']
    assert grade.main(argv + ['--csv', str(table)]) == 2  # the others graded all the same
    assert capsys.readouterr().err == "error: nowhere: neither a folder nor a zip file\n"
    rows = list(csv.reader(table.open()))
    assert rows[3][:5] == ['nowhere', '', '0', '0', 'nowhere: neither a folder nor a zip file']
    rows = rows[:3]
    assert rows[0][:5] == ['submission', 'edition', 'score', 'max_score', 'note'] and len(rows) == 3
    assert rows[1][1:3] == ['2021', rows[1][3]] and rows[2][2] == '0'


@pytest.mark.parametrize(
    'argv, message',
    [
        (['nowhere'], 'error: nowhere: neither a folder nor a zip file'),
        (['a', 'b', '--json', 'r.json'], 'error: --json takes one submission'),
        (['.', '--data', 'nowhere'], 'error: --data nowhere: wiki.txt is missing'),
    ],
)
def test_bad_input_is_one_line(
    real_data, tmp_path, monkeypatch, capsys, argv, message, unsandboxed
):
    monkeypatch.chdir(tmp_path)
    assert grade.main(argv + (['--data', str(real_data)] if '--data' not in argv else [])) == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count('\n') == 1


def test_architectures_are_our_models():
    vocab = 256
    for variant, shapes in json.loads(editions.ARCHITECTURES.read_text()).items():
        gpt = run.new_model(variant, vocab, 64 if variant == 'perceiver' else 32)
        ours = {n: list(t.shape) for n, t in gpt.state_dict().items()}
        assert ours == {n: [vocab if d == 'vocab' else d for d in s] for n, s in shapes.items()}
