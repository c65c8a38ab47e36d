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
What belongs to some editions only is marked the same way, `# [2023]` (or a part's
`# [part g, 2023]`): the other editions' starters leave out the statement under it (an if
with an else leaves its else branch in its place; a marker above a line that starts no
statement, an argument or a dict's entry, covers that line), so that a starter holds its
edition's variants only, and src/perceiver.py is in the 2023 starter alone.
Everything else is our code, so a completed starter trains through the student's code
with our speed, resumable runs and checks.
"""

import argparse
import ast
import io
import re
import shutil
import subprocess
import sys
import tokenize
from pathlib import Path

import editions

ROOT = Path(__file__).resolve().parent.parent
EDITIONS = tuple(editions.EDITIONS)  # 2024 covers 2025
# what the starter holds: the code, the grader to check it with, and the data's README;
# never the tests (they test our solution), the published results or the starter writer.
# Of src/, the machinery package and the modules the handout's scripts import
# (handout_modules); of tools/, the data fetch alone: not the research layer or our other
# tools (bench, reproduce, plot, ...)
INCLUDED = [
    'src/machinery',
    'grading',
    'mingpt-demo',
    'data/README.md',
    'tools/get_data.py',
    'tools/import_paths.py',
    'london_baseline.py',
    'collect_submission.sh',
    'colab.ipynb',
    'requirements.txt',
    'environment.yml',
    'pyproject.toml',
    '.gitignore',
]
EXCLUDED = {'grading/starter.py'}
MARKED = ['src/*.py', 'london_baseline.py']  # the files the markers may be in
STUB = 'raise NotImplementedError("'
# what the starter changes in a file: the edition made the default, in run.py,
# collect_submission.sh and the notebook (whose second variant becomes the edition's, and
# which trains the student's folder: no repository of ours to clone), and no path that
# exists only on this project's machines. {edition}, {variant} and {flags} are the edition's
REPLACED = {
    'src/run.py': [("DEFAULT_EDITION = None", "DEFAULT_EDITION = '{edition}'")],
    'collect_submission.sh': [('edition="${1:-2021}"', 'edition="${{1:-{edition}}}"')],
    'data/README.md': [
        (
            'On the course machines the files sit beside this project in `../shared/data/`:\n\n'
            '    cp ../shared/data/* data/\n\n',
            '',
        )
    ],
    '.gitignore': [
        (
            "# the reference run's checkout and outputs (issue 8): a fixed commit, run in the "
            "background\n/longrun/\n",
            '',
        )
    ],
    'pyproject.toml': [('["mingpt-demo", "longrun"]', '["mingpt-demo"]')],
    'colab.ipynb': [
        (
            "training this repository's code, our solution (a starter written by "
            "grading/starter.py carries its own colab.ipynb, which trains the student's code).",
            "training your code: this starter's folder, uploaded to Google Drive or cloned "
            "there from your own repository. Use it for the full runs, once the learning "
            "check (`python grading/learning_check.py`) passes.",
        ),
        (
            "REPOSITORY = 'https://github.com/OWNER/REPOSITORY.git'  # this repository's URL",
            "REPOSITORY = ''  # your own repository's URL",
        ),
        (
            "EDITION = '2021'  # the handout you follow: '2021', '2023', '2024' or '2025'",
            "EDITION = '{edition}'  # this starter's edition, fixed when it was written",
        ),
        (
            "V = {'2021': 'synthesizer', '2023': 'perceiver'}.get(EDITION, 'rope')",
            "V = '{variant}'",
        ),
        ("FLAGS = ' --bottleneck_dim 64' if V == 'perceiver' else ''", "FLAGS = '{flags}'"),
    ],
}
# the files of one edition only
EDITION_FILES = {'src/perceiver.py': '2023'}
TAG = r'\[(?:part [a-g](?:, \d{4})?|\d{4})\]'  # [part e], [part g, 2021] or [2021]
MARKER = re.compile(rf'^(\s*)# ({TAG}(?: {TAG})*)(.*)$')

README = """# The assignment's starter ({edition} edition: vanilla and {variant})

## Set up

    pip install -r requirements.txt

(On Linux without an NVIDIA GPU, first `pip install "torch>=2.8,<2.16" --index-url
https://download.pytorch.org/whl/cpu`: the CPU build, 1.1 GB where plain pip brings 5.5 GB
of CUDA.) The data comes by itself: the first command that needs it fetches the course's
four files into data/ and checks them; offline, `python tools/get_data.py --from a5.zip`
takes the course's starter zip you have (data/README.md).

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
    src/machinery/     what makes training fast, resumable and checked: it works around
                       your code, and you never need to open it

## A first run (a minute or two)

Once span corruption (e), new_model (c) and pretrain (f) are written, one epoch of
pretraining shows that they train:

    python src/run.py pretrain vanilla wiki.txt --writing_params_path smoke.params --max_epochs 1

## Does it train? (two to four minutes)

Once every part is written, and before the hours of the full pretraining:

    python grading/learning_check.py

It first runs the grader's checks of the code that training runs (seconds), then your
run.py pretrains your {variant} model on the wiki.txt lines of 64 people, finetunes it on
their birth-place questions and asks it the same questions, all on the CPU, and compares
each stage with what a correct pipeline does there (its loss band, the questions it
recalls); where one differs it says what to check. It shows that your pipeline trains as
a correct one does, not what pretraining taught: finetuning learns those 64 questions by
heart with or without it. One epoch of the real pretraining answers no question, so
whether pretraining puts knowledge within reach of questions the finetuning never saw,
only the full run tells (the commands below): a pretraining takes about 3 hours on a
2-core CPU with bf16, up to about 8 on slower CPUs, about 2 minutes on a recent GPU (131 s
on an H200).

## The full runs on Colab

After the learning check, for the full runs on a GPU: upload this folder to Google Drive
(or push it to your own repository), open its colab.ipynb in Colab and set its first cell
(FOLDER: where the folder is on Drive; REPOSITORY: your repository's URL, cloned into
FOLDER only when FOLDER is absent); the data goes in FOLDER's data/. Its cells run your code
through the commands below in order, with this edition's flags, in fp16 on a T4, keeping
every output on Drive (after a disconnect, run them again: what exists is skipped, a
training cut off goes on), and end with the grader's table. A T4's time: not measured.

## The handout's commands, in order

Times on a 2-core CPU with bf16 instructions (about twice as long without; minutes on a
GPU):

{commands}

## Check your work

    python grading/grade.py . --edition {edition}

It runs each check of your code in a separate process with a time limit and prints a
table of the tests, their points, and why a test failed. Tests of results (params and
prediction files) pass once you have run the handout's commands. `--learning_check` adds
the learning check's few minutes as a row of no points.
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
# the edition's second variant and the flags its handout's commands pass (the grader's)
VARIANTS = {
    name: (edition['variant'], ''.join(f' {flag}' for flag in edition['flags']))
    for name, edition in editions.EDITIONS.items()
}


def parts_of(label):
    """The part letters of a marker's label: '[part c] [part g]' -> ['c', 'g']."""
    return re.findall(r'\[part ([a-g])', label)


def applies(label, edition):
    """Whether a marker's label names this edition: it names no year, or this one."""
    years = set(re.findall(r'(\d{4})\]', label))
    return not years or ('2024' if edition == '2025' else edition) in years


def statements(text):
    """{the first line of each statement (its decorators' if any): the outermost statement
    there}, and {a method: its class's name}."""
    starts, classes = {}, {}
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.ClassDef):
            classes.update({child: node.name for child in node.body})
        if isinstance(node, ast.stmt):
            first = min([node.lineno] + [d.lineno for d in getattr(node, 'decorator_list', [])])
            starts.setdefault(first, node)
    return starts, classes


def bracket_depths(text):
    """{line: how many brackets are open at its end}, for the lines that end open ones."""
    depth, depths = 0, {}
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type == tokenize.OP and token.string in '([{':
            depth += 1
        elif token.type == tokenize.OP and token.string in ')]}':
            depth -= 1
        depths[token.end[0]] = depth
    return depths


def element_end(depths, first):
    """The last line of the element (an argument, a dict's entry) that starts on line
    `first`: the first line from there that closes what it opens."""
    before = depths.get(first - 1, 0)
    last = first
    while depths.get(last, before) > before:
        last += 1
    return last


def for_edition(text, edition):
    """text without what the markers give to other editions (the module's docstring says
    how), and without the markers that name editions only."""
    lines = text.split('\n')
    starts, _ = statements(text)
    depths = bracket_depths(text)
    regions, skip_to = [], 0
    for number, line in enumerate(lines, start=1):
        match = MARKER.match(line)
        if number <= skip_to or not match:
            continue
        label = match.group(2)
        if applies(label, edition):
            if not parts_of(label):  # the marker's words stay, as a comment
                indent, said = match.group(1), match.group(3)
                regions.append((number, number, [f"{indent}#{said}"] if said.strip() else []))
            continue
        node = starts.get(number + 1)
        last = node.end_lineno if node is not None else element_end(depths, number + 1)
        kept = []
        if isinstance(node, ast.If) and node.orelse:
            first = node.orelse[0].lineno
            if lines[first - 1].lstrip().startswith('elif'):
                raise ValueError(f"line {number}: the if under '{label}' has an elif")
            shift = node.orelse[0].col_offset - node.col_offset
            kept = [row[shift:] for row in lines[first - 1 : last]]
        skip_to = last
        first = number
        if not kept and first > 1 and not lines[first - 2].strip():
            # no blank lines doubled where the statement was, and none left alone
            if last < len(lines) and not lines[last].strip():
                while last < len(lines) and not lines[last].strip():
                    last += 1
            else:
                while first > 1 and not lines[first - 2].strip():
                    first -= 1
        regions.append((first, last, kept))
    return stubbed(text, regions)


def stubs(text, edition):
    """The parts' regions of a source file for the edition: a list of (first, last, lines),
    1-based lines first..last of `text` to be replaced by `lines`."""
    lines = text.split('\n')
    starts, classes = statements(text)
    regions = []
    for number, line in enumerate(lines, start=1):
        match = MARKER.match(line)
        if not match or not parts_of(match.group(2)):
            continue
        indent, label, said = match.groups()
        node = starts.get(number + 1)
        if not isinstance(node, (ast.FunctionDef, ast.If)):
            raise ValueError(f"line {number}: '{label}' is not right above a def or an if")
        if isinstance(node, ast.If) and node.orelse:
            raise ValueError(f"line {number}: the if under '{label}' has an else; mark a def")
        if not applies(label, edition):
            continue
        parts = ' '.join(f"[part {letter}]" for letter in parts_of(label))
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


def replacements(relative, edition):
    """REPLACED's (old, new) pairs of one file, new written for the edition."""
    variant, flags = VARIANTS[edition]
    return [
        (old, new.format(edition=edition, variant=variant, flags=flags))
        for old, new in REPLACED.get(relative, [])
    ]


def starter_files(edition):
    """{relative path: text or None (copied as it is)} of the starter."""
    marked = {p for pattern in MARKED for p in ROOT.glob(pattern)}
    included = INCLUDED + [f'src/{name}.py' for name in handout_modules()]
    year = '2024' if edition == '2025' else edition  # 2024 covers 2025
    files = {}
    for p in sorted(tracked_files()):
        relative = p.relative_to(ROOT).as_posix()
        if (
            relative in EXCLUDED
            or EDITION_FILES.get(relative, year) != year
            or not any(relative == name or relative.startswith(name + '/') for name in included)
        ):
            continue
        text = None
        if p in marked:
            text = for_edition(p.read_text(encoding='utf-8'), edition)
            text = stubbed(text, stubs(text, edition))
        for old, new in replacements(relative, edition):
            text = p.read_text(encoding='utf-8') if text is None else text
            if text.count(old) != 1:
                raise ValueError(f"{relative}: '{old}' should occur once")
            text = text.replace(old, new)
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
