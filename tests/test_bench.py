"""bench.py: evaluation is timed with the model of --params, whose variant and bottleneck
are the file's where the flags leave them out."""

import pytest
import torch

import bench
import dataset
from machinery import files


def test_the_decoding_model_is_the_params_files(params):
    corpus = dataset.CharCorruptionDataset((params / 'wiki.txt').read_text(encoding='utf-8'), 128)
    perceiver = str(params / 'perceiver.params')
    args = bench.parse_args(['--params', perceiver])
    gpt = bench.decoding_model(args, corpus)
    assert (args.variant, args.bottleneck_dim) == ('perceiver', 64)
    expected = torch.load(perceiver, weights_only=True)
    assert all(torch.equal(gpt.state_dict()[k], v) for k, v in expected.items())

    args = bench.parse_args([])  # untrained
    bench.decoding_model(args, corpus)
    assert (args.variant, args.bottleneck_dim) == ('vanilla', 32)

    args = bench.parse_args(['--params', perceiver, '--variant', 'rope'])
    with pytest.raises(files.UserError, match=r'holds a perceiver model, but the variant is rope$'):
        bench.decoding_model(args, corpus)
