"""tools/reproduce.py: the whole assignment in one command, on a tiny corpus."""

import re
import shlex
import shutil

import pytest
import torch

import reproduce
from conftest import ROOT


def readme_command():
    """README's quick end-to-end reproduce.py command, as arguments."""
    section = (ROOT / 'README.md').read_text().split("## The handout's commands")[1]
    line = next(t for t in section.split('\n') if '--max_epochs 1' in t and 'reproduce' in t)
    return shlex.split(line.split('#')[0])


def test_reproduce_everything_then_only_what_is_missing_or_stale(tiny, monkeypatch, capsys):
    """The whole pipeline, then again after deleting two outputs: only those are made.
    Other settings in the same folder (a quick --max_epochs 1 check, then the handout's)
    are refused before any work, naming the file, also for an interrupted phase's state;
    an output whose params have changed since is made again."""
    for ours, handout in (
        ('train.tsv', 'birth_places_train.tsv'),
        ('dev.tsv', 'birth_dev.tsv'),
        ('test.tsv', 'birth_test_inputs.tsv'),
    ):
        shutil.copy(tiny / ours, tiny / handout)
    monkeypatch.chdir(tiny)
    # README's quick check, on the CPU in fp32 (as the suite's bit-for-bit checks are)
    command = readme_command()
    assert command[:2] == ['python', 'tools/reproduce.py'] and '--max_epochs' in command
    quick = command[2:] + ['--precision', 'fp32', '--outdir', 'out', '--device', 'cpu']
    reproduce.main(quick)
    out = capsys.readouterr().out
    for name in [
        'vanilla.model.params',
        'vanilla.pretrain.params',
        'vanilla.finetune.params',
        'synthesizer.pretrain.params',
        'synthesizer.finetune.params',
    ] + [
        f'{m}.{s}.predictions'
        for m in ('vanilla.nopretrain', 'vanilla.pretrain', 'synthesizer.pretrain')
        for s in ('dev', 'test')
    ]:
        assert (tiny / 'out' / name).exists(), name
    table = (tiny / 'out' / 'results.md').read_text()
    assert 'Machine: ' in table and '--max_epochs 1 for every training phase' in table
    rows = re.findall(r'^\| (.+?) \| (.*?) \| (.*?) \|$', table, re.M)
    assert len(rows) == 1 + 12  # header + the handout's 11 commands + London
    accuracies = {name: acc for name, acc, _ in rows if acc and name != 'phase'}
    assert set(accuracies) == {
        'vanilla.nopretrain: evaluate dev',
        'vanilla.pretrain: evaluate dev',
        'synthesizer.pretrain: evaluate dev',
        'London baseline',
    }
    assert all(re.fullmatch(r'\d+\.\d% \(\d+/4\)', a) for a in accuracies.values())
    assert out.count('exists, skipped') == 0

    (tiny / 'out' / 'synthesizer.finetune.params').unlink()
    (tiny / 'out' / 'synthesizer.pretrain.dev.predictions').unlink()
    reproduce.main(quick)
    out = capsys.readouterr().out
    assert out.count('exists, skipped') == 9
    assert '== synthesizer: finetune\n' in out and '== synthesizer.pretrain: evaluate dev\n' in out

    made = {p.name: p.stat().st_mtime_ns for p in (tiny / 'out').iterdir()}
    with pytest.raises(SystemExit) as stopped:
        reproduce.main(quick[2:])
    assert stopped.value.code == 2 and re.match(
        r"^error: out/vanilla.model.params was made with other settings: max_epochs "
        r"1 \(this command: the handout's\)\. Use another --outdir, or delete it",
        capsys.readouterr().err,
    )
    (tiny / 'out' / 'vanilla.model.params').rename(tiny / 'out' / 'vanilla.model.params.resume')
    with pytest.raises(SystemExit) as stopped:
        reproduce.main(quick + ['--seed', '1'])
    assert stopped.value.code == 2 and re.match(
        r"^error: out/vanilla.model.params.resume was made with other settings: "
        r"seed 0 \(this command: 1\)",
        capsys.readouterr().err,
    )
    (tiny / 'out' / 'vanilla.model.params.resume').rename(tiny / 'out' / 'vanilla.model.params')
    assert {
        p.name: p.stat().st_mtime_ns for p in (tiny / 'out').iterdir()
    } == made  # nothing touched

    params = torch.load(tiny / 'out' / 'synthesizer.pretrain.params', weights_only=True)
    params['head.weight'] += 0.01
    torch.save(params, tiny / 'out' / 'synthesizer.pretrain.params')
    reproduce.main(quick)
    out = capsys.readouterr().out
    assert out.count('exists, skipped') == 8 and out.count('redone, as its input changed') == 3
    assert (
        '== synthesizer: finetune: redone, as its input changed since out/synthesizer.finetune.params '
        'was made\n'
    ) in out


def test_a_record_that_is_not_json_is_one_line_before_any_work(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / 'out').mkdir()
    (tmp_path / 'out' / 'results.json').write_text('{"cut short": ')
    with pytest.raises(SystemExit) as stopped:
        reproduce.main(['--outdir', 'out', '--device', 'cpu'])
    err = capsys.readouterr().err
    assert (
        stopped.value.code == 2
        and err == 'error: out/results.json: not JSON; move it away to start afresh\n'
    )
    assert sorted(p.name for p in tmp_path.rglob('*')) == ['out', 'results.json']
