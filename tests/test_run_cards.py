"""run_cards.py: the card run.py writes beside each params file, and what reads it."""

import json
import shutil

import run
from conftest import main
from machinery import params_files, run_cards


def test_a_card_says_how_the_params_were_made_and_a_replaced_file_loses_it(tiny):
    argv = ['pretrain', 'rope', 'wiki.txt', '--writing_params_path', 'r.params', '--seed', '2']
    assert main(*argv, '--max_epochs', 1, '--batch_size', 16, cwd=tiny) == 0
    card = json.loads((tiny / 'r.params.json').read_text())
    text = run.files.read_text(str(tiny / 'wiki.txt'))
    assert card == {
        'phase': 'pretrain', 'variant': 'rope', 'bottleneck_dim': None, 'edition': '2024',
        'seed': 2, 'epochs': 1, 'batch_size': 16, 'batches': 'stream', 'batch_seed': None,
        'corpus': 'wiki.txt', 'corpus_md5': run_cards.text_md5(text),
        'params_md5': run_cards.file_md5(tiny / 'r.params'),
    }  # fmt: skip
    assert run_cards.read(str(tiny / 'r.params')) == card
    assert params_files.variant_and_bottleneck(str(tiny / 'r.params')) == ('rope', 32)
    # other params copied over the file: the card is another file's, and is not read
    assert main('pretrain', 'vanilla', 'wiki.txt', '--writing_params_path', 'v.params',
                '--max_epochs', 1, '--batch_size', 16, cwd=tiny) == 0  # fmt: skip
    shutil.copy(tiny / 'v.params', tiny / 'r.params')
    assert run_cards.read(str(tiny / 'r.params')) is None
    assert params_files.variant_and_bottleneck(str(tiny / 'r.params')) == ('vanilla', 32)
