"""grid.py --cluster slurm on a real one-node Slurm (tests/slurm_cluster.py): the same grid
gives the same records and predictions as here, a job requeued mid-pretraining (by
`scontrol requeue`, or by the time limit's warning) resumes to the params of an uninterrupted
run, and a cancelled job is reported and submitted again alone. And what lets many
processes share one --outdir: grid.json's entries saved under its lock, and the runs it
finds without an entry made again."""

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

import grid
import records
import slurm_grid
from conftest import PYTHON, ROOT, wait_for
from machinery import files
from slurm_cluster import start_now

TINY = ['--seeds', '0', '--max_epochs', '1', '--finetune_corpus_path', 'train.tsv',
        '--eval_corpus_path', 'dev.tsv', '--test_corpus_path', 'test.tsv', '--device', 'cpu',
        '--precision', 'fp32']  # fmt: skip
GRID = ['--pretrain', 'vanilla', 'synthesizer', '--pretrain_seeds', '0', '1',
        '--pretrain_max_epochs', '10', *TINY]  # fmt: skip
ON_SLURM = ['--cluster', 'slurm', '--slurm_gpus', '0', '--slurm_cpus', '1', '--slurm_mem_gb', '1',
            '--slurm_minutes', '10']  # fmt: skip

# grid.py --cluster slurm as its command line runs it, except that each job's pretraining
# of the groups named in argv[1] holds after step 3 (tests/hold_at_step.py) until a stop
# signal reaches it, the first time only (its marker then exists): the job's function is
# this script's, which Slurm's node unpickles by value (cloudpickle), the module's by name
HELD_ON_SLURM = f"""
import os
import sys
sys.path.insert(0, {str(ROOT / 'research')!r})
import grid
import slurm_grid
slurm_grid.POLL_SECONDS = 1
held_groups = sys.argv[1].split(',')
run_group = slurm_grid.run_group

def held_run_group(argv):
    command_of = grid.group_command
    def held(group):
        command, log = command_of(group)
        name = os.path.basename(log).removesuffix('.pretrain.log')
        marker = os.path.join(os.path.dirname(log), 'held-' + name)
        if name not in held_groups or os.path.exists(marker + '.0'):
            return command, log
        return [command[0], {str(ROOT / 'tests' / 'hold_at_step.py')!r}, '3', marker,
                *command[1:]], log
    grid.group_command = held
    run_group(argv)

slurm_grid.run_group = held_run_group
grid.main(sys.argv[2:])
"""


def on_slurm(tiny, argv, held=()):
    """grid.py --cluster slurm ARGV from `tiny`, in the background."""
    return subprocess.Popen([PYTHON, '-c', HELD_ON_SLURM, ','.join(held) or '-', *argv],
                            cwd=tiny, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)  # fmt: skip


def job_of(tiny, outdir, name, process):
    """The Slurm job id of the grid's group `name`, once it is submitted."""
    wait_for(tiny / outdir / 'slurm' / 'jobs.json', process)
    return json.loads((tiny / outdir / 'slurm' / 'jobs.json').read_text())[name]


FIGURES = ('dev_correct', 'dev_total', 'params_md5', 'final_loss', 'trainable', 'parameters')


def figures(record):
    return {key: {f: e[f] for f in FIGURES if f in e} for key, e in record.items()}


@pytest.mark.slow
def test_a_grid_through_slurm_is_the_grid_run_here_requeues_and_all(tiny, slurm, monkeypatch):
    """Two variants x two pretraining seeds: four jobs, two at a time on the node's two CPUs.
    vanilla.s0's job is requeued by `scontrol requeue` and synthesizer.s1's by the time
    limit's warning (SIGUSR2), each mid-pretraining: both resume from their saved state,
    and every params file, prediction and figure is the uninterrupted local run's."""
    monkeypatch.chdir(tiny)
    grid.main([*GRID, '--outdir', 'here'])
    process = on_slurm(tiny, [*GRID, '--outdir', 'there', *ON_SLURM],
                       held=('vanilla.s0', 'synthesizer.s1'))  # fmt: skip
    requeued = {'vanilla.s0': ['scontrol', 'requeue'],
                'synthesizer.s1': ['scancel', '--signal=USR2']}  # fmt: skip
    for name, command in requeued.items():
        job = job_of(tiny, 'there', name, process)
        wait_for(tiny / 'there' / f'held-{name}.0', process, seconds=300)
        subprocess.run([*command, job], check=True)
        start_now(job)
    out, err = process.communicate(timeout=600)
    assert process.returncode == 0, out + err
    for name in ('vanilla.s0', 'vanilla.s1', 'synthesizer.s0', 'synthesizer.s1'):
        assert f'== {name}: done (Slurm job ' in out
    here = json.loads((tiny / 'here' / 'grid.json').read_text())
    there = json.loads((tiny / 'there' / 'grid.json').read_text())
    assert figures(there) == figures(here) and len(here) == 8
    for path in (tiny / 'here').iterdir():
        if path.name.endswith(('.params', '.predictions')):
            assert (tiny / 'there' / path.name).read_bytes() == path.read_bytes(), path.name
    for name in requeued:
        log = (tiny / 'there' / f'{name}.pretrain.log').read_text()
        assert f'resuming from there/{name}.pretrain.params.resume: epoch' in log, log
    jobs = json.loads((tiny / 'there' / 'slurm' / 'jobs.json').read_text())
    for name, job in jobs.items():  # each job started twice if requeued, else once
        said = (tiny / 'there' / 'slurm' / f'{job}_0_log.out').read_text()
        assert said.count('submitit INFO') and said.count('Starting with JobEnvironment') == (
            2 if name in requeued else 1
        ), (name, said)
    accuracies = lambda folder: [line.split(',')[5:8] for line in
                                 (tiny / folder / 'grid.csv').read_text().splitlines()]  # fmt: skip
    assert accuracies('there') == accuracies('here')


@pytest.mark.slow
def test_a_cancelled_job_is_reported_and_submitted_again_alone(tiny, slurm):
    argv = ['--pretrain', 'vanilla', '--pretrain_seeds', '0', '1', '--pretrain_max_epochs', '10',
            *TINY, '--outdir', 'g', *ON_SLURM]  # fmt: skip
    process = on_slurm(tiny, argv, held=('vanilla.s1',))
    job = job_of(tiny, 'g', 'vanilla.s1', process)
    wait_for(tiny / 'g' / 'held-vanilla.s1.0', process, seconds=300)
    # the same command meanwhile: it says which job still runs, submits nothing, follows it
    meanwhile = on_slurm(tiny, argv)
    said = []
    while not said or not said[-1].startswith('== following'):
        said.append(meanwhile.stdout.readline())
        assert said[-1], meanwhile.communicate()
    assert f'== vanilla.s1: still in Slurm as job {job} (RUNNING)\n' in said
    assert json.loads((tiny / 'g' / 'slurm' / 'jobs.json').read_text())['vanilla.s1'] == job
    subprocess.run(['scancel', job], check=True)
    out, err = process.communicate(timeout=600)
    meanwhile.communicate(timeout=600)
    assert meanwhile.returncode == 2
    assert process.returncode == 2, out + err
    assert '== vanilla.s0: done (Slurm job ' in out
    assert (
        f"== vanilla.s1: Slurm job {job} ended without its results: g/slurm/{job}_0_log.err: "
        f"interrupted. To continue: the grid's --cluster slurm command, which submits it again\n"
    ) in out
    assert err == (
        "error: 1 Slurm job ended without its results (vanilla.s1): the same command "
        "submits again what is missing\n"
    )
    assert (tiny / 'g' / 'vanilla.s1.pretrain.params.resume').exists()

    process = on_slurm(tiny, argv)
    out, err = process.communicate(timeout=600)
    assert process.returncode == 0, out + err
    assert '== vanilla.s0: done, skipped' in out
    assert f'== vanilla.s1: Slurm job {job} ended without its results (' in out
    assert out.count(': Slurm job ') == 2  # the report, and its one new job
    assert '== vanilla.s1: done (Slurm job ' in out
    pretrain_log = (tiny / 'g' / 'vanilla.s1.pretrain.log').read_text()
    assert 'resuming from g/vanilla.s1.pretrain.params.resume' in pretrain_log
    record = json.loads((tiny / 'g' / 'grid.json').read_text())
    assert record['vanilla.s1 full s0']['dev_total'] == 4


@pytest.mark.slow
def test_jobs_that_sbatch_refuses_are_one_line(tiny, slurm, monkeypatch, capsys):
    monkeypatch.chdir(tiny)
    with pytest.raises(SystemExit) as stopped:
        grid.main([*GRID, '--outdir', 'g', *ON_SLURM, '--slurm_partition', 'nowhere'])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith('error: sbatch refused the jobs: ') and 'partition' in err.lower(), err
    assert err.count('\n') == 1 and not (tiny / 'g' / 'slurm' / 'jobs.json').exists()


# --- Many writers, and no cluster needed --------------------------------------------------

SAVES = """
import sys
sys.path.insert(0, {tools!r})
import records
record = records.SharedRecord(sys.argv[1])
for i in range(30):
    record[f'{{sys.argv[2]}} {{i}}'] = {{'i': i}}
    record.save()
"""


@pytest.mark.slow
def test_processes_saving_one_record_at_once_keep_every_entry(tmp_path):
    path = tmp_path / 'grid.json'
    script = SAVES.format(tools=str(ROOT / 'tools'))
    processes = [subprocess.Popen([PYTHON, '-c', script, str(path), f'p{n}']) for n in range(4)]
    assert [p.wait(timeout=120) for p in processes] == [0] * 4
    record = json.loads(path.read_text())
    assert sorted(record) == sorted(f'p{n} {i}' for n in range(4) for i in range(30))


def test_a_record_saves_its_own_entries_over_the_files_and_sees_the_others(tmp_path):
    path = str(tmp_path / 'grid.json')
    mine, theirs = records.SharedRecord(path), records.SharedRecord(path)
    mine['a'] = {'x': 1}
    mine.save()
    theirs['b'] = {'y': 2}
    theirs.save()  # a's entry is kept, and seen
    assert theirs == {'a': {'x': 1}, 'b': {'y': 2}}
    entry = mine.entry('a')
    entry['z'] = 3
    mine.save()
    assert records.read_record(path) == {'a': {'x': 1, 'z': 3}, 'b': {'y': 2}}
    theirs['a'] = {'replaced': True}  # entries are whole: the last one saved is kept
    theirs.save()
    mine.reread()
    assert mine['a'] == {'x': 1, 'z': 3} and mine['b'] == {'y': 2}


PARAMS_GRID = ['--pretrained', 'vanilla.params', '--methods', 'full', '--max_epochs', '1',
               '--finetune_corpus_path', 'train.tsv', '--eval_corpus_path', 'dev.tsv',
               '--test_corpus_path', 'test.tsv', '--outdir', 'g', '--device', 'cpu',
               '--precision', 'fp32']  # fmt: skip


@pytest.mark.slow
def test_two_commands_on_one_outdir_keep_every_record(params):
    """The researcher's mistake that lost a record: `--seeds 0` and `--seeds 1` at once."""
    command = [PYTHON, str(ROOT / 'research' / 'grid.py'), *PARAMS_GRID, '--seeds']
    processes = [subprocess.Popen([*command, seed], cwd=params, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for seed in '01']  # fmt: skip
    for p in processes:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, out + err
    record = json.loads((params / 'g' / 'grid.json').read_text())
    assert record['vanilla full s0']['dev_total'] == 4
    assert record['vanilla full s1']['dev_total'] == 4
    again = subprocess.run([*command, '0', '1'], cwd=params, capture_output=True, text=True)
    assert again.returncode == 0, again.stderr
    assert again.stdout.count('exist, skipped') == 2
    assert re.search(r'^\| vanilla \| full \| [\d,]+ \| 2 \|', again.stdout, re.M)


def test_params_found_without_a_record_are_made_again(params, monkeypatch, capsys):
    monkeypatch.chdir(params)
    grid.main([*PARAMS_GRID, '--seeds', '0'])
    path = params / 'g' / 'grid.json'
    path.write_text('{}')  # the entry lost, as two commands without the lock lost it
    capsys.readouterr()
    grid.main([*PARAMS_GRID, '--seeds', '0'])
    out = capsys.readouterr().out
    assert out.count('finetune from pretrained done') == 1
    assert json.loads(path.read_text())['vanilla full s0']['dev_total'] == 4


@pytest.mark.slow
def test_a_pretraining_found_without_a_record_is_made_again(tiny, monkeypatch, capsys):
    monkeypatch.chdir(tiny)
    argv = ['--pretrain', 'vanilla', '--pretrain_max_epochs', '1', *TINY, '--outdir', 'p']
    (tiny / 'p').mkdir()
    (tiny / 'p' / 'vanilla.s0.pretrain.params').write_bytes(b'not these')
    grid.main(argv)
    out = capsys.readouterr().out
    assert 'p/vanilla.s0.pretrain.params has no record in grid.json: pretrained again' in out
    record = json.loads((tiny / 'p' / 'grid.json').read_text())
    assert record['vanilla.s0 pretrain']['params_md5'] == files.md5('p/vanilla.s0.pretrain.params')


def test_every_flag_of_the_grid_reaches_its_jobs_or_is_the_clusters():
    """A flag added to grid.py and forgotten in slurm_grid.common_argv would give the jobs
    the default: every flag is passed on, names which runs a job makes, or is --cluster's."""
    args = grid.parse_args(['--pretrain', 'vanilla', '--precision', 'fp32'])
    passed = {a.removeprefix('--') for a in slurm_grid.common_argv(args) if a.startswith('--')}
    which_runs = {'pretrain', 'pretrain_seeds', 'pretrained'}
    here_only = {'jobs', 'plot'}  # local processes; the picture, drawn by the command itself
    cluster = {name for name in vars(args) if name.startswith('slurm_')} | {'cluster'}
    unset = {
        'pretrain_max_epochs',
        'pretrain_batch_size',
        'pretrain_edition',
        'max_epochs',
        'batch_size',
        'finetune_lr',
        'lora_alpha',
    }  # None: left out
    assert set(vars(args)) - passed == which_runs | here_only | cluster | unset
    given = {
        'pretrain_max_epochs': '2',
        'pretrain_batch_size': '7',
        'pretrain_edition': '2021',
        'max_epochs': '3',
        'batch_size': '4',
        'finetune_lr': '0.5',
        'lora_alpha': '16.0',
    }
    flags = [f'--{name}={value}' for name, value in given.items()]
    argv = slurm_grid.common_argv(
        grid.parse_args(['--pretrain', 'vanilla', '--precision', 'fp32', *flags])
    )
    assert {name: argv[argv.index(f'--{name}') + 1] for name in given} == given


@pytest.mark.parametrize(
    'argv, error',
    [
        ([], "error: --cluster slurm: give --precision (bf16 on GPUs from Ampere on, else "
             "fp32): auto would be decided on each node, and a grid's runs share one\n"),
        (['--precision', 'fp32', '--jobs', '2'],
         "error: --jobs: processes at once here; on Slurm, --slurm_at_once\n"),
    ],
)  # fmt: skip
def test_what_slurm_needs_is_checked_before_submitting(argv, error, tmp_path, monkeypatch,
                                                       capsys):  # fmt: skip
    pytest.importorskip('submitit')
    monkeypatch.setattr(shutil, 'which', lambda name: f'/usr/bin/{name}')
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as stopped:
        grid.main(['--pretrain', 'vanilla', '--cluster', 'slurm', *argv])
    assert stopped.value.code == 2 and capsys.readouterr().err == error
    assert not (tmp_path / 'grid').exists()


def test_without_sbatch_the_cluster_is_refused_in_one_line(tmp_path, monkeypatch, capsys):
    pytest.importorskip('submitit')
    monkeypatch.setenv('PATH', str(tmp_path))
    with pytest.raises(SystemExit) as stopped:
        grid.main(['--pretrain', 'vanilla', '--cluster', 'slurm', '--precision', 'fp32'])
    assert stopped.value.code == 2
    assert capsys.readouterr().err.startswith("error: --cluster slurm: Slurm's sbatch is not")


def test_a_job_ends_with_grids_status_and_line(tmp_path):
    """run_group, as a job runs it, with a bad corpus: grid.py's one line and status 2."""
    script = (f"import sys; sys.path.insert(0, {str(ROOT / 'research')!r}); import slurm_grid; "
              f"slurm_grid.run_group(['--pretrained', 'missing.params', '--device', 'cpu', "
              f"'--precision', 'fp32'])")  # fmt: skip
    result = subprocess.run([sys.executable, '-c', script], cwd=tmp_path, capture_output=True,
                            text=True, env={**os.environ, 'SLURM_JOB_ID': '1'})  # fmt: skip
    assert result.returncode == 2 and result.stderr.startswith('error: ')
    assert result.stderr.count('\n') == 1, result.stderr
