"""An untrained model's params: the variant as run.py initialises it with --seed, before any
training. It is the floor a probe is measured against: what the tools find in a model
that learned nothing (grid.py --pretrained finetunes it as it finetunes a pretrained one).

    python research/untrained.py vanilla wiki.txt --seed 0 \\
        --writing_params_path vanilla.untrained.params

The arguments are run.py pretrain's (its checks included); its card (PATH.json) says
phase 'untrained' and 0 epochs.
"""

import import_paths  # noqa: F401 (first: src/ and tools/ on sys.path)

import sys

import run
from machinery import files, params_files, run_cards


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args = run.parse_args(['pretrain', *argv])
    try:
        if not args.writing_params_path:
            raise files.UserError("--writing_params_path: where to write the params")
        run.check_args(args)
        corpus = run.load_pretrain_dataset(args)
        gpt = run.build_model(args, corpus)  # seeded with --seed, as run.py's phases are
        path = args.writing_params_path
        files.atomic_save(params_files.written_params(gpt), path)
        card = dict(run_cards.common(args, path), phase='untrained', epochs=0)
        run_cards.write(card, path)
    except files.UserError as e:
        sys.exit(files.report(e))
    print(f"an untrained {args.variant} model (--seed {args.seed}) written to {path}")


if __name__ == '__main__':
    main()
