"""Puts src/ (the handout's code and its machinery), tools/ and the repository's root on
sys.path, after this folder: the scripts here import it first, as each runs as
`python tools/NAME.py` from wherever the user is."""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[1:1] = [os.path.join(ROOT, folder) for folder in ('src', 'tools', '')]
