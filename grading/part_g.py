"""The tests of part (g): the edition's second variant (synthesizer, perceiver or RoPE),
its params and predictions, what training does with its parts, and its code against the
handout's equations with given weights (references.py)."""

from references import (
    PERCEIVER_FORMS,
    down_block,
    exact,
    perceiver_case,
    rope_apply_inputs,
    rope_attention,
    rope_attention_case,
    rotary_table,
    rotate,
    synthesizer_attention,
    synthesizer_case,
    up_block,
)
from suite import (
    ACCURACY,
    VARIANT_PARTS,
    check_accuracy,
    check_architecture,
    check_forms,
    check_outputs,
    check_params,
    test,
)


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
