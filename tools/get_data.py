"""The assignment's four data files into data/, from the course's starter archive, each
checked against its recorded md5 sum (the handout's commands do the same on first use).

    python tools/get_data.py                  # from the course's addresses, if reachable
    python tools/get_data.py --from a5.zip    # a starter zip you have (or a folder, or an address)

Files already in data/ and right are kept; one that is not the course's is named, and
left for you to remove. data/README.md says where the files come from and their sums.
"""

import import_paths  # noqa: F401 (first: src/ and tools/ on sys.path)

import argparse
import sys

from machinery import course_data, files


def parse_args(argv):
    argp = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    argp.add_argument(
        '--from',
        dest='source',
        metavar='ZIP_OR_ADDRESS',
        help="a starter zip, a folder holding the files, or an address "
        "(default: the course's addresses, data/README.md)",
    )
    argp.add_argument('--data', default=None, help='the folder to fill (default: data/)')
    return argp.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    folder = args.data or files.DATA_DIR
    where = [args.source] if args.source else course_data.sources()
    try:
        course_data.fetch(where, folder)
    except files.UserError as e:
        sys.exit(files.report(e))
    print(f"{folder}/: the course's four data files, checked (md5)")


if __name__ == '__main__':
    main()
