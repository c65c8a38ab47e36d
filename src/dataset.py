"""The two datasets of the assignment, sharing one character vocabulary.

CharCorruptionDataset turns each line of the pretraining corpus into a span-corruption
example (handout part e); NameDataset turns each "question<TAB>place" line into a
finetuning example whose loss covers only the answer. Run as a script to see examples:

    python src/dataset.py namedata
    python src/dataset.py charcorruption
    python src/dataset.py charcorruption --index 2937 -1   # any documents (-1: the last)
    python src/dataset.py charcorruption --random 5        # five at random
"""

import argparse
import random
import signal
import sys

import numpy as np
import torch
from torch.utils.data import Dataset

from machinery import checks, files

PAD_CHAR = "\u25a1"  # id 0: never a target (the loss ignores id 0)
MASK_CHAR = "\u2047"  # id 1: marks where the masked span was, and where an answer starts and ends


class CharCorruptionDataset(Dataset):
    """Span corruption over the lines of `data` (handout part e).

    Example for the document "Khatchig Mouradian. Khatchig Mouradian is a journalist":
        [prefix]    "Khatchig Mouradian. Khatchig Mour"
        [masked]    "adian is a"
        [suffix]    " journalist"
    gives  prefix MASK suffix MASK masked PAD PAD ...  (padded_length characters, the
    edition's: run.py's EDITIONS), with x = that[:-1] and y = that[1:].
    """

    PAD_CHAR = PAD_CHAR
    MASK_CHAR = MASK_CHAR

    def __init__(self, data, block_size, padded_length=None):
        chars = sorted(set(data))
        assert self.MASK_CHAR not in chars and self.PAD_CHAR not in chars
        chars = [self.PAD_CHAR, self.MASK_CHAR] + chars
        self.stoi = {ch: i for i, ch in enumerate(chars)}
        self.itos = {i: ch for i, ch in enumerate(chars)}
        print('data has %d characters, %d unique.' % (len(data), len(chars)))
        self.block_size = block_size
        self.padded_length = padded_length or block_size
        self.vocab_size = len(chars)
        self.data = data.split('\n')

    def __len__(self):
        return len(self.data)

    # [part e]
    def __getitem__(self, idx):
        """Document idx as a span-corruption example: (x, y), each padded_length - 1 ids.
        Every document gets one: wiki.txt ends with a newline, so its last document is
        empty, and a few are shorter than 4 characters (`python src/dataset.py
        charcorruption --index -1` shows the last).
        1. Truncate the document to a random length: every length from 4 to
           int(block_size * 7/8) can be drawn (capped by the document's own length).
        2. Split that into prefix + masked + suffix, the masked length random and on average
           a quarter of the truncated length (so sometimes more, sometimes less).
        3. Rearrange into prefix MASK suffix MASK masked, padded with PAD to padded_length.
        4. x is that string without its last character, y without its first, encoded."""
        document = self.data[idx]
        # 1. Truncate to a length drawn uniformly from 4..block_size*7/8, so that every
        #    length can occur and the rearranged string (2 MASKs longer) always fits.
        truncated = document[: random.randint(4, int(self.block_size * 7 / 8))]
        # 2. Mask a span whose length has mean exactly len/4: draw a real length uniformly
        #    from [1, len/2 - 1] and round it up or down at random in proportion.
        #    Short documents (under 4 characters) get a single masked character.
        n = len(truncated)
        span = random.uniform(1, max(1, n / 2 - 1))
        masked_len = min(n, int(span + random.random()))
        start = random.randint(0, n - masked_len)
        prefix = truncated[:start]
        masked = truncated[start : start + masked_len]
        suffix = truncated[start + masked_len :]
        # 3. Rearrange, then pad.
        masked_string = prefix + self.MASK_CHAR + suffix + self.MASK_CHAR + masked
        masked_string += self.PAD_CHAR * (self.padded_length - len(masked_string))
        # 4. Predict each next character.
        return encode(masked_string[:-1], self.stoi), encode(masked_string[1:], self.stoi)


class NameDataset(Dataset):
    """Birth-place questions: x = question MASK place MASK PAD..., and y the same shifted
    by one, with the targets inside the question replaced by PAD so that only
    "MASK place MASK" is learned. Uses the pretraining dataset's vocabulary and block size."""

    def __init__(self, pretraining_dataset, data):
        self.MASK_CHAR = pretraining_dataset.MASK_CHAR
        self.PAD_CHAR = pretraining_dataset.PAD_CHAR
        self.itos = pretraining_dataset.itos
        self.stoi = pretraining_dataset.stoi
        self.block_size = pretraining_dataset.block_size
        # As the original does: drop non-ASCII characters, and the empty string after the
        # final newline.
        self.data = data.encode('utf-8').decode('ascii', errors='ignore').split('\n')
        if self.data and self.data[-1] == '':
            self.data.pop()

    def __len__(self):
        return len(self.data)

    def __getitem__(self, idx):
        question, place = self.data[idx].split('\t')
        x = question + self.MASK_CHAR + place + self.MASK_CHAR
        x = x + self.PAD_CHAR * (self.block_size - len(x))
        y = self.PAD_CHAR * (len(question) - 1) + x[len(question) :]
        return encode(x[:-1], self.stoi), encode(y, self.stoi)


def encode(text, stoi):
    """The ids of text's characters: torch.tensor([stoi[c] for c in text]), looked up all at
    once in a table by code point (a KeyError for a character stoi lacks, as that gives)."""
    table = lookup_table(stoi)
    points = np.frombuffer(
        text.encode('utf-32-le', 'surrogatepass'), dtype=np.uint32
    )  # (len(text),)
    ids = table[np.minimum(points, len(table) - 1)]  # (len(text),), -1 where unknown
    if (ids < 0).any():
        raise KeyError(text[int(np.argmax(ids < 0))])
    return torch.from_numpy(ids)  # (len(text),)


TABLES = {}  # id(stoi) -> (stoi, its table): a vocabulary's table is built once


def lookup_table(stoi):
    """An int64 array mapping each code point to its id in stoi, -1 for the others (the
    last entry, one past the highest code point, stands for every code point above)."""
    kept = TABLES.get(id(stoi))
    if kept is None or kept[0] is not stoi or len(kept[0]) != len(stoi):
        table = np.full(max(map(ord, stoi), default=0) + 2, -1, dtype=np.int64)
        for char, i in stoi.items():
            table[ord(char)] = i
        kept = TABLES[id(stoi)] = (stoi, table)
    return kept[1]


def decode(ids, itos):
    return ''.join(itos[int(i)] for i in ids)


if __name__ == '__main__':
    if hasattr(signal, 'SIGPIPE'):  # not on Windows
        signal.signal(
            signal.SIGPIPE, signal.SIG_DFL
        )  # `... | head` ends quietly, as shell tools do
    # PAD and MASK print as themselves, or as '?' where the output's encoding lacks them
    # (a Windows pipe or file), rather than stopping with UnicodeEncodeError
    sys.stdout.reconfigure(errors='replace')
    argp = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    argp.add_argument(
        'dataset_type',
        choices=['namedata', 'charcorruption'],
        help="Type of dataset to sample from.",
    )
    argp.add_argument(
        '--index', nargs='+', type=int, help="the examples of these lines (-1: the last)"
    )
    argp.add_argument('--random', type=int, metavar='N', help="the examples of N lines at random")
    args = argp.parse_args()

    path = 'birth_places_train.tsv' if args.dataset_type == 'namedata' else 'wiki.txt'
    try:  # a file missing, not the course's, or unreadable: one line
        texts = {name: files.read_text(name) for name in {'wiki.txt', path}}
    except files.UserError as e:
        sys.exit(files.report(e))
    corruption_dataset = CharCorruptionDataset(texts['wiki.txt'], 128)
    if args.dataset_type == 'namedata':
        dataset = NameDataset(corruption_dataset, texts[path])
    else:
        dataset = corruption_dataset
    chosen, n = args.index or [], len(dataset)
    if args.random:
        chosen += random.sample(range(n), min(args.random, n))
    for idx in chosen:
        if not -n <= idx < n:
            error = files.UserError(f"--index {idx}: there are {n} examples (0 to {n - 1})")
            sys.exit(files.report(error))
    for idx in chosen or range(4):
        try:
            x, y = dataset[idx]
        except Exception as e:  # which line, and why, in one line: no traceback
            error = files.UserError(checks.example_failure(dataset, idx, e, path))
            sys.exit(files.report(error))
        if chosen:
            line = dataset.data[idx]
            shown = repr(line[:60]) + ('...' if len(line) > 60 else '')
            print(f"example {idx % n} (the line {shown}):")
        print('x:', decode(x, dataset.itos))
        print('y:', decode(y, dataset.itos))
