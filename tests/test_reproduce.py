"""src/reproduce.py: the whole assignment in one command, on a tiny corpus."""
import re
import shutil

import reproduce


def test_reproduce_everything_then_only_what_is_missing(tiny, monkeypatch, capsys):
    for ours, handout in (('train.tsv', 'birth_places_train.tsv'), ('dev.tsv', 'birth_dev.tsv'),
                          ('test.tsv', 'birth_test_inputs.tsv')):
        shutil.copy(tiny / ours, tiny / handout)
    monkeypatch.chdir(tiny)
    reproduce.main(['--max_epochs', '1', '--outdir', 'out', '--precision', 'fp32'])
    out = capsys.readouterr().out
    for name in ['vanilla.model.params', 'vanilla.pretrain.params', 'vanilla.finetune.params',
                 'synthesizer.pretrain.params', 'synthesizer.finetune.params'] + \
            [f'{m}.{s}.predictions' for m in ('vanilla.nopretrain', 'vanilla.pretrain', 'synthesizer.pretrain')
             for s in ('dev', 'test')]:
        assert (tiny / 'out' / name).exists(), name
    table = (tiny / 'out' / 'results.md').read_text()
    assert 'Machine: ' in table and '--max_epochs 1 for every training phase' in table
    rows = re.findall(r'^\| (.+?) \| (.*?) \| (.*?) \|$', table, re.M)
    assert len(rows) == 1 + 12  # header + the handout's 11 commands + London
    accuracies = {name: acc for name, acc, _ in rows if acc and name != 'phase'}
    assert set(accuracies) == {'vanilla.nopretrain: evaluate dev', 'vanilla.pretrain: evaluate dev',
                               'synthesizer.pretrain: evaluate dev', 'London baseline'}
    assert all(re.fullmatch(r'\d+\.\d% \(\d+/4\)', a) for a in accuracies.values())
    assert out.count('exists, skipped') == 0

    (tiny / 'out' / 'synthesizer.finetune.params').unlink()
    (tiny / 'out' / 'synthesizer.pretrain.dev.predictions').unlink()
    reproduce.main(['--max_epochs', '1', '--outdir', 'out', '--precision', 'fp32'])
    out = capsys.readouterr().out
    assert out.count('exists, skipped') == 9
    assert '== synthesizer: finetune\n' in out and '== synthesizer.pretrain: evaluate dev\n' in out
