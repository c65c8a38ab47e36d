"""A teacher's lab demo of the assignment's lesson in a small world: the held-out people's
birthplaces, answered after finetuning on the other people's questions, with no
pretraining, after pretraining on one biography per person, and after pretraining on four
paraphrased biographies per person, side by side.

    python research/lab_demo.py --outdir lab

It writes two worlds of the same people, places and split (research/small_world.py: 240
people, 16 documents each, 180 finetuned and 60 held out; `one` repeats one biography per
person, `paraphrased` cycles through four in permuted sentence order, and is the world
results/README.md's `people240` rows were measured in), writes the untrained model of
each seed (research/untrained.py), and with one research/grid.py command per world
pretrains the variant on it (--pretrain: the handout's pretrain command on the 2021
schedule, 40 epochs at batch 32, the same steps on about the same characters in both
worlds), finetunes the pretrained and the untrained model on the 180 people's questions
and asks the 60 others' (full finetuning, 30 epochs at the handout's 6e-4, batch 16, seed
0); then it prints the three accuracies for each pretraining seed.

On the 2-core Intel Xeon of results/README.md it takes about 80 minutes (a pretraining
23-39 minutes, a finetuning 1-2), and 39 minutes on a 2-core AMD EPYC. RoPE answered
29-60 of the 60 paraphrased on the Xeon (seeds 0-4) and 9-46 on the EPYC (seeds 0-3; its
bf16 rounds otherwise, and a seed's run on one CPU is another training on the other),
33-50 with one biography (the Xeon, seeds 0-4), and 1-3 with no pretraining (chance: 3):
pretraining's lesson shows for every seed, the paraphrases' does not stand out from the
seeds' spread, and one seed can show it reversed (the EPYC's seed 0: 31 with one
biography, 9 with four paraphrases). What it makes stays in --outdir: run the same
command again after an interruption (Ctrl-C) and it goes on where it stopped;
--pretrain_seeds 0 1 2 adds rows.
"""

import import_paths  # noqa: F401 (first: src/ and tools/ on sys.path)

import argparse
import os
import subprocess
import sys

import grid
import records
import run
from machinery import devices, files

WORLDS = {'one': 1, 'paraphrased': 4}  # world: biographies per person
DOCUMENTS = 16  # per person
FINETUNE_SHARE = 0.75
EDITION = '2021'  # the schedule results/README.md's small-world pretrainings followed


def parse_args(argv):
    argp = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    argp.add_argument('--outdir', default='lab', help="where everything goes (default lab)")
    argp.add_argument(
        '--variant', default='rope', choices=list(run.VARIANT_EDITION),
        help="the model pretrained and finetuned (default rope)",
    )  # fmt: skip
    argp.add_argument(
        '--pretrain_seeds', nargs='+', type=int, default=[0], help="a row each (default 0)"
    )
    argp.add_argument(
        '--people', type=run.positive(int), default=240,
        help="people in each world, a quarter of them held out (default 240)",
    )  # fmt: skip
    argp.add_argument(
        '--pretrain_max_epochs', type=run.positive(int), default=40,
        help="each pretraining's epochs (default 40)",
    )  # fmt: skip
    devices.add_arguments(argp)
    args = argp.parse_args(argv)
    if round(args.people * (1 - FINETUNE_SHARE)) < 1:
        argp.error(f"--people {args.people}: too few to hold a quarter out")
    return args


def python(script, *argv):
    """Runs one of this repository's scripts with this Python; a failure stops the demo."""
    argv = [str(a) for a in argv]
    print(f"== {' '.join([script, *argv])}", flush=True)
    process = subprocess.Popen([sys.executable, os.path.join(import_paths.ROOT, script), *argv])
    try:
        status = process.wait()
    except KeyboardInterrupt:  # the terminal's Ctrl-C reached it too: it saves its state
        process.wait()
        raise
    if status:
        raise files.UserError(f"{script} ended with status {status} (its output is above)")


def world_dir(args, world):
    return os.path.join(args.outdir, world)


def make_worlds(args):
    for world, paraphrases in WORLDS.items():
        folder = world_dir(args, world)
        if not os.path.exists(os.path.join(folder, 'world.json')):
            python('research/small_world.py', '--seed', 0, '--outdir', folder,
                   '--people', args.people, '--documents', DOCUMENTS,
                   '--paraphrases', paraphrases, '--attributes', 0,
                   '--finetune_share', FINETUNE_SHARE)  # fmt: skip


def untrained(args, seed):
    """The untrained model of a seed, in the paraphrased world's vocabulary."""
    folder = world_dir(args, 'paraphrased')
    path = os.path.join(folder, f"{args.variant}.s{seed}.untrained.params")
    if not os.path.exists(path):
        python('research/untrained.py', args.variant, os.path.join(folder, 'world.txt'),
               *grid.VARIANT_FLAGS.get(args.variant, []), '--writing_params_path', path,
               '--edition', EDITION, '--seed', seed)  # fmt: skip
    return path


def pretrained_and_finetuned(args, world, floor=()):
    """The variant pretrained on a world with each seed (continuing an interrupted
    pretraining), each pretraining and the floor's params finetuned on the world's
    finetuning people and asked the held-out people's questions: one research/grid.py
    command, which skips what is done. Returns the world's record."""
    folder = world_dir(args, world)
    outdir = os.path.join(folder, 'grid')
    print(f"(each pretraining's progress: its .log in {outdir})", flush=True)
    python('research/grid.py', '--pretrain', args.variant,
           '--pretrain_seeds', *args.pretrain_seeds,
           '--pretrain_max_epochs', args.pretrain_max_epochs, '--pretrain_batch_size', 32,
           '--pretrain_edition', EDITION, *(['--pretrained', *floor] if floor else []),
           '--pretrain_corpus_path', os.path.join(folder, 'world.txt'),
           '--finetune_corpus_path', os.path.join(folder, 'finetune.tsv'),
           '--eval_corpus_path', os.path.join(folder, 'heldout.tsv'),
           '--test_corpus_path', os.path.join(folder, 'test_inputs.tsv'),
           '--max_epochs', 30, '--batch_size', 16, '--seeds', 0,
           '--device', args.device, '--precision', args.precision,
           '--outdir', outdir)  # fmt: skip
    return records.read_record(os.path.join(outdir, 'grid.json'))


def answered(record, model):
    """'RIGHT/TOTAL' of the held-out people, for the run finetuned from a model."""
    entry = record[f"{model} full s0"]
    return f"{int(entry['dev_correct'])}/{int(entry['dev_total'])}"


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        make_worlds(args)
        floor = [untrained(args, seed) for seed in args.pretrain_seeds]
        one_record = pretrained_and_finetuned(args, 'one')
        paraphrased_record = pretrained_and_finetuned(args, 'paraphrased', floor)
    except files.UserError as e:
        sys.exit(files.report(e))
    except KeyboardInterrupt:
        sys.exit("\nstopped: run the same command again to go on where it stopped")
    with open(os.path.join(world_dir(args, 'paraphrased'), 'heldout.tsv'), encoding='utf-8') as f:
        held_out = len(f.read().splitlines())
    columns = ('pretraining seed', 'no pretraining', 'one biography', 'four paraphrases')
    print(
        f"\nThe {held_out} held-out people answered by {args.variant} after finetuning on "
        f"the {args.people - held_out} others (chance: one in 20)"
    )
    print('  '.join(columns))
    for seed, floor_params in zip(args.pretrain_seeds, floor):
        pretrained = grid.pretrained_name(args.variant, seed)
        cells = (
            str(seed),
            answered(paraphrased_record, grid.model_name(floor_params)),
            answered(one_record, pretrained),
            answered(paraphrased_record, pretrained),
        )
        print('  '.join(cell.rjust(len(column)) for cell, column in zip(cells, columns)))


if __name__ == '__main__':
    main()
