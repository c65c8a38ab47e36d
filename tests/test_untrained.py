"""research/untrained.py: an untrained model's params, as run.py initialises it with --seed,
with a card that says so; grid.py finetunes it as it finetunes pretrained params."""

import json

import pytest
import torch

import dataset
import run
import untrained
from conftest import main


@pytest.mark.parametrize('variant', ['vanilla', 'perceiver'])
def test_the_params_are_run_pys_initialisation_with_the_seed(tiny, monkeypatch, variant):
    monkeypatch.chdir(tiny)
    untrained.main([variant, 'wiki.txt', '--seed', '4', '--writing_params_path', 'u.params'])
    written = torch.load(tiny / 'u.params', weights_only=True)
    args = run.parse_args(['pretrain', variant, 'wiki.txt', '--seed', '4'])
    built = run.build_model(
        args, dataset.CharCorruptionDataset((tiny / 'wiki.txt').read_text(), 128)
    )
    assert written.keys() == built.state_dict().keys()
    assert all(torch.equal(written[k], v) for k, v in built.state_dict().items())
    card = json.loads((tiny / 'u.params.json').read_text())
    assert (card['phase'], card['variant'], card['seed'], card['epochs']) == (
        'untrained',
        variant,
        4,
        0,
    )
    # the handout's finetune takes it as it takes pretrained params
    assert main('finetune', variant, 'wiki.txt', '--reading_params_path', 'u.params',
                '--writing_params_path', 'f.params', '--finetune_corpus_path', 'train.tsv',
                '--max_epochs', 1, cwd=tiny) == 0  # fmt: skip


def test_without_a_path_to_write_it_is_one_line(tiny, monkeypatch, capsys):
    monkeypatch.chdir(tiny)
    with pytest.raises(SystemExit) as stop:
        untrained.main(['vanilla', 'wiki.txt'])
    assert stop.value.code == 2
    assert capsys.readouterr().err == "error: --writing_params_path: where to write the params\n"
