"""Answering questions fast, for evaluation: many questions at once, each step feeding
only the newest character and reusing the cached keys and values of the others. It gives
what utils.sample gives, the plain minGPT decoder that re-runs the whole prefix for every
character, up to the answer's closing MASK. run.py's evaluate calls answer_questions.
"""

import sys
from typing import NamedTuple

import torch
from torch.nn import functional as F

import dataset


def answer_questions(model, questions, pretrain_dataset, answer_length, where):
    """The greedy answer to each question: what the model writes between the question's
    MASK and the next one, in at most answer_length characters. `where` names the
    questions' file in warnings."""
    room = question_room(model.get_block_size(), answer_length)
    prompts = [encode_question(q, pretrain_dataset, room) for q in questions]
    warn_about_questions(prompts, where, room)
    mask = pretrain_dataset.MASK_CHAR
    ids = greedy_complete(
        model, [p.ids for p in prompts], answer_length, pretrain_dataset.stoi[mask]
    )
    return [dataset.decode(c, pretrain_dataset.itos).split(mask)[0] for c in ids]


@torch.no_grad()
def greedy_complete(model, prompts, steps, stop_id, batch_size=512):
    """Greedy completions of many prompts at once, equal to sample(model, p, steps) for
    each prompt p but up to the first `stop_id` generated (what follows it is never read).

    Prompts of the same length share a batch, so positions line up without padding; each
    step feeds only the newest character and reuses the cached keys/values of the rest.
    Every prompt plus `steps` must fit in the model's block size. Returns one list of
    generated ids per prompt, ending with stop_id if it was produced."""
    model.eval()
    device = next(model.parameters()).device
    completions = [None] * len(prompts)
    for p in prompts:
        assert len(p) + steps <= model.get_block_size(), 'prompt too long to complete'
    for batch in same_length_batches(prompts, batch_size):
        x = torch.stack([torch.as_tensor(prompts[i]) for i in batch]).to(device)  # (b, t)
        generated = _greedy_batch(model, x, steps, stop_id)
        for i, ids in zip(batch, generated):
            completions[i] = ids
    return completions


def same_length_batches(prompts, batch_size):
    """Lists of at most batch_size indices of prompts of one length: stacked, their
    positions line up without padding."""
    by_length = {}
    for i, p in enumerate(prompts):
        by_length.setdefault(len(p), []).append(i)
    for indices in by_length.values():
        for start in range(0, len(indices), batch_size):
            yield indices[start : start + batch_size]


def _greedy_batch(model, x, steps, stop_id):
    cache = model.new_cache()
    generated = torch.empty(x.size(0), 0, dtype=torch.long, device=x.device)  # (b, 0)
    done = torch.zeros(x.size(0), dtype=torch.bool, device=x.device)  # (b,)
    new = x
    for _ in range(steps):
        logits, _ = model(new, cache=cache)
        # softmax + topk exactly as sample() does, so near-ties break the same way
        _, new = torch.topk(F.softmax(logits[:, -1, :], dim=-1), k=1, dim=-1)  # (b, 1)
        generated = torch.cat((generated, new), dim=1)
        done |= new[:, 0] == stop_id
        if done.all():
            break
    result = []
    for row in generated.tolist():
        result.append(row[: row.index(stop_id) + 1] if stop_id in row else row)
    return result


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
