"""How a test is written: the `test` decorator that registers each test of the part_*.py
files in TESTS, a test's failure (Fail, or Unwritten where the part is still the starter's
stub) and the line it ends up as, the hints the parts share, and the comparisons the
tests make (an architecture, the Trainer settings, a params file, an accuracy floor, an
output against its direct computation).
"""

import math
import re

import torch

from editions import EDITIONS


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
