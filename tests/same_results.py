"""python tests/same_results.py OLD NEW: whether two checkouts (folders holding src/run.py)
give the same results, bit for bit, for what a move of code must not change.

Each checkout runs the handout's phases on the suite's tiny corpus (conftest.tiny_corpus):
for every variant in fp32 and bf16, pretrain (3 epochs), finetune from it with full, LoRA
and adapters (3 epochs each) and evaluate each model on dev, and vanilla finetuned without
pretraining; then the md5 of every params and predictions file of the two are compared.
About 3 minutes a checkout on a 2-core CPU. Exit status 0 when every file is the same.
"""

import hashlib
import subprocess
import sys
import tempfile
from pathlib import Path

from conftest import tiny_corpus

VARIANTS = ['vanilla', 'synthesizer', 'perceiver', 'rope']


def outputs(checkout, folder):
    """{file name: md5} of what checkout's run.py writes into folder."""
    text, people = tiny_corpus()
    rows = [f"Where was {n} born?\t{p}" for n, p in people.items()]
    (folder / 'wiki.txt').write_text(text, encoding='utf-8')
    (folder / 'train.tsv').write_text('\n'.join(rows[:12]) + '\n', encoding='utf-8')
    (folder / 'dev.tsv').write_text('\n'.join(rows[12:]) + '\n', encoding='utf-8')

    def run(*args):
        command = [sys.executable, str(Path(checkout) / 'src' / 'run.py'), *map(str, args)]
        done = subprocess.run(command + ['--device', 'cpu'], cwd=folder, capture_output=True)
        if done.returncode:
            sys.exit(f"{checkout}: {' '.join(map(str, args))}: {done.stderr.decode()[-2000:]}")

    for variant in VARIANTS:
        for precision in ('fp32', 'bf16'):
            name = f'{variant}.{precision}'
            common = [variant, 'wiki.txt', '--precision', precision, '--batch_size', 8]
            common += ['--bottleneck_dim', 48] if variant == 'perceiver' else []
            run('pretrain', *common, '--max_epochs', 3, '--writing_params_path', f'{name}.params')
            for method in ('full', 'lora', 'adapter'):
                run('finetune', *common, '--max_epochs', 3, '--finetune_method', method,
                    '--reading_params_path', f'{name}.params', '--finetune_corpus_path',
                    'train.tsv', '--writing_params_path', f'{name}.{method}.params')  # fmt: skip
            for params in [f'{name}.params'] + [f'{name}.{m}.params' for m in ('full', 'lora', 'adapter')]:  # fmt: skip
                run('evaluate', *common, '--reading_params_path', params,
                    '--eval_corpus_path', 'dev.tsv', '--outputs_path', params + '.predictions')  # fmt: skip
    run('finetune', 'vanilla', 'wiki.txt', '--max_epochs', 2, '--batch_size', 4,
        '--writing_params_path', 'scratch.params', '--finetune_corpus_path', 'train.tsv')  # fmt: skip
    return {
        path.name: hashlib.md5(path.read_bytes()).hexdigest()
        for path in sorted(folder.iterdir())
        if path.name.endswith(('.params', '.predictions'))
    }


def main():
    old, new = sys.argv[1:3]
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / 'old').mkdir(), (Path(tmp) / 'new').mkdir()
        before, after = outputs(old, Path(tmp) / 'old'), outputs(new, Path(tmp) / 'new')
    differ = [name for name in before if before[name] != after.get(name)]
    print(f"{len(before) - len(differ)} of {len(before)} files the same")
    for name in differ:
        print(f"differs: {name}")
    sys.exit(1 if differ or before.keys() != after.keys() else 0)


if __name__ == '__main__':
    main()
