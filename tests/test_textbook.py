"""A textbook answer works: each part a student writes, written here from the handouts
(their signatures, plain (B, T, C) tensors, RoPE with complex numbers, span corruption with
random draws of its own), put into the starter of its edition, trains and evaluates with
the edition's commands on the CPU in fp32 and bf16, giving our own code's params within
rounding and its dev predictions; and the same parts get full marks for code from the
grader.

The comparison with our code takes our span corruption (random draws decide every
example, so another draw order is another run); the graded starter has the textbook one."""

import re
import subprocess
import sys

import pytest
import torch

from conftest import ROOT, main, tiny_corpus

sys.path.insert(0, str(ROOT / 'grading'))
import marking  # noqa: E402
import starter  # noqa: E402

GETITEM = '''
document = self.data[idx]
document = document[: random.randint(4, int(self.block_size * 7 / 8))]
n = len(document)
masked_len = min(n, random.randint(1, max(1, n // 2 - 1)))
start = random.randint(0, n - masked_len)
prefix, masked = document[:start], document[start : start + masked_len]
suffix = document[start + masked_len :]
s = prefix + self.MASK_CHAR + suffix + self.MASK_CHAR + masked
s = s + self.PAD_CHAR * (self.padded_length - len(s))
x = torch.tensor([self.stoi[c] for c in s[:-1]], dtype=torch.long)
y = torch.tensor([self.stoi[c] for c in s[1:]], dtype=torch.long)
return x, y
'''

# the stub's words (its NotImplementedError's message) -> the body written in its place
ANSWERS = {
    'write london_baseline': '''
with open(eval_corpus_path, encoding='utf-8') as f:
    n = len([line for line in f.read().split('\\n') if line.strip()])
return utils.evaluate_places(eval_corpus_path, ['London'] * n)
''',
    'write pretrain': '''
pretrain_dataset = load_pretrain_dataset(args)
gpt = build_model(args, pretrain_dataset)
E = EDITIONS[args.edition]['pretrain_schedule_epochs']
tconf = trainer.TrainerConfig(
    max_epochs=650, batch_size=128, learning_rate=args.pretrain_lr, lr_decay=True,
    warmup_tokens=512 * 20, final_tokens=E * len(pretrain_dataset) * BLOCK_SIZE,
    num_workers=4,
)
return train(args, gpt, pretrain_dataset, tconf)
''',
    'write finetune': '''
pretrain_dataset = load_pretrain_dataset(args)
gpt = build_model(args, pretrain_dataset)
epochs = 75
if args.reading_params_path is not None:
    gpt.load_state_dict(args.reading_state)
    epochs = 10
finetune_dataset = dataset.NameDataset(pretrain_dataset, files.read_text(args.finetune_corpus_path))
tconf = trainer.TrainerConfig(
    max_epochs=epochs, batch_size=256, learning_rate=args.finetune_lr, lr_decay=True,
    warmup_tokens=512 * 20, final_tokens=200 * len(pretrain_dataset) * BLOCK_SIZE,
    num_workers=4,
)
return train(args, gpt, finetune_dataset, tconf)
''',
    'write new_model': '''
mconf = model.GPTConfig(vocab_size, BLOCK_SIZE, n_layer=4, n_head=8, n_embd=256)
if variant == 'synthesizer':
    mconf.synthesizer = True
if variant == 'rope':
    mconf.rope = True
if variant == 'perceiver':
    mconf.bottleneck_dim = bottleneck_dim
    return perceiver.PerceiverGPT(mconf)
return model.GPT(mconf)
''',
    'write CharCorruptionDataset.__getitem__': GETITEM,
    'write SynthesizerAttention.forward': '''
B, T, C = x.size()
h = self.n_head
a = F.relu(self.w1(x)).view(B, T, h, C // h).permute(0, 2, 1, 3)  # (B, h, T, hs)
scores = torch.matmul(a, self.w2[:, :T]) + self.b2[:T]  # (B, h, T, T)
scores = scores.masked_fill(self.mask[:, :, :T, :T] == 0, -1e10)
att = self.attn_drop(F.softmax(scores, dim=-1))
v = self.value(x).view(B, T, h, C // h).permute(0, 2, 1, 3)  # (B, h, T, hs)
y = torch.matmul(att, v).permute(0, 2, 1, 3).reshape(B, T, C)
return self.resid_drop(self.proj(y))
''',
    # the angles in float64, as ours: a table computed in float32 is another table (up to
    # 1e-5 apart at position 127), a difference that training amplifies past rounding's
    'write precompute_rotary_emb': '''
theta = 1.0 / (10000 ** (torch.arange(0, dim, 2).double() / dim))  # (dim/2,)
t = torch.arange(max_positions).double()
freqs = torch.outer(t, theta)  # (max_positions, dim/2)
return torch.stack([torch.cos(freqs), torch.sin(freqs)], dim=-1).float()
''',
    'write apply_rotary_emb': '''
T = x.shape[-2]
pairs = torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2))  # (B, nh, T, hs/2)
turns = torch.view_as_complex(rope_cache[:T].contiguous())  # (T, hs/2)
return torch.view_as_real(pairs * turns).flatten(-2)
''',
    'the buffer rope_cache': '''
rope_cache = precompute_rotary_emb(config.n_embd // config.n_head, config.block_size)
self.register_buffer("rope_cache", rope_cache)
''',
    'rotate q and k': '''
q = apply_rotary_emb(q, self.rope_cache)
k = apply_rotary_emb(k, self.rope_cache)
''',
    'write DownProjectBlock.__init__': '''
super().__init__()
self.C = nn.Parameter(torch.empty(1, config.bottleneck_dim, config.n_embd))
nn.init.xavier_uniform_(self.C)
self.attn = attention.CausalCrossAttention(config)
self.ln1 = nn.LayerNorm(config.n_embd)
self.ln2 = nn.LayerNorm(config.n_embd)
self.mlp = nn.Sequential(
    nn.Linear(config.n_embd, 4 * config.n_embd),
    nn.GELU(),
    nn.Linear(4 * config.n_embd, config.n_embd),
    nn.Dropout(config.resid_pdrop),
)
''',
    'write DownProjectBlock.forward': '''
C = self.C.repeat(x_input.size(0), 1, 1)  # (B, m, C)
y = C + self.attn(x_input, self.ln1(C))
y = y + self.mlp(self.ln2(y))
return y
''',
    'write UpProjectBlock.__init__': '''
super().__init__()
self.attn = attention.CausalCrossAttention(config)
self.ln1 = nn.LayerNorm(config.n_embd)
self.ln2 = nn.LayerNorm(config.n_embd)
self.mlp = nn.Sequential(
    nn.Linear(config.n_embd, 4 * config.n_embd),
    nn.GELU(),
    nn.Linear(4 * config.n_embd, config.n_embd),
    nn.Dropout(config.resid_pdrop),
)
''',
    'write UpProjectBlock.forward': '''
x = x_input + self.attn(self.ln1(y), x_input)
x = x + self.mlp(self.ln2(x))
return x
''',
}
EDITIONS = {'2021': ('synthesizer', []), '2023': ('perceiver', ['--bottleneck_dim', 64]),
            '2024': ('rope', [])}  # fmt: skip
STUB = re.compile(r'^(\s*)raise NotImplementedError\("\[part [a-g]\](?: \[part [a-g]\])* (.*)"\)$')


def fill(folder, getitem):
    """Writes an answer in place of every stub of the starter in `folder`; the span
    corruption's is `getitem`. Returns the answers' keys it used."""
    used = []
    for path in [*folder.glob('src/*.py'), folder / 'london_baseline.py']:
        lines = path.read_text(encoding='utf-8').split('\n')
        for number, line in enumerate(lines):
            match = STUB.match(line)
            if match:
                indent, said = match.groups()
                key = next(k for k in ANSWERS if said.startswith(k))
                body = getitem if key == 'write CharCorruptionDataset.__getitem__' else ANSWERS[key]
                lines[number] = '\n'.join(indent + b for b in body.strip('\n').split('\n'))
                used.append(key)
        path.write_text('\n'.join(lines), encoding='utf-8')
    return used


def our_getitem():
    """Our span corruption's body, as the starter cuts it out."""
    text = (ROOT / 'src' / 'dataset.py').read_text(encoding='utf-8')
    lines = text.split('\n')
    ((first, last, _),) = [r for r in starter.stubs(text, '2021') if r[0] != r[1]]
    return '\n'.join(line[8:] for line in lines[first - 1 : last])


def commands(variant, flags, precision):
    """The edition's commands, small: pretrain, finetune from it, and evaluate both on dev
    (a whole small corpus in each step: few shapes for bf16's kernels to be made for)."""
    common = [variant, 'wiki.txt', '--precision', precision, '--batch_size', 64, *flags]
    name = f'{variant}.{precision}'
    return [
        ['pretrain', *common, '--max_epochs', 3, '--writing_params_path', f'{name}.pretrain.params'],
        ['finetune', *common, '--max_epochs', 3, '--reading_params_path', f'{name}.pretrain.params',
         '--finetune_corpus_path', 'train.tsv', '--writing_params_path', f'{name}.finetune.params'],
    ] + [
        ['evaluate', *common, '--reading_params_path', f'{name}.{phase}.params',
         '--eval_corpus_path', 'dev.tsv', '--outputs_path', f'{name}.{phase}.predictions']
        for phase in ('pretrain', 'finetune')
    ]  # fmt: skip


def tiny_files(folder):
    text, people = tiny_corpus()
    rows = [f"Where was {n} born?\t{p}" for n, p in people.items()]
    folder.mkdir()
    (folder / 'wiki.txt').write_text(text, encoding='utf-8')
    (folder / 'train.tsv').write_text('\n'.join(rows[:12]) + '\n', encoding='utf-8')
    (folder / 'dev.tsv').write_text('\n'.join(rows[12:]) + '\n', encoding='utf-8')
    return folder


def assert_close_params(theirs, ours, tolerance):
    """Each tensor of the two params files within `tolerance` of each other, relative to its
    size (the norm of their difference over the norm of ours): Adam moves a weight by about
    the learning rate whatever its gradient's size, so a few weights whose tiny gradients
    rounding flips may differ by that much, while the tensor as a whole stays close."""
    a = torch.load(theirs, weights_only=True)
    b = torch.load(ours, weights_only=True)
    assert a.keys() == b.keys()
    for name in b:
        gap = (a[name].double() - b[name].double()).norm() / (b[name].double().norm() + 1e-12)
        assert gap <= tolerance, (name, gap.item())


@pytest.mark.parametrize('edition', EDITIONS)
@pytest.mark.slow
def test_a_textbook_answer_trains_like_ours_and_gets_full_marks(edition, tmp_path, real_data):
    variant, flags = EDITIONS[edition]
    folder = tmp_path / 'starter'
    starter.write_starter(edition, folder)
    used = fill(folder, our_getitem())
    assert used and all(key in ANSWERS for key in used)
    ours, theirs = tiny_files(tmp_path / 'ours'), tiny_files(tmp_path / 'theirs')
    for precision, tolerance in (('fp32', 1e-3), ('bf16', 2e-2)):
        for argv in commands(variant, flags, precision):
            argv = [str(a) for a in argv] + ['--device', 'cpu']
            assert main(*argv, '--edition', edition, cwd=ours) == 0
            done = subprocess.run(
                [sys.executable, str(folder / 'src' / 'run.py'), *argv],
                cwd=theirs, capture_output=True, text=True,
            )  # fmt: skip
            assert done.returncode == 0 and 'Traceback' not in done.stderr, done.stderr[-3000:]
        name = f'{variant}.{precision}'
        for params in (f'{name}.pretrain.params', f'{name}.finetune.params'):
            assert_close_params(theirs / params, ours / params, tolerance)
        answers = ''
        for phase in ('pretrain', 'finetune'):
            predictions = (theirs / f'{name}.{phase}.predictions').read_text(encoding='utf-8')
            assert predictions == (ours / f'{name}.{phase}.predictions').read_text(encoding='utf-8')
            answers += predictions.strip()
        assert answers  # the models do answer

    graded = tmp_path / 'graded'  # the same answers, with the textbook span corruption
    starter.write_starter(edition, graded)
    fill(graded, GETITEM)
    code_tests = {n for n, t in marking.tests_for(edition, False) if t.probes}
    rows = marking.grade(graded, edition, real_data, only=code_tests)
    assert len(rows) == len(code_tests)
    assert [(name, why) for name, score, points, why in rows if score < points] == []
