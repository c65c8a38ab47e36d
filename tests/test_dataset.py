"""Autograder-style properties of span corruption and NameDataset, on corpora built here."""

import random
import statistics

import pytest
import torch

import dataset
from conftest import tiny_corpus

PAD, MASK = '\u25a1', '\u2047'


def decode(ids, ds):
    return ''.join(ds.itos[int(i)] for i in ids)


@pytest.fixture
def long_docs():
    rng = random.Random(1)
    alphabet = 'abcdefghijklmnopqrstuvwxyz ,.'
    docs = [''.join(rng.choice(alphabet) for _ in range(rng.randint(150, 400))) for _ in range(50)]
    return '\n'.join(docs) + '\n'


def test_vocabulary():
    text = 'hello world\nbye\n'
    ds = dataset.CharCorruptionDataset(text, 16)
    assert ds.stoi[PAD] == 0 and ds.stoi[MASK] == 1
    assert [ds.itos[i] for i in range(2, ds.vocab_size)] == sorted(set(text))
    assert ds.vocab_size == len(set(text)) + 2
    assert all(ds.itos[ds.stoi[c]] == c for c in ds.stoi)
    assert ds.data == ['hello world', 'bye', ''] and len(ds) == 3
    assert ds.block_size == 16 and ds.PAD_CHAR == PAD and ds.MASK_CHAR == MASK


def test_real_wiki_vocabulary(real_data):
    ds = dataset.CharCorruptionDataset((real_data / 'wiki.txt').read_text(encoding='utf-8'), 128)
    assert ds.vocab_size == 256 and len(ds) == 2938 and ds.data[-1] == ''


def parse(ds, x, y):
    """Recover (prefix, masked, suffix, n_pads) from an example, checking its shape."""
    assert x.dtype == torch.long and y.dtype == torch.long
    assert x.shape == y.shape == (ds.block_size - 1,)
    assert torch.equal(x[1:], y[:-1])  # y is x shifted by one
    full = decode(x, ds) + decode(y[-1:], ds)
    assert len(full) == ds.block_size
    body = full.rstrip(PAD)
    assert PAD not in body
    prefix, suffix, masked = body.split(MASK)  # exactly two MASKs
    return prefix, masked, suffix, len(full) - len(body)


def test_span_corruption_format(long_docs):
    ds = dataset.CharCorruptionDataset(long_docs, 128)
    random.seed(0)
    for idx in range(len(ds) - 1):
        for _ in range(10):
            prefix, masked, suffix, pads = parse(ds, *ds[idx])
            truncated = prefix + masked + suffix
            assert ds.data[idx].startswith(truncated)
            assert 4 <= len(truncated) <= int(128 * 7 / 8)
            assert len(masked) >= 1


def test_every_truncation_length_occurs(long_docs):
    ds = dataset.CharCorruptionDataset(long_docs, 32)
    random.seed(0)
    lengths = set()
    for i in range(3000):
        prefix, masked, suffix, _ = parse(ds, *ds[i % 50])
        lengths.add(len(prefix + masked + suffix))
    assert lengths == set(range(4, int(32 * 7 / 8) + 1))


def test_masked_length_is_random_with_mean_a_quarter(long_docs):
    ds = dataset.CharCorruptionDataset(long_docs, 128)
    random.seed(0)
    by_length = {}
    fractions = []
    for i in range(20000):
        prefix, masked, suffix, _ = parse(ds, *ds[i % 50])
        n = len(prefix + masked + suffix)
        by_length.setdefault(n, set()).add(len(masked))
        fractions.append(len(masked) / n)
    assert abs(statistics.mean(fractions) - 0.25) < 0.01
    # for a given truncated length, the masked length varies above and below a quarter
    n = 80
    assert min(by_length[n]) < n / 4 < max(by_length[n])


def test_span_position_varies(long_docs):
    ds = dataset.CharCorruptionDataset(long_docs, 128)
    random.seed(0)
    examples = [parse(ds, *ds[0]) for _ in range(2000)]
    assert any(p == '' for p, _, _, _ in examples)
    assert any(s == '' for _, _, s, _ in examples)
    assert len({len(p) for p, _, _, _ in examples}) > 30


def test_short_and_empty_documents():
    ds = dataset.CharCorruptionDataset('ab\nxyz\n', 16)
    for idx, doc in enumerate(['ab', 'xyz', '']):
        for _ in range(20):
            prefix, masked, suffix, _ = parse(ds, *ds[idx])
            assert prefix + masked + suffix == doc


def test_name_dataset():
    text, people = tiny_corpus()
    ds = dataset.CharCorruptionDataset(text, 128)
    rows = [f"Where was {n} born?\t{p}" for n, p in people.items()]
    names = dataset.NameDataset(ds, '\n'.join(rows) + '\n')
    assert len(names) == len(rows)
    assert names.stoi is ds.stoi and names.block_size == 128
    for i, row in enumerate(rows):
        question, place = row.split('\t')
        x, y = names[i]
        assert x.shape == y.shape == (127,)
        xs, ys = decode(x, ds), decode(y, ds)
        assert xs == (question + MASK + place + MASK).ljust(127, PAD)
        # no loss on the question; then "MASK place MASK" and padding
        assert ys == PAD * (len(question) - 1) + (MASK + place + MASK).ljust(
            128 - len(question), PAD
        )
        assert torch.equal(x[len(question) :], y[len(question) - 1 : -1])


def test_name_dataset_drops_non_ascii():
    ds = dataset.CharCorruptionDataset('Where was born? Zurich Muller abc\n', 64)
    names = dataset.NameDataset(ds, 'Where was M\u00fcller born?\tZ\u00fcrich\n')
    x, _ = names[0]
    assert decode(x, ds).startswith('Where was Mller born?' + MASK + 'Zrich' + MASK)


def test_encode_looks_up_the_same_ids_as_the_plain_loop():
    """encode looks the characters up all at once by code point: the ids of
    [stoi[c] for c in text], and a KeyError naming the first character stoi lacks."""
    corpus = dataset.CharCorruptionDataset(tiny_corpus()[0], 32)
    chars = list(corpus.stoi)
    rng = random.Random(0)
    for length in (0, 1, 5, 127, 128):
        text = ''.join(rng.choice(chars) for _ in range(length))
        plain = torch.tensor([corpus.stoi[c] for c in text], dtype=torch.long)
        assert torch.equal(dataset.encode(text, corpus.stoi), plain)
    for bad, first in (('ab\u00e9c', '\u00e9'), ('a\U0001f600', '\U0001f600')):
        with pytest.raises(KeyError, match=repr(first)):
            dataset.encode(bad, corpus.stoi)
    other = {'a': 5, 'b': 7}  # another vocabulary gets its own table
    assert dataset.encode('ba', other).tolist() == [7, 5]
