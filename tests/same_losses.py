"""python tests/same_losses.py OLD NEW [VARIANT ...]: whether two checkouts (folders
holding src/run.py) compute the same training up to rounding, where a change moves the
rounding (or the shapes dropout draws its masks for) but not the computation.

Each checkout pretrains the variant on data/wiki.txt for its first STEPS steps in fp32
on the CPU, with the handout's settings but dropout off (every *_pdrop 0: with dropout
on, another draw order is another run), and the per-step losses of the two are compared.
Exit status 0 when the first CLOSE steps' losses are within TOLERANCE of each other.
Later steps drift apart even where only rounding differs, as training amplifies it: the
same code at 1 and 2 threads (vanilla) agrees to the metrics file's 6 decimals for 10
steps, then differs by up to 4.5e-3 by step 20 and 3.1e-2 by step 30; the largest gap up
to each step is printed to compare with that.
"""

import csv
import subprocess
import sys
import tempfile
from pathlib import Path

STEPS = 30
CLOSE = 10
TOLERANCE = 1e-4
ROOT = Path(__file__).resolve().parent.parent
# run.main with GPTConfig's dropout off, in a fresh process of the checkout's own code
PROGRAM = """
import sys
sys.path.insert(0, sys.argv[1])
import model
model.GPTConfig.embd_pdrop = model.GPTConfig.resid_pdrop = model.GPTConfig.attn_pdrop = 0.0
import run
run.main(sys.argv[2:])
"""


def losses(checkout, variant, folder):
    """The first STEPS per-step losses of checkout's pretraining."""
    params = folder / f'{variant}.params'
    epochs = -(-STEPS // 23)  # 2,937 documents: 23 batches of 128 an epoch
    flags = ['--bottleneck_dim', '64'] if variant == 'perceiver' else []
    argv = ['pretrain', variant, str(ROOT / 'data' / 'wiki.txt'), '--writing_params_path',
            str(params), '--max_epochs', str(epochs), '--precision', 'fp32', '--device', 'cpu',
            *flags]  # fmt: skip
    done = subprocess.run(
        [sys.executable, '-c', PROGRAM, str(Path(checkout) / 'src'), *argv],
        cwd=folder, capture_output=True, text=True,
    )  # fmt: skip
    if done.returncode:
        sys.exit(f"{checkout}: {done.stderr[-2000:]}")
    with open(f'{params}.metrics.csv', newline='') as f:
        return [float(row['loss']) for row in csv.DictReader(f)][:STEPS]


def main():
    old, new, *variants = sys.argv[1:]
    worst = 0.0
    for variant in variants or ['vanilla', 'synthesizer', 'rope', 'perceiver']:
        with tempfile.TemporaryDirectory() as tmp:
            (Path(tmp) / 'old').mkdir(), (Path(tmp) / 'new').mkdir()
            before = losses(old, variant, Path(tmp) / 'old')
            after = losses(new, variant, Path(tmp) / 'new')
        gaps = [abs(a - b) for a, b in zip(before, after)]
        step = max(range(len(gaps)), key=gaps.__getitem__)
        print(
            f"{variant}: {len(gaps)} steps, largest gap {gaps[step]:.2e} at step {step + 1} "
            f"({before[step]:.6f} and {after[step]:.6f}); last losses {before[-1]:.6f} and "
            f"{after[-1]:.6f}; the largest gap up to step "
            + ', '.join(f"{n}: {max(gaps[:n]):.1e}" for n in (1, 2, 5, 10, 20, 50) if n < len(gaps))
        )
        worst = max(worst, *gaps[:CLOSE])
    sys.exit(0 if worst <= TOLERANCE else 1)


if __name__ == '__main__':
    main()
