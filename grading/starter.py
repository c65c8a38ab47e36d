"""Writes the assignment's starter code for one handout edition: this repository's code with
the parts that edition asks students to write replaced by stubs.

    python grading/starter.py 2021 ../a5-starter     # vanilla + synthesizer
    python grading/starter.py 2023 ../a5-starter     # vanilla + perceiver
    python grading/starter.py 2024 ../a4-starter     # vanilla + RoPE (2025: the same)

A student's part is marked in our code by a comment line right above the statement it
covers, labelled as the handout labels it: `# [part e]` (every edition) or
`# [part g, 2021]` (that edition only; 2024 covers 2025). The statement is a def or an
if; the starter keeps its first line and docstring and replaces the rest of its body with
`raise NotImplementedError("[part e] ...")`, and the marker becomes `# TODO [part e] ...`.
Everything else is our code, so a completed starter trains through the student's code
with our speed, resumable runs and checks.
"""

import argparse
import ast
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EDITIONS = ('2021', '2023', '2024', '2025')
# what the starter holds: the code, the grader to check it with, and the data's README;
# never the tests (they test our solution), the published results or the starter writer.
# Of src/, the modules the handout's scripts import (handout_modules): not the research
# layer or our tools (bench, reproduce, plot, ...)
INCLUDED = [
    'grading',
    'mingpt-demo',
    'data/README.md',
    'london_baseline.py',
    'collect_submission.sh',
    'requirements.txt',
    'environment.yml',
    'pyproject.toml',
    '.gitignore',
]
EXCLUDED = {'grading/starter.py'}
MARKED = ['src/*.py', 'london_baseline.py']  # the files the markers may be in
STUB = 'raise NotImplementedError("'
# the lines that make the edition the starter's default, in run.py and collect_submission.sh
DEFAULTS = {
    'src/run.py': ("DEFAULT_EDITION = None", "DEFAULT_EDITION = '{edition}'"),
    'collect_submission.sh': ('edition="${1:-2021}"', 'edition="${{1:-{edition}}}"'),
}
MARKER = re.compile(r'^(\s*)# (\[part [a-g](?:, \d{4})?\](?: \[part [a-g](?:, \d{4})?\])*)(.*)$')
TAG = re.compile(r'\[part ([a-g])(?:, (\d{4}))?\]')

README = """# The assignment's starter ({edition} edition: vanilla and {variant})

## Set up

    pip install -r requirements.txt

Then put the four data files (wiki.txt, birth_places_train.tsv, birth_dev.tsv,
birth_test_inputs.tsv) in data/ (data/README.md).

## What you write

Each part raises NotImplementedError under a `# TODO [part X]` line; its docstring (or the
TODO line) says what to write and which helpers to use:

{parts}

Your code gets the handout's signatures and plain tensors in the handout's shapes (x is
(B, T, C), its positions starting at 0, in training and in evaluation). Which file holds
what:

    src/dataset.py     the datasets: span corruption (e), the birth-place questions
    src/model.py       the GPT and its Block
    src/attention.py   the attention layers{perceiver_line}
    src/trainer.py     the training loop and TrainerConfig
    src/run.py         the command line: each phase's model and Trainer settings (c, f, g)
    src/utils.py       sampling and evaluate_places
    london_baseline.py the London baseline (d)
    grading/           the grader

{machinery}

## A first run (a minute or two)

    python src/run.py pretrain vanilla wiki.txt --writing_params_path smoke.params --max_epochs 1

## The handout's commands, in order

Times on a 2-core CPU with bf16 instructions (about twice as long without; minutes on a
GPU):

{commands}

## Check your work

    python grading/grade.py . --edition {edition}

It runs each check of your code in a separate process with a time limit and prints a
table of the tests, their points, and why a test failed. Tests of results (params and
prediction files) pass once you have run the handout's commands.
"""
# the handout's commands of an edition: (what, time on a 2-core CPU with bf16, command)
COMMANDS = [
    ('(e) look at span corruption', 'seconds', 'python src/dataset.py charcorruption'),
    (
        '(d) finetune without pretraining',
        '12 min',
        'python src/run.py finetune vanilla '
        'wiki.txt --writing_params_path vanilla.model.params --finetune_corpus_path '
        'birth_places_train.tsv',
    ),
    (
        '(d) evaluate it on dev and test',
        'seconds',
        'python src/run.py evaluate vanilla wiki.txt '
        '--reading_params_path vanilla.model.params --eval_corpus_path birth_dev.tsv '
        '--outputs_path vanilla.nopretrain.dev.predictions',
    ),
    (
        None,
        None,
        'python src/run.py evaluate vanilla wiki.txt --reading_params_path '
        'vanilla.model.params --eval_corpus_path birth_test_inputs.tsv --outputs_path '
        'vanilla.nopretrain.test.predictions',
    ),
    ('(d) the London baseline', 'seconds', 'python london_baseline.py'),
]
# then, for vanilla (f) and the variant (g): pretrain, finetune from it, evaluate on dev and test
PHASES = [
    (
        'pretrain',
        '2-4 h',
        'python src/run.py pretrain {v} wiki.txt{flags} --writing_params_path {v}.pretrain.params',
    ),
    (
        'finetune from it',
        '1 min',
        'python src/run.py finetune {v} wiki.txt{flags} '
        '--reading_params_path {v}.pretrain.params --writing_params_path {v}.finetune.params '
        '--finetune_corpus_path birth_places_train.tsv',
    ),
    (
        'evaluate on dev and test',
        'seconds',
        'python src/run.py evaluate {v} wiki.txt{flags} '
        '--reading_params_path {v}.finetune.params --eval_corpus_path birth_dev.tsv '
        '--outputs_path {v}.pretrain.dev.predictions',
    ),
    (
        None,
        None,
        'python src/run.py evaluate {v} wiki.txt{flags} --reading_params_path '
        '{v}.finetune.params --eval_corpus_path birth_test_inputs.tsv --outputs_path '
        '{v}.pretrain.test.predictions',
    ),
]
# the edition's second variant and the flags its handout's commands pass
VARIANTS = {'2021': ('synthesizer', ''), '2023': ('perceiver', ' --bottleneck_dim 64'),
            '2024': ('rope', ''), '2025': ('rope', '')}  # fmt: skip
HANDOUT_FILES = {'run', 'dataset', 'model', 'attention', 'trainer', 'utils', 'perceiver'}


def applies(tags, edition):
    """Whether a marker's tags ([('e', ''), ('g', '2021')]) name this edition."""
    edition = '2024' if edition == '2025' else edition
    return any(year in ('', edition) for _, year in tags)


def stubs(text, edition):
    """The marked regions of a source file for the edition: a list of (first, last, lines),
    1-based lines first..last of `text` to be replaced by `lines`."""
    lines = text.split('\n')
    statements = {}  # the first line of each def/if -> its node
    classes = {}  # a method -> its class's name
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.ClassDef):
            classes.update({child: node.name for child in node.body})
        if isinstance(node, (ast.FunctionDef, ast.If)):
            first = min([node.lineno] + [d.lineno for d in getattr(node, 'decorator_list', [])])
            statements[first] = node
    regions = []
    for number, line in enumerate(lines, start=1):
        match = MARKER.match(line)
        if not match:
            continue
        indent, label, said = match.groups()
        node = statements.get(number + 1)
        if node is None:
            raise ValueError(f"line {number}: '{label}' is not right above a def or an if")
        if isinstance(node, ast.If) and node.orelse:
            raise ValueError(f"line {number}: the if under '{label}' has an else; mark a def")
        tags = TAG.findall(label)
        if not applies(tags, edition):
            continue
        parts = ' '.join(f"[part {letter}]" for letter, _ in tags)
        documented = isinstance(node, ast.FunctionDef) and ast.get_docstring(node) is not None
        if said.strip():
            what = said.strip()
        else:
            name = f"{classes[node]}.{node.name}" if node in classes else node.name
            whose = 'its' if documented else "the class's"
            what = f"write {name} ({whose} docstring says what)"
        body = node.body
        if documented:
            start = body[0].end_lineno + 1
            body = body[1:]
        else:  # from the line after the header: the comments before the first statement too
            start = body[0].lineno
            while start - 1 > node.lineno and lines[start - 2].strip().startswith('#'):
                start -= 1
        if not body:
            raise ValueError(f"line {number}: the statement under '{label}' has no body")
        pad = ' ' * body[0].col_offset
        message = f"{parts} {what}".replace('"', "'")
        regions.append((number, number, [f"{indent}# TODO {label}{said}"]))
        regions.append((start, node.end_lineno, [f'{pad}{STUB}{message}")']))
    return regions


def stubbed(text, regions):
    """text with each region's lines replaced."""
    lines = text.split('\n')
    for first, last, new in sorted(regions, reverse=True):
        lines[first - 1 : last] = new
    return '\n'.join(lines)


def tracked_files():
    """The repository's files: git's list where this is a clone, else every file but
    Python's caches and the run outputs git would ignore."""
    try:
        listed = subprocess.run(
            ['git', 'ls-files'], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.split('\n')
        return [ROOT / name for name in listed if name and (ROOT / name).is_file()]
    except (OSError, subprocess.CalledProcessError):
        outputs = ('.params', '.resume', '.predictions', '.pyc', '.zip')
        return [
            p
            for p in ROOT.rglob('*')
            if p.is_file() and '__pycache__' not in p.parts and not p.name.endswith(outputs)
        ]


def handout_modules(entry_points=('run', 'dataset', 'utils')):
    """The src/ modules the handout's scripts import, directly or through each other:
    {'run', 'dataset', 'model', 'trainer', ...}, read from their import statements."""
    names = {p.stem for p in (ROOT / 'src').glob('*.py')}
    found, waiting = set(), list(entry_points)
    while waiting:
        name = waiting.pop()
        if name in found:
            continue
        found.add(name)
        for node in ast.walk(ast.parse((ROOT / 'src' / f'{name}.py').read_text('utf-8'))):
            if isinstance(node, ast.Import):
                waiting += [a.name for a in node.names if a.name in names]
            elif isinstance(node, ast.ImportFrom) and node.module in names:
                waiting.append(node.module)
    return found


def starter_files(edition):
    """{relative path: text or None (copied as it is)} of the starter."""
    marked = {p for pattern in MARKED for p in ROOT.glob(pattern)}
    included = INCLUDED + [f'src/{name}.py' for name in handout_modules()]
    files = {}
    for p in sorted(tracked_files()):
        relative = p.relative_to(ROOT).as_posix()
        if relative in EXCLUDED or not any(
            relative == name or relative.startswith(name + '/') for name in included
        ):
            continue
        text = None
        if p in marked:
            text = p.read_text(encoding='utf-8')
            text = stubbed(text, stubs(text, edition))
        if relative in DEFAULTS:
            text = p.read_text(encoding='utf-8') if text is None else text
            old, new = DEFAULTS[relative]
            if text.count(old) != 1:
                raise ValueError(f"{relative}: '{old}' should occur once")
            text = text.replace(old, new.format(edition=edition))
        files[relative] = text
    return files


def parts_list(files):
    """The README's list: each stub of the starter, with its file."""
    todos = []
    for relative, text in files.items():
        for line in (text or '').split('\n'):
            if line.strip().startswith(STUB):
                todos.append(f"- {relative}: {line.strip()[len(STUB) : -2]}")
    return '\n'.join(todos)


def commands_list(edition):
    """The README's numbered list of the edition's commands, each with its time."""
    variant, flags = VARIANTS[edition]
    steps = list(COMMANDS)
    for part, v, f in (('(f)', 'vanilla', ''), ('(g)', variant, flags)):
        steps += [
            (what and f"{part} {v}: {what}", time, command.format(v=v, flags=f))
            for what, time, command in PHASES
        ]
    steps.append(('pack the submission', 'seconds', f"bash collect_submission.sh {edition}"))
    blocks = []  # [heading, command, ...] per numbered step
    for what, time, command in steps:
        if what:
            blocks.append([f"{len(blocks) + 1}. {what} ({time}):", ''])
        blocks[-1].append(f"       {command}")
    return '\n\n'.join('\n'.join(block) for block in blocks)


def write_starter(edition, out):
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise SystemExit(f"error: {out} exists and is not empty; name a new folder")
    files = starter_files(edition)
    for relative, text in files.items():
        target = out / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        if text is None:
            shutil.copy2(ROOT / relative, target)
        else:
            target.write_text(text, encoding='utf-8')
    readme = README.format(
        edition=edition,
        variant=VARIANTS[edition][0],
        parts=parts_list(files),
        perceiver_line='\n    src/perceiver.py   the perceiver\'s blocks (g)'
        if edition == '2023'
        else '',
        machinery=textwrap.fill(
            f"The other modules in src/ ({', '.join(sorted(handout_modules() - HANDOUT_FILES))})"
            " make training fast, resumable and checked; they work around your code, and you "
            "never need to open them.",
            90,
        ),
        commands=commands_list(edition),
    )
    (out / 'README.md').write_text(readme, encoding='utf-8')
    (out / 'data').mkdir(exist_ok=True)
    return files


def main(argv=None):
    argp = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    argp.add_argument('edition', choices=EDITIONS, help="the handout edition")
    argp.add_argument('out', help="the folder to write the starter to (new or empty)")
    args = argp.parse_args(argv)
    files = write_starter(args.edition, args.out)
    stubs_written = sum((t or '').count(STUB) for t in files.values())
    print(
        f"wrote the {args.edition} starter to {args.out}: {len(files)} files, {stubs_written} stubs"
    )


if __name__ == '__main__':
    sys.exit(main())
