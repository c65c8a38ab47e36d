"""records.py: the record that reproduce.py and grid.py keep, the differences it names,
and the one line that ends a command of many phases."""

import hashlib
import re
import subprocess

import pytest

import records
from machinery import files, metrics, resume


def test_a_record_reads_back_as_written_and_a_file_has_its_md5(tmp_path):
    path = tmp_path / 'results.json'
    assert records.read_record(path) == {}
    records.write_record(path, {'phase': {'seconds': 1.5, 'made_with': {'seed': 0}}})
    assert records.read_record(path) == {'phase': {'seconds': 1.5, 'made_with': {'seed': 0}}}
    assert files.md5(path) == hashlib.md5(path.read_bytes()).hexdigest()
    assert re.fullmatch(r'[0-9a-f]{40}(\+changes)?', records.commit())


def test_differences_name_each_setting_and_each_flag_of_a_command():
    recorded = {'seed': 0, 'max_epochs': 1, 'finetune': ['vanilla', 'w.txt', '--lora_rank', '4']}
    made_with = {'seed': 0, 'max_epochs': None, 'finetune': ['vanilla', 'x.txt', '--resume']}
    assert records.differences(recorded, made_with) == (
        "max_epochs 1 (this command: the handout's), word 2 w.txt (this command: x.txt), "
        "--lora_rank 4 (this command: the handout's), --resume the handout's (this command: on)"
    )


@pytest.mark.parametrize(
    'stop, status, line',
    [
        (resume.TrainingInterrupted('interrupted at epoch 2, step 3'), 130,
         'interrupted at epoch 2, step 3. To continue: python research/grid.py --seeds 0 1'),
        (KeyboardInterrupt(), 130, 'interrupted. To continue: python research/grid.py --seeds 0 1'),
        (files.UserError('x.tsv, line 2: no tab'), 2, 'error: x.tsv, line 2: no tab'),
        (metrics.NonFiniteLoss('the loss became nan'), 1, 'error: the loss became nan'),
    ],
)  # fmt: skip
def test_what_stops_a_command_of_many_phases_is_one_line(stop, status, line, capsys):
    with pytest.raises(SystemExit) as stopped:
        with records.one_line_stops('research/grid.py', ['--seeds', '0', '1']):
            raise stop
    code = stopped.value.code
    said = code if isinstance(code, str) else capsys.readouterr().err.strip()
    assert (1 if isinstance(code, str) else code) == status and said == line


def test_the_commit_counts_new_code_as_a_change_and_outputs_not(tmp_path):
    git = lambda *a: subprocess.run(['git', *a], cwd=tmp_path, check=True, capture_output=True)
    git('init', '-q')
    (tmp_path / '.gitignore').write_text('*.params\n')
    git('add', '.gitignore')
    git('-c', 'user.name=t', '-c', 'user.email=t@t', 'commit', '-qm', 'first')
    head = records.commit(tmp_path)
    assert re.fullmatch(r'[0-9a-f]{40}', head)
    (tmp_path / 'v.params').write_text('ignored')
    (tmp_path / 'out').mkdir()
    (tmp_path / 'out' / 'results.json').write_text('{}')  # an output, not code
    assert records.commit(tmp_path) == head
    git('add', 'out/results.json')
    git('-c', 'user.name=t', '-c', 'user.email=t@t', 'commit', '-qm', 'results')
    head = records.commit(tmp_path)
    (tmp_path / 'out' / 'results.json').write_text('{"more": 1}')  # a tracked output rewritten
    assert records.commit(tmp_path) == head
    (tmp_path / 'src').mkdir()
    (tmp_path / 'src' / 'new_variant.py').write_text('x = 1\n')
    assert records.commit(tmp_path) == head + '+changes'
    (tmp_path / 'src' / 'new_variant.py').unlink()
    (tmp_path / '.gitignore').write_text('*.params\nx\n')  # a tracked file changed
    assert records.commit(tmp_path) == head + '+changes'
