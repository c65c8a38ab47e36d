"""Messages that name the part (issue 79): in a starter, a test that cannot run because a
part is still the starter's stub says which part, function and file, and no other
cause's hint; the hints name the student's edition's settings only; and the dataset demo
(`python src/dataset.py charcorruption|namedata [--index N]`) names the line of wiki.txt
an example could not be built from, and why, in one line."""

import importlib.util
import random
import re
import subprocess
import sys

import pytest

from conftest import ROOT

sys.path.insert(0, str(ROOT / 'grading'))
import editions  # noqa: E402
import learning_check  # noqa: E402
import marking  # noqa: E402
import probes  # noqa: E402
import starter  # noqa: E402
import suite  # noqa: E402
import test_textbook  # noqa: E402
from machinery import checks  # noqa: E402
from test_grading import EDITIONS, OTHER_EDITIONS  # noqa: E402

PYTHON = sys.executable
GETITEM = 'needs part (e) CharCorruptionDataset.__getitem__ in src/dataset.py, not written yet'
# what a fresh starter's tests of code say: {test name: its line}, for every edition
FRESH = {
    "(c) the vanilla model: the handout's architecture": (
        'needs part (c) finetune in src/run.py, not written yet'
    ),
    "(c) finetuning without pretraining: the handout's Trainer settings": (
        'needs part (c) finetune in src/run.py, not written yet'
    ),
    "(d) London baseline: london_baseline.py's accuracy": (
        'needs part (d) london_baseline in london_baseline.py, not written yet'
    ),
    "(f) pretraining: the handout's Trainer settings": (
        'needs part (f) pretrain in src/run.py, not written yet'
    ),
    # run.py checks the params it reads against new_model's model before finetune
    "(f) finetuning from pretrained params: the handout's Trainer settings": (
        'needs part (c) new_model in src/run.py, not written yet'
    ),
    "(f) finetuning from pretrained params starts from them": (
        'needs part (c) new_model in src/run.py, not written yet'
    ),
    "(g) the {variant} model: the handout's architecture": (
        'needs part (c) finetune in src/run.py, not written yet'
    ),
}
MACHINERY = (
    "(g) the {variant} model reads no later position, and training and evaluate compute what "
    "its forward does: on rows of several lengths (fp32, bf16), one character at a time"
)
FRESH_VARIANT = {
    '2021': {
        MACHINERY: 'needs part (g) SynthesizerAttention.forward in src/attention.py, not written yet',
        "(g) SynthesizerAttention: eq. 11 with given weights": (
            'needs part (g) SynthesizerAttention.forward in src/attention.py, not written yet'
        ),
    },
    '2023': {
        MACHINERY: 'needs part (g) DownProjectBlock.__init__ in src/perceiver.py, not written yet',
        "(g) DownProjectBlock with given weights": (
            'needs part (g) DownProjectBlock.__init__ in src/perceiver.py, not written yet'
        ),
        "(g) UpProjectBlock with given weights": (
            'needs part (g) UpProjectBlock.__init__ in src/perceiver.py, not written yet'
        ),
    },
    '2024': {
        MACHINERY: 'needs part (g) the buffer rope_cache in CausalSelfAttention.__init__ '
        '(src/attention.py), not written yet',
        "(g) CausalSelfAttention with rope: q and k rotated": (
            'needs part (g) the buffer rope_cache in CausalSelfAttention.__init__ '
            '(src/attention.py), not written yet'
        ),
        "(g) precompute_rotary_emb: cos and sin of t theta_i": (
            'needs part (g) precompute_rotary_emb in src/attention.py, not written yet'
        ),
        "(g) apply_rotary_emb: rotates adjacent pairs": (
            'needs part (g) apply_rotary_emb in src/attention.py, not written yet'
        ),
    },
}


def code_tests(edition):
    return {name for name, t in marking.tests_for(edition, False) if t.probes}


def named(messages, edition):
    """The messages' test names written for the edition."""
    return {name.format(**editions.EDITIONS[edition]): line for name, line in messages.items()}


@pytest.mark.parametrize('edition', EDITIONS)
def test_a_fresh_starter_says_which_part_each_test_needs(tmp_path, real_data, edition):
    """Every test of code in a fresh starter names the stub it stopped at: its part, its
    function and its file, not a NotImplementedError, and no hint of another cause."""
    starter.write_starter(edition, tmp_path)
    rows = marking.grade(tmp_path, edition, real_data, only=code_tests(edition))
    reasons = {name: reason for name, _, _, reason in rows}
    expected = named({**FRESH, **FRESH_VARIANT[edition]}, edition)
    for name in code_tests(edition):
        if name.startswith('(e) '):
            expected[name] = GETITEM
    assert reasons == expected


def filled(folder, edition, unwritten):
    """The edition's starter in `folder`, every stub but those whose words start with one
    of `unwritten` replaced by the textbook answer (test_textbook's)."""
    starter.write_starter(edition, folder)
    for path in [*folder.glob('src/*.py'), folder / 'london_baseline.py']:
        lines = path.read_text(encoding='utf-8').split('\n')
        for number, line in enumerate(lines):
            match = test_textbook.STUB.match(line)
            if match and not match.group(2).startswith(unwritten):
                indent, said = match.groups()
                key = next(k for k in test_textbook.ANSWERS if said.startswith(k))
                body = test_textbook.ANSWERS[key]
                lines[number] = '\n'.join(indent + b for b in body.strip('\n').split('\n'))
        path.write_text('\n'.join(lines), encoding='utf-8')
    return folder


# a starter filled but for finetune and one of the variant's stubs: what the tests that go
# through them say (the others pass)
LEFT = {
    '2021': (
        'write SynthesizerAttention.forward',
        'needs part (g) SynthesizerAttention.forward in src/attention.py, not written yet',
        "(g) SynthesizerAttention: eq. 11 with given weights",
    ),
    '2023': (
        'write DownProjectBlock.forward',
        'needs part (g) DownProjectBlock.forward in src/perceiver.py, not written yet',
        "(g) DownProjectBlock with given weights",
    ),
    '2024': (
        'rotate q and k',
        'needs part (g) rotate q and k in CausalSelfAttention.forward (src/attention.py), '
        'not written yet',
        "(g) CausalSelfAttention with rope: q and k rotated",
    ),
}


@pytest.mark.parametrize('edition', EDITIONS)
def test_a_test_that_goes_through_an_unwritten_part_names_it(tmp_path, real_data, edition):
    """The vanilla model's architecture is read through finetune, and the causal check runs
    the whole variant: with finetune or a piece of the variant unwritten, they say so (the
    test's letter where the stub has two, [part c] [part f]), not the cause their hint
    names; every test the written parts alone decide passes."""
    stub, line, own_test = LEFT[edition]
    folder = filled(tmp_path / 'starter', edition, ('write finetune', stub))
    rows = marking.grade(folder, edition, real_data, only=code_tests(edition))
    failed = {name: reason for name, score, points, reason in rows if score < points}
    finetune = 'needs part ({}) finetune in src/run.py, not written yet'
    assert failed == named(
        {
            "(c) the vanilla model: the handout's architecture": finetune.format('c'),
            "(c) finetuning without pretraining: the handout's Trainer settings": (
                finetune.format('c')
            ),
            "(f) finetuning from pretrained params: the handout's Trainer settings": (
                finetune.format('f')
            ),
            "(f) finetuning from pretrained params starts from them": finetune.format('f'),
            "(g) the {variant} model: the handout's architecture": finetune.format('c'),
            MACHINERY: line,
            own_test: line,
        },
        edition,
    )


# the words of each edition's own settings that its hints must name where they name any
OWN = {'2021': 'synthesizer=True', '2023': 'bottleneck_dim', '2024': 'rope=True'}
# the years other editions' settings were named by ('2024: and writes it ...')
YEARS = r'\b20(?:21|23|24|25)\b'


@pytest.mark.parametrize('edition', EDITIONS)
def test_hints_name_the_editions_settings_only(edition):
    """Every line a failing test of the edition can add (its hint) names none of the other
    editions' variants or settings, nor an edition by its year; the variant's architecture
    names the edition's own setting. The same of the causal check's lines and of the
    learning check's line for a size that does not match."""
    fields = editions.EDITIONS[edition]
    variant = fields['variant']
    words = re.compile(f"{OTHER_EDITIONS[edition]}|{YEARS}", re.IGNORECASE)
    for name, t in marking.tests_for(edition, True):
        said = t.reason(suite.Fail('it failed'), fields)
        assert not words.search(said), (name, said)
    architecture = {n: t for n, t in marking.tests_for(edition, False)}[
        f"(g) the {variant} model: the handout's architecture"
    ]
    assert OWN[edition] in architecture.reason(suite.Fail('it failed'), fields)
    lines = [
        probes.depends_on_later(variant),
        probes.positions(variant),
        learning_check.sizes_hint(variant),
    ]
    for said in lines:
        assert not words.search(said) and 'check ' in said and '(part g)' in said, said
    assert ('rope_cache' in lines[0]) == (variant == 'rope')
    assert ('w2 and b2' in lines[0]) == (variant == 'synthesizer')


def test_an_unwritten_stub_says_so_in_place_of_the_hint(real_data):
    """Unwritten's line names the stub's part (the test's own letter where the stub has
    two), its function and its file; and it replaces the hint a failure would get."""
    stub = {'parts': ['c', 'f'], 'what': 'finetune', 'in': None, 'file': 'src/run.py'}
    failure = suite.Unwritten('NotImplementedError: [part c] [part f] write finetune', stub)
    tests = dict(marking.tests_for('2024', False))
    fields = editions.EDITIONS['2024']
    architecture = tests["(c) the vanilla model: the handout's architecture"]
    assert architecture.reason(failure, fields) == (
        'needs part (c) finetune in src/run.py, not written yet'
    )
    pretrained = tests["(f) finetuning from pretrained params starts from them"]
    assert pretrained.reason(failure, fields) == (
        'needs part (f) finetune in src/run.py, not written yet'
    )
    written = architecture.reason(suite.Fail('the model has no lm_head'), fields)
    assert written.startswith('the model has no lm_head; check new_model (part c)')


def empty_range():
    """This Python's message for random.randrange(0)."""
    try:
        random.randrange(0)
    except ValueError as e:
        return str(e)


@pytest.mark.parametrize(
    'body, said',
    [
        (
            "return random.randrange(len(self.data[i]))",
            "the example of line 3 of wiki.txt ('') raised ValueError: {empty} (src/dataset.py:12)",
        ),
        (
            "raise NotImplementedError('[part e] write CharCorruptionDataset.__getitem__ "
            "(its docstring says what)')",
            "the example of line 3 of wiki.txt ('') needs part (e) "
            "CharCorruptionDataset.__getitem__ in src/dataset.py, not written yet",
        ),
    ],
)
def test_an_example_that_cannot_be_built_names_its_line(tmp_path, monkeypatch, body, said):
    """checks.example_failure numbers the line as the grader does (example i is line i + 1;
    -1 the last) and says why, with the place in src/, or the stub's part."""
    (tmp_path / 'src').mkdir()
    source = tmp_path / 'src' / 'dataset.py'
    source.write_text(
        "import random\n\n\nclass Corpus:\n    def __init__(self, lines):\n"
        "        self.data = lines\n\n    def __len__(self):\n        return len(self.data)\n\n"
        f"    def __getitem__(self, i):\n        {body}\n"
    )
    spec = importlib.util.spec_from_file_location('issue79_dataset', source)
    written = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, 'issue79_dataset', written)  # where inspect finds it
    spec.loader.exec_module(written)
    corpus = written.Corpus(['Khatchig Mouradian.', 'abc', ''])
    with pytest.raises(Exception) as caught:
        corpus[-1]
    line = checks.example_failure(corpus, -1, caught.value, 'wiki.txt')
    assert line == said.format(empty=empty_range())


def demo(folder, *argv):
    return subprocess.run(
        [PYTHON, 'src/dataset.py', *argv],
        cwd=folder,
        capture_output=True,
        text=True,
        encoding='utf-8',
    )


# a span corruption written from the handout's steps, which forgets the empty last line:
# its masked span's start is drawn from an empty range there
EMPTY_LINE_FAILS = '''
doc = self.data[idx]
L = random.randint(4, int(self.block_size * 7 / 8))
doc = doc[:L]
L = len(doc)
m = random.randint(1, max(1, L // 2 - 1))
i = random.randrange(L - m + 1)
s = doc[:i] + self.MASK_CHAR + doc[i + m :] + self.MASK_CHAR + doc[i : i + m]
s = s + self.PAD_CHAR * (self.padded_length - len(s))
x = torch.tensor([self.stoi[c] for c in s[:-1]], dtype=torch.long)
y = torch.tensor([self.stoi[c] for c in s[1:]], dtype=torch.long)
return x, y
'''


@pytest.mark.slow  # each a starter written and its demo run, seconds each
@pytest.mark.parametrize('edition', EDITIONS)
def test_the_dataset_demo_names_the_line_it_cannot_show(tmp_path, real_data, edition):
    """In a fresh starter `python src/dataset.py charcorruption` says part e is not written
    yet; with a span corruption that fails on wiki.txt's empty last line, `--index -1`
    names line 2938 (the grader's number) and the error, in one line, exit status 2, no
    traceback; the lines it can show it shows as before."""
    starter.write_starter(edition, tmp_path)
    for name in ('wiki.txt', 'birth_places_train.tsv'):
        (tmp_path / name).write_bytes((real_data / name).read_bytes())
    done = demo(tmp_path, 'charcorruption')
    assert (done.returncode, done.stderr) == (
        2,
        "error: the example of line 1 of wiki.txt ('Khatchig Mouradian. Khatchig Mouradian "
        f"i') {GETITEM}\n",
    )
    assert 'x: ' not in done.stdout
    assert demo(tmp_path, 'namedata').returncode == 0  # NameDataset is not part e

    dataset_py = tmp_path / 'src' / 'dataset.py'
    text = dataset_py.read_text(encoding='utf-8')
    stub = next(line for line in text.split('\n') if starter.STUB in line)
    indent = stub[: len(stub) - len(stub.lstrip())]
    body = '\n'.join(indent + line for line in EMPTY_LINE_FAILS.strip('\n').split('\n'))
    dataset_py.write_text(text.replace(stub, body), encoding='utf-8')
    number = text.split('\n').index(stub) + 6  # the randrange line
    done = demo(tmp_path, 'charcorruption', '--index', '-1')
    assert (done.returncode, done.stderr) == (
        2,
        "error: the example of line 2938 of wiki.txt ('') raised ValueError: "
        f"{empty_range()} (src/dataset.py:{number})\n",
    )
    done = demo(tmp_path, 'charcorruption', '--index', '0', '2937')
    assert done.returncode == 2 and 'Traceback' not in done.stderr
    assert done.stderr.startswith("error: the example of line 2938 of wiki.txt ('') raised")
    assert done.stdout.split('\n')[1].startswith("example 0 (the line 'Khatchig Mouradian.")


def test_the_demo_shows_what_it_showed(real_data):
    """Our span corruption builds every example: the demo's output is the lines as before
    (the empty last line's example is always two MASKs and PAD)."""
    done = demo(ROOT, 'charcorruption', '--index', '-1')
    assert done.returncode == 0 and done.stderr == ''
    padding = '\u25a1' * 125
    assert done.stdout.split('\n')[1:] == [
        "example 2937 (the line ''):",
        f"x: \u2047\u2047{padding}",
        f"y: \u2047{padding}\u25a1",
        '',
    ]
