"""How a pretraining on CUDA starts, built on the CPU: the md5s of its initial weights and
of its first batches, as CUDA's batch producer builds them (batch_producer.py), for any
checkout of this repository, so that two commits' GPU runs can be told apart, or not, by
what they start from.

    python tools/first_batches.py pretrain vanilla wiki.txt --seed 0
    python tools/first_batches.py --checkout ../old pretrain vanilla wiki.txt --seed 0

The arguments are run.py's. run.py runs as given (its checks, its seeding, its model),
on the CPU with CUDA's batch path, and stops when the trainer asks for its batches; the
batch seed it took and the batches (--batches, numbered from the run's first) are then
built as the producer's workers build them. --checkout runs that checkout's src/ (a
commit's, from `git worktree add`) with its own data/.
"""

import argparse
import contextlib
import hashlib
import json
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Stopped(Exception):
    """The trainer asked for its batches: what a run starts from is all there."""


def run_start(run_argv):
    """{'batch_seed', 'initial_weights_md5', 'dataset', 'batch_size'} of run.py's run_argv on
    CUDA's batch path, run on the CPU up to its first batch."""
    import run
    import trainer
    from machinery import batch_producer, devices

    devices.builds_batches_ahead = lambda device: True  # CUDA's path, on the CPU
    found = {}

    def stop_at_batches(self):
        if self.batch_seed is None:  # as remaining_batches takes it
            self.batch_seed = batch_producer.batch_seed()
        weights = b''.join(
            v.detach().cpu().numpy().tobytes() for v in self.model.state_dict().values()
        )
        found.update(
            batch_seed=self.batch_seed, initial_weights_md5=hashlib.md5(weights).hexdigest(),
            dataset=self.train_dataset, batch_size=self.config.batch_size,
        )  # fmt: skip
        raise Stopped

    trainer.Trainer.remaining_batches = stop_at_batches
    stdout = contextlib.redirect_stdout(sys.stderr)  # stdout: the figures alone
    with tempfile.TemporaryDirectory() as folder, stdout:  # no params are written
        try:
            run.main([*run_argv, '--device', 'cpu', '--writing_params_path',
                      os.path.join(folder, 'unwritten.params')])  # fmt: skip
        except Stopped:
            return found
    raise SystemExit("run.py ended before training")


def batch_md5s(start, numbers):
    """{'batch K': md5 of its x and y} of the run's batches K (counted from its first)."""
    from machinery import batch_producer

    data = start['dataset']
    seeded = batch_producer.SeededBatches(data, start['batch_seed'])
    epoch = batch_producer.RunBatches(len(data), start['batch_size'], 0, 0, 1)
    examples = dict(epoch)  # {step: its examples}, the same in every epoch
    md5s = {}
    for k in numbers:
        x, y = seeded[k, examples[k % epoch.steps_per_epoch]]
        md5s[f'batch {k}'] = hashlib.md5(x.tobytes() + y.tobytes()).hexdigest()
    return md5s


def main(argv=None):
    argp = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    argp.add_argument('--checkout', default=HERE, help="the repository's checkout (this one)")
    argp.add_argument(
        '--batches', nargs='+', type=int, default=[0, 1, 22, 23],
        help="which batches (default 0 1 22 23: wiki.txt's first epoch's first two and last, "
        "the second's first)",
    )  # fmt: skip
    args, run_argv = argp.parse_known_args(argv)
    os.chdir(args.checkout)  # its data/ for bare file names
    sys.path[:0] = [os.path.join(args.checkout, 'src')]
    start = run_start(run_argv)
    made = {key: start[key] for key in ('batch_seed', 'initial_weights_md5')}
    print(json.dumps(dict(made, **batch_md5s(start, args.batches)), indent=1))


if __name__ == '__main__':
    main()
