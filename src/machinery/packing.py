"""Training on only the positions that can change the loss.

A pretraining batch is (B, T) rows padded with PAD, and PAD targets count for nothing;
attention is causal, so the positions after a row's last target cannot change any
counted target. Packing keeps each row up to its last target: GPT.forward (model.py), given
a Packing, runs the position-wise layers on the kept positions alone, as (N, C) rows, and
calls attention (the one layer that needs whole rows) through Packing.in_groups: on groups
of rows of similar length, each padded to its own longest row, as plain (b, width, C)
tensors. The trainer builds a Packing for every batch. The results equal those of the padded
batch up to rounding; only the time differs.
"""

import torch

from machinery.devices import to_device


class Packing:
    """The positions of a padded (B, T) batch that can affect the loss: for each row, the
    positions up to its last target. Attention is causal and PAD targets count for
    nothing, so the positions after that are dead work. The position-wise layers run on
    the kept positions only, as (N, C) rows. Attention needs padded rows, so it runs on
    groups of rows of similar length, each padded only to its own longest row.

    The index arithmetic runs on the CPU, where reading sizes back costs no GPU
    synchronisation; only the two index tensors are copied to `device`. The sizes are
    plain ints, so a Packing passes through DistributedDataParallel's input copying as it is."""

    def __init__(self, lengths, groups=8, device='cpu'):
        lengths = lengths.cpu()  # (B,)
        self.T = int(lengths.max())  # the batch, trimmed to its longest row
        order = lengths.argsort(descending=True, stable=True)
        order = order[lengths[order] > 0]
        index, slots, self.shapes, start = [], [], [], 0
        for rows in order.chunk(groups):
            n = lengths[rows]  # (b,) longest first
            width = int(n[0])
            positions = torch.arange(width, device=lengths.device)  # (width,)
            kept = (positions[None, :] < n[:, None]).flatten().nonzero().squeeze(1)  # (N_g,)
            index.append((rows[:, None] * self.T + positions[None, :]).flatten()[kept])
            slots.append(start + kept)
            self.shapes.append((len(rows), width))
            start += len(rows) * width
        self.index = to_device(
            torch.cat(index), device
        )  # (N,) where each packed position sits in the (B, T) batch
        self.slots = to_device(
            torch.cat(slots), device
        )  # (N,) where it sits in the groups, laid end to end

    def select(self, x):
        """(B, T, ...) batch tensor -> (N, ...) kept positions."""
        return x[:, : self.T].flatten(0, 1).index_select(0, self.index)

    def unpack(self, x):
        """(N, C) -> one zero-padded (b, width, C) tensor per group. One scatter for all
        groups: slicing x group by group would cost a full-size zero gradient per slice."""
        sizes = [b * width for b, width in self.shapes]
        padded = x.new_zeros(sum(sizes), x.size(-1)).index_copy(0, self.slots, x)
        return [
            part.view(b, width, -1) for part, (b, width) in zip(padded.split(sizes), self.shapes)
        ]

    def repack(self, padded):
        """The inverse of unpack."""
        return torch.cat([y.flatten(0, 1) for y in padded]).index_select(0, self.slots)  # (N, C)

    def in_groups(self, layer, x):
        """layer, which takes and gives (b, width, C) rows whose positions start at 0 (an
        attention, or the perceiver's blocks), on the packed rows x (N, C): group by group,
        each padded to its longest row. Padding comes after a row's positions, and a causal
        layer's outputs there are cut again, so the kept outputs are those of the rows
        alone."""
        return self.repack([layer(group) for group in self.unpack(x)])  # (N, C)


def target_lengths(targets):
    """(B, T) targets -> (B,) each row's last non-PAD target position + 1 (0 if none):
    the positions that can affect the loss."""
    positions = torch.arange(1, targets.size(1) + 1, device=targets.device)  # (T,)
    return (positions * (targets != 0)).amax(dim=1)  # (B,)


def target_count(targets):
    """How many targets of a (B, T) batch count: those that are not PAD."""
    return int((targets != 0).sum())
