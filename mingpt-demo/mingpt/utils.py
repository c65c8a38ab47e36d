"""Helpers: seeding every random number generator, and sampling text from a trained GPT."""

import random

import numpy as np
import torch
from torch.nn import functional as F


def set_seed(seed):
    """Seed Python, NumPy and PyTorch (CPU and all GPUs) so runs are repeatable."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.cuda.manual_seed_all(seed)


def top_k_logits(logits, k):
    """Keep the k largest logits of each row and set all others to -inf.

    Scattering the top-k values into a tensor of -inf keeps exactly k entries,
    even when several logits tie with the k-th largest one.
    """
    v, ix = torch.topk(logits, k)  # (B, k)
    out = torch.full_like(logits, -float("inf"))  # (B, vocab_size)
    out.scatter_(-1, ix, v)
    return out


@torch.no_grad()
def sample(model, x, steps, temperature=1.0, sample=False, top_k=None):
    """Take a conditioning sequence of indices x (of shape (b, t)) and predict the next token
    in the sequence, feeding the predictions back into the model each time. Clearly the
    sampling has quadratic complexity, unlike an RNN that is only linear, and has a finite
    context window of block_size, unlike an RNN that has an infinite context window.
    """
    block_size = model.get_block_size()
    model.eval()
    for _ in range(steps):
        # the model cannot see further back than block_size, so crop the context if needed
        x_cond = x if x.size(1) <= block_size else x[:, -block_size:]  # (b, <= block_size)
        logits, _ = model(x_cond)  # (b, t, vocab_size)
        # only the prediction at the last position matters; temperature sharpens or flattens it
        logits = logits[:, -1, :] / temperature  # (b, vocab_size)
        # optionally crop probabilities to only the top k options
        if top_k is not None:
            logits = top_k_logits(logits, top_k)
        probs = F.softmax(logits, dim=-1)  # (b, vocab_size)
        # sample from the distribution or take the most likely
        if sample:
            ix = torch.multinomial(probs, num_samples=1)  # (b, 1)
        else:
            _, ix = torch.topk(probs, k=1, dim=-1)  # (b, 1)
        # append to the sequence and continue
        x = torch.cat((x, ix), dim=1)  # (b, t + 1)

    return x
