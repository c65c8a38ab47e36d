"""One submission marked: its probes run, then each test of its edition (the part_*.py
files, registered in suite.TESTS in the handout's order) given what they found, and a
row per test with its score and, where it failed, its line.
"""

import contextlib
import json
import os
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

import part_c  # noqa: F401 (each part's tests register in TESTS as it is imported, in order)
import part_d  # noqa: F401
import part_e  # noqa: F401
import part_f  # noqa: F401
import part_g  # noqa: F401
import sandbox
from editions import ARCHITECTURES, BLOCK_SIZE, EDITIONS, read_lines
from probe_runner import prepare_folder, probe_arguments, run_probe, tail
from references import weights_for
from suite import TESTS, Fail, Unwritten


class Grading:
    """One submission being graded: its files, the edition, the data, the probes' results."""

    def __init__(self, submission, edition_name, data, answers, work, timeout):
        self.submission, self.edition_name = submission, edition_name
        self.edition = EDITIONS[edition_name]
        self.data, self.answers, self.work, self.timeout = data, answers, work, timeout
        self.results, self.span = {}, None
        run_py = submission / 'src' / 'run.py'
        text = run_py.read_text(errors='replace') if run_py.exists() else ''
        self.takes_edition = "'--edition'" in text or '"--edition"' in text
        corpus = (data / 'wiki.txt').read_text(encoding='utf-8')
        self.vocab_size, self.corpus_lines = len(set(corpus)) + 2, len(corpus.split('\n'))

    def path(self, name):
        path = self.submission / name
        if not path.is_file():
            raise Fail(f"{name} is missing")
        return path

    def read(self, name):
        return self.path(name).read_text(encoding='utf-8', errors='replace')

    def probe(self, key):
        outcome = self.results[key]
        if outcome.get('unwritten'):
            raise Unwritten(outcome['error'], outcome['unwritten'])
        if 'error' in outcome:
            raise Fail(outcome['error'])
        return outcome['ok']

    def log(self, key):
        return tail(self.work / key / 'probe.log')

    def architecture(self, variant):
        shapes = json.loads(ARCHITECTURES.read_text())[variant]
        return {
            name: [self.vocab_size if d == 'vocab' else d for d in shape]
            for name, shape in shapes.items()
        }

    def settings(self, epochs, batch, lr, schedule_epochs):
        return dict(
            max_epochs=epochs, batch_size=batch, learning_rate=lr, betas=[0.9, 0.95],
            grad_norm_clip=1.0, weight_decay=0.1, lr_decay=True, warmup_tokens=512 * 20,
            final_tokens=schedule_epochs * self.corpus_lines * BLOCK_SIZE, ckpt_path=None,
        )  # fmt: skip

    def gold(self, split):
        if split == 'dev':
            lines = read_lines(self.data / 'birth_dev.tsv')
        else:
            lines = self.answers
        return [line.split('\t')[1].strip() for line in lines]

    def predictions(self, name, split):
        """The prediction file's lines, one per question of the split's file."""
        questions = read_lines(
            self.data / ('birth_dev.tsv' if split == 'dev' else 'birth_test_inputs.tsv')
        )
        lines = read_lines(self.path(name))
        if len(lines) != len(questions):
            raise Fail(f"{name} has {len(lines)} lines for {len(questions)} questions")
        return lines

    def london_accuracy(self):
        gold = self.gold('dev')
        return 100 * sum(place == 'London' for place in gold) / len(gold)

    def run_probes(self, keys, jobs, box=None):
        """Runs the probes `keys`, `jobs` at once, as `box`'s user where given; their
        failures say so where the disk guard ended them."""

        def one(key):
            folder = self.work / key
            files = prepare_folder(folder, self.submission, self.data)
            if key == 'finetune_pretrained':
                state = weights_for(self.architecture('vanilla'), 8)
                torch.save(state, files / 'pretrained.params')
            if box:
                box.give(files)
            name, arguments = probe_arguments(self, key)
            outcome = run_probe(folder, name, arguments, self.timeout, box)
            if 'error' in outcome and guard and guard.tripped:
                outcome = {'error': guard.tripped}
            return key, outcome

        guard = sandbox.DiskGuard(box, [self.work]) if box else None
        with guard or contextlib.nullcontext(), ThreadPoolExecutor(max_workers=jobs) as pool:
            self.results.update(pool.map(one, keys))


def tests_for(edition_name, answers, machinery=True):
    """The edition's tests, named for it; without `machinery`, not the check of what our
    starter's src/machinery does with the student's code (an upload made from the
    course's own starter trains in its own code, not through our packed step and
    decoder, so what those would do is not the submission's to pass)."""
    edition = EDITIONS[edition_name]
    chosen = []
    for t in TESTS:
        if edition_name in t.editions and (answers or not t.answers):
            if machinery or 'machinery' not in t.probes:
                chosen.append((t.name.format(**edition), t))
    return chosen


def grade(submission, edition_name, data, answers=None, timeout=60, jobs=None, only=None, box=None):
    """Grades one submission folder: [(test name, score, max score, reason or None)].
    `only`: the names of the tests to run (all by default); `box`: the sandbox.Sandbox the
    submission's code runs in (sandbox.current(): where the grader runs as root)."""
    jobs = jobs or max(1, min(4, os.cpu_count() or 1))
    machinery = (Path(submission) / 'src' / 'machinery').is_dir()  # made from our starter
    chosen = [
        (n, t)
        for n, t in tests_for(edition_name, answers is not None, machinery)
        if not only or n in only
    ]
    with tempfile.TemporaryDirectory(prefix='grading-') as work:
        g = Grading(submission, edition_name, data, answers, Path(work), timeout)
        keys = sorted({key for _, t in chosen for key in t.probes})
        if box:
            os.chmod(work, 0o711)  # the user reaches its own folders inside, and no others
        try:
            g.run_probes(keys, jobs, box)
        finally:  # nothing the submission started outlives its probes
            if box:
                box.clear()
        rows = []
        for name, t in chosen:
            try:
                t.check(g)
                rows.append((name, t.points, t.points, None))
            except Fail as e:
                rows.append((name, 0, t.points, t.reason(e, g.edition)))
            except Exception as e:  # what the grader did not foresee fails one test, not all
                rows.append((name, 0, t.points, f"grader error: {type(e).__name__}: {e}"))
    return rows
