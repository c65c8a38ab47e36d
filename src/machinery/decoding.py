"""Answering questions fast, for evaluation: many questions at once, each step feeding
only the newest character to every layer but attention, which is given its earlier inputs
again (Cache). It gives what utils.sample gives, the plain minGPT decoder that re-runs the
whole prefix for every character, up to the answer's closing MASK. run.py's evaluate calls
answer_questions.
"""

import contextlib
import functools
import sys
from typing import NamedTuple

import torch
import torch.nn as nn
from torch.nn import functional as F

from machinery import metrics


def answer_questions(model, questions, pretrain_dataset, answer_length, where, bar=False):
    """The greedy answer to each question: what the model writes between the question's
    MASK and the next one, in at most answer_length characters. `where` names the
    questions' file in warnings; with `bar`, a progress bar counts the questions answered
    (metrics.question_bar)."""
    room = question_room(model.get_block_size(), answer_length)
    prompts = [encode_question(q, pretrain_dataset, room) for q in questions]
    warn_about_questions(prompts, where, room)
    mask = pretrain_dataset.MASK_CHAR
    with metrics.question_bar(len(questions), shown=bar) as progress:
        ids = greedy_complete(
            model,
            [p.ids for p in prompts],
            answer_length,
            pretrain_dataset.stoi[mask],
            answered=progress.update,
        )
    return [''.join(pretrain_dataset.itos[i] for i in c).split(mask)[0] for c in ids]


@torch.no_grad()
def greedy_complete(model, prompts, steps, stop_id, batch_size=64, answered=None):
    """Greedy completions of many prompts at once, equal to sample(model, p, steps) for
    each prompt p but up to the first `stop_id` generated (what follows it is never read).

    Prompts are batched by length, each row padded on the right: the model is causal, so
    what stands after a row's last character changes nothing before it, and each row's
    next character is read at its own last position. A model that decodes with a Cache
    is fed only each row's newest character after the prompts; the perceiver is fed the
    whole sequence again. A row that has produced stop_id leaves the batch.
    Every prompt plus `steps` must fit in the model's block size. Returns one list of
    generated ids per prompt, ending with stop_id if it was produced; answered(n), if
    given, is called as n more prompts are complete."""
    model.eval()
    device = next(model.parameters()).device
    completions = [None] * len(prompts)
    for p in prompts:
        assert len(p) + steps <= model.get_block_size(), 'prompt too long to complete'
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    for start in range(0, len(order), batch_size):
        batch = order[start : start + batch_size]
        generated = _greedy_batch(
            model, [prompts[i] for i in batch], steps, stop_id, device, answered or _ignore
        )
        for i, ids in zip(batch, generated):
            completions[i] = ids
    return completions


def _ignore(_):
    pass


def _greedy_batch(model, prompts, steps, stop_id, device, answered):
    lengths = torch.tensor([len(p) for p in prompts], device=device)  # (b,)
    ids = torch.zeros(len(prompts), int(lengths.max()) + steps, dtype=torch.long, device=device)
    for row, p in enumerate(prompts):
        ids[row, : len(p)] = torch.as_tensor(p)
    ends = lengths.clone()  # (b,) each row's length so far
    live = torch.arange(len(prompts), device=device)  # (n,) the rows still decoding
    cache = Cache() if model.decodes_with_cache else None
    for step in range(steps):
        if cache is None or step == 0:  # the whole sequences so far, from position 0
            fed = ids[live, : int(ends[live].max())]  # (n, T)
            positions = torch.arange(fed.size(1), device=device).expand_as(fed)  # (n, T)
        else:  # each row's newest character, at its own position
            positions = (ends[live] - 1)[:, None]  # (n, 1)
            fed = ids[live[:, None], positions]  # (n, 1)
        if cache is not None:
            cache.feed(positions)
        logits, _ = model(fed, cache=cache)  # (n, T, vocab)
        last = logits[torch.arange(len(live)), ends[live] - 1 - positions[:, 0]]  # (n, vocab)
        # softmax + topk exactly as sample() does, so near-ties break the same way
        _, new = torch.topk(F.softmax(last, dim=-1), k=1, dim=-1)  # (n, 1)
        ids[live, ends[live]] = new[:, 0]
        ends[live] += 1
        going = new[:, 0] != stop_id  # (n,)
        if not going.all():  # a row that has its stop_id is done
            rows = len(live)
            live = live[going]
            answered(rows - len(live))  # counted from the shapes: no wait for the device
            if cache is not None:
                cache.keep(going)
        if len(live) == 0:
            break
    answered(len(live))  # the rows that reached `steps` characters
    return [
        row[start:end] for row, start, end in zip(ids.tolist(), lengths.tolist(), ends.tolist())
    ]


class Cache:
    """What greedy decoding keeps between steps, so that each step feeds only the newest
    character of each row: every attention layer's inputs at the positions so far.
    GPT.forward, given a Cache, embeds the fed characters at `positions` (b, t), the
    decoder's, and calls each attention through attention(): on the layer's whole input
    sequences, from position 0, in the handout's (B, T, C) shape, keeping only the outputs at
    the fed positions. A causal attention's outputs there are those of the full
    computation; every other layer works position by position, on the fed ones alone.
    The attention's own linear layers are not run again on positions whose input is
    unchanged (remembered)."""

    def __init__(self):
        self.positions = None  # (b, t): where the fed characters stand in their rows
        self.width = None  # the longest row so far: the last fed position + 1
        self.first_fed = None  # the first fed position: no row is fed before it
        self.inputs = {}  # block number -> (b, width, C): its attention's inputs so far
        self.outputs = {}  # (block number, linear's name) -> (its input, its output)

    def feed(self, positions):
        """The positions (b, t) of the characters fed next, read once for every layer."""
        self.positions = positions
        self.width = int(positions.max()) + 1
        self.first_fed = int(positions.min())

    def keep(self, rows):
        """Keeps only the rows where the bool tensor `rows` is True (the others are done)."""
        self.inputs = {layer: seen[rows] for layer, seen in self.inputs.items()}
        self.outputs = {key: (x[rows], out[rows]) for key, (x, out) in self.outputs.items()}

    def attention(self, layer):
        """Block.forward's `around` for the attention of block number `layer`."""

        def around(attn, h):
            b, t, C = h.size()
            rows = torch.arange(b, device=h.device)[:, None]  # (b, 1)
            whole = h.new_zeros(b, self.width, C)  # (b, width, C)
            seen = self.inputs.get(layer)
            if seen is not None:
                kept = min(seen.size(1), whole.size(1))
                whole[:, :kept] = seen[:, :kept]
            whole[rows, self.positions] = h  # after a row's end: unused, causal attention
            self.inputs[layer] = whole
            with self.remembered(attn, layer):
                return attn(whole)[rows, self.positions]  # (b, t, C)

        return around

    @contextlib.contextmanager
    def remembered(self, attn, layer):
        """While attn runs, each nn.Linear in it computes only the positions from the first
        fed one, where its input before that is its last call's (Cache.linear)."""
        linears = [(n, m) for n, m in attn.named_modules() if isinstance(m, nn.Linear)]
        for name, linear in linears:
            linear.forward = functools.partial(self.linear, linear, (layer, name))
        try:
            yield
        finally:
            for _, linear in linears:
                del linear.forward  # the class's forward again

    def linear(self, linear, key, x):
        """linear(x), its outputs at the positions before the first fed one taken from its
        last call where its input there is the same, bit for bit (so are the outputs)."""
        compute = functools.partial(type(linear).forward, linear)
        last = self.outputs.get(key)
        same = self.first_fed  # the positions no row is fed at
        if (
            last is None
            or x.dim() != 3
            or last[0].size(1) < same
            or x.shape[::2] != last[0].shape[::2]
            or not torch.equal(x[:, :same], last[0][:, :same])
        ):
            same = 0
        out = compute(x) if same == 0 else torch.cat((last[1][:, :same], compute(x[:, same:])), 1)
        self.outputs[key] = (x, out)
        return out


def question_room(block_size, answer_length):
    """How many characters of a question fit: the block less the MASK after it, the
    answer, and one more, as the synthesizer has block_size-1 positions."""
    return block_size - 2 - answer_length


class Question(NamedTuple):
    ids: torch.Tensor  # question + MASK, encoded
    unknown: int  # characters dropped for being outside the vocabulary
    cut: bool  # whether the question was shortened to fit the context


def encode_question(question, pretrain_dataset, room):
    """question + MASK as ids. Characters outside the vocabulary are dropped, and a question
    longer than `room` characters keeps only its end (as the original's context cropping
    would), leaving room for the answer."""
    stoi = pretrain_dataset.stoi
    known = [c for c in question if c in stoi]
    ids = [stoi[c] for c in known[-room:]] + [stoi[pretrain_dataset.MASK_CHAR]]
    return Question(
        torch.tensor(ids, dtype=torch.long), len(question) - len(known), len(known) > room
    )


def warn_about_questions(prompts, path, room):
    unknown = sum(1 for p in prompts if p.unknown)
    if unknown:
        print(
            f"warning: {path}: {unknown} question(s) contain characters outside the vocabulary; "
            f"those characters were dropped",
            file=sys.stderr,
        )
    cut = sum(1 for p in prompts if p.cut)
    if cut:
        print(
            f"warning: {path}: {cut} question(s) are too long for the context; only their "
            f"last {room} characters were used",
            file=sys.stderr,
        )
