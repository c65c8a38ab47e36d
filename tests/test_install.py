"""The CPU route of README's set-up: PyTorch's CPU build installed first, README's
`pip install -r requirements.txt` keeps it and brings no CUDA library; README,
requirements.txt and environment.yml name the same torch range and CPU index."""

import json
import re
import subprocess
import sys

from conftest import ROOT

CPU_INDEX = 'https://download.pytorch.org/whl/cpu'


def torch_range():
    return next(r for r in (ROOT / 'requirements.txt').read_text().split() if r.startswith('torch'))


def test_readme_environment_yml_and_the_starter_give_one_cpu_command():
    command = f'pip install "{torch_range()}" --index-url {CPU_INDEX}'
    assert command in (ROOT / 'README.md').read_text()
    assert f'# - --extra-index-url {CPU_INDEX}\n' in (ROOT / 'environment.yml').read_text()
    starter = (ROOT / 'grading' / 'starter.py').read_text()
    assert re.sub(r'\s+', ' ', command) in re.sub(r'\s+', ' ', starter)


def test_requirements_keep_the_torch_installed_and_add_no_cuda():
    """pip's plan for requirements.txt in this environment (whose torch is the CPU build in
    CI), offline: nothing of torch, triton or NVIDIA's libraries to install."""
    plan = subprocess.run(
        [
            sys.executable,
            '-m',
            'pip',
            'install',
            '--dry-run',
            '--no-index',
            '--quiet',
            '--report',
            '-',
            '-r',
            str(ROOT / 'requirements.txt'),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert plan.returncode == 0, plan.stderr
    names = [item['metadata']['name'].lower() for item in json.loads(plan.stdout)['install']]
    assert not [n for n in names if n in ('torch', 'triton') or n.startswith('nvidia')], names
