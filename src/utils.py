"""Helpers the handout's scripts share: seeding, the plain minGPT sampler, and scoring
birth-place predictions. The fast batched decoder that evaluation uses is in decoding.py;
reading and writing files safely is in files.py.
"""

import random

import numpy as np
import torch
from torch.nn import functional as F

from machinery.files import read_lines


def set_seed(seed):
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.cuda.manual_seed_all(seed)


def top_k_logits(logits, k):
    v, ix = torch.topk(logits, k)
    out = logits.clone()
    out[out < v[:, [-1]]] = -float('Inf')
    return out


@torch.no_grad()
def sample(model, x, steps, temperature=1.0, sample=False, top_k=None):
    """The original minGPT sampler: take a conditioning sequence of indices x (of shape
    (b, t)) and predict the next index `steps` times, feeding each prediction back in and
    re-running the whole (cropped) context every time. Plain and slow; the reference
    that greedy_complete must match."""
    block_size = model.get_block_size()
    model.eval()
    for _ in range(steps):
        x_cond = x if x.size(1) <= block_size else x[:, -block_size:]  # crop context if needed
        logits, _ = model(x_cond)
        logits = logits[:, -1, :] / temperature  # (b, vocab)
        if top_k is not None:
            logits = top_k_logits(logits, top_k)
        probs = F.softmax(logits, dim=-1)
        if sample:
            ix = torch.multinomial(probs, num_samples=1)
        else:
            _, ix = torch.topk(probs, k=1, dim=-1)
        x = torch.cat((x, ix), dim=1)
    return x


def evaluate_places(filepath, predicted_places):
    """Computes percent of correctly predicted birth places.

    Arguments:
      filepath: path to a file with our name, birth place data.
      predicted_places: a list of strings representing the
          predicted birth place of each person.

    Returns: (total, correct), floats
    """
    lines = [x.strip().split('\t') for x in read_lines(filepath)]
    if len(lines[0]) == 1:
        print('No gold birth places provided; returning (0,0)')
        return (0, 0)
    true_places = [x[1] for x in lines]
    total = len(true_places)
    assert total == len(predicted_places)
    correct = len(list(filter(lambda x: x[0] == x[1], zip(true_places, predicted_places))))
    return (float(total), float(correct))
