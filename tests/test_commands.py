"""Every command that README, docs/ and results/README.md print for our scripts names a
script that exists, and its arguments parse as printed: each script's main() is run with
argparse stopped right after parsing, so nothing else runs. The results scripts run the
commit they pin, whose layout their commands follow."""

import argparse
import importlib
import re
import runpy
import shlex
import subprocess
import sys

import pytest

from conftest import ROOT

PAGES = [
    'README.md',
    'results/README.md',
    *[f'docs/{p.name}' for p in (ROOT / 'docs').glob('*.md')],
]
SCRIPTS = [f'results/{p.name}' for p in (ROOT / 'results').glob('*.sh')]
COMMAND = re.compile(
    r'(?:python|torchrun(?: --nproc_per_node[ =]\d+)?) ((?:src|research|tools)/\w+\.py|london_baseline\.py)(.*)'
)


class Parsed(Exception):
    pass


def commands(relative):
    """(script, arguments) of each command in the file, its continued lines joined."""
    text = (ROOT / relative).read_text().replace('\\\n', ' ')
    found = []
    for line in text.split('\n'):
        match = COMMAND.search(line)
        if not match or '...' in line:  # an elided command
            continue
        script, rest = match.groups()
        rest = re.split(r'\s#|`|\)\s*$|\s\|\||\s>|;', rest)[0]  # comment, prose, shell
        argv = shlex.split(rest)
        if re.fullmatch(r'[A-Z_]+', script.split('/')[-1][:-3]) or any(
            re.fullmatch(r'[A-Z][A-Z_]*', a) for a in argv
        ):
            continue  # a placeholder (research/NAME.py, --variant V), not a command
        found.append((script, argv))
    return found


def unparsed(found, monkeypatch):
    """The commands of `found` whose arguments their script's parser refuses."""
    parse = argparse.ArgumentParser.parse_args

    def parse_then_stop(self, args=None, namespace=None):
        parse(self, args, namespace)
        raise Parsed

    monkeypatch.setattr(argparse.ArgumentParser, 'parse_args', parse_then_stop)
    bad = []
    for script, argv in found:
        assert (ROOT / script).exists(), script
        if script == 'london_baseline.py' or any('$' in a for a in argv):
            continue  # a path its one argument; a shell script's variables
        module = importlib.import_module(script.split('/')[1].removesuffix('.py'))
        try:
            if hasattr(module, 'main'):
                module.main(argv)
            else:  # a script whose __main__ block parses (dataset.py)
                monkeypatch.setattr(sys, 'argv', [script, *argv])
                runpy.run_path(str(ROOT / script), run_name='__main__')
        except Parsed:
            continue
        except SystemExit:
            bad.append(shlex.join([script, *argv]))
    return bad


@pytest.mark.parametrize('relative', SCRIPTS)
def test_the_results_scripts_commands_are_their_pinned_commits(relative):
    """A results script runs the code of the commit it names (CODE_COMMIT), checked out on
    its own: each script its commands name exists at that commit, where git can say."""
    text = (ROOT / relative).read_text()
    pinned = re.search(r'^CODE_COMMIT=(\w+)', text, re.M)
    if pinned is None:
        assert not commands(relative)  # a script of helpers, running no command itself
        return
    listed = subprocess.run(
        ['git', 'ls-tree', '-r', '--name-only', pinned.group(1)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    if listed.returncode:
        pytest.skip(f"{pinned.group(1)} is not in this clone's history")
    for script, _ in commands(relative):
        assert script in listed.stdout.split('\n'), (relative, script)


@pytest.mark.parametrize('relative', PAGES)
def test_every_printed_command_names_a_script_and_parses(relative, monkeypatch):
    found = commands(relative)
    if relative in ('README.md', 'docs/research.md', 'results/README.md'):
        assert found  # these print commands: the pattern finds them
    assert not unparsed(found, monkeypatch)


def test_a_command_with_a_wrong_flag_is_found(monkeypatch, capsys):
    wrong = [('src/run.py', ['pretrain', 'vanilla', 'wiki.txt', '--max_epocs', '1'])]
    assert unparsed(wrong, monkeypatch) == ['src/run.py pretrain vanilla wiki.txt --max_epocs 1']
    right = [('research/grid.py', ['--outdir', 'grid', '--plot', 'grid.png'])]
    assert unparsed(right, monkeypatch) == []
