"""Running the probes: what each probe runs of a submission (probe_arguments), the folder
it runs in (prepare_folder), and the process of its own it runs in, with a time limit
(run_probe). What runs inside that process is probes.py's.
"""

import multiprocessing
import os
import shutil
import sys

import torch

import probes
from editions import ACCURACY_FILE, BLOCK_SIZE, DATA_FILES, SPAN_BLOCK, SPAN_DRAWS, SPAN_SEED
from references import (
    perceiver_case,
    rope_apply_inputs,
    rope_attention_case,
    span_documents,
    synthesizer_case,
)


def probe_arguments(g, key):
    """(probe name, arguments, files to put in its folder) of a probe of g's submission."""
    edition, variant = g.edition, g.edition['variant']
    flags = ['--edition', g.edition_name] if g.takes_edition else []
    writing = ['--writing_params_path', f"{key}.params"]
    finetune = ['--finetune_corpus_path', 'birth_places_train.tsv']
    if key == 'finetune':
        return 'command', dict(
            argv=['finetune', 'vanilla', 'wiki.txt'] + writing + finetune + flags
        )
    if key == 'pretrain':
        return 'command', dict(argv=['pretrain', 'vanilla', 'wiki.txt'] + writing + flags)
    if key == 'finetune_pretrained':
        argv = ['finetune', 'vanilla', 'wiki.txt', '--reading_params_path', 'pretrained.params']
        argv += writing + finetune + flags
        return 'command', dict(argv=argv, reading_params='pretrained.params')
    if key == 'variant':
        argv = ['finetune', variant, 'wiki.txt'] + writing + finetune + edition['flags'] + flags
        return 'command', dict(argv=argv)
    if key == 'span':
        padded = SPAN_BLOCK + edition['extra_pad']
        text = '\n'.join(span_documents())
        return 'span', dict(
            text=text, block_size=SPAN_BLOCK, padded_length=padded, draws=SPAN_DRAWS,
            seed=SPAN_SEED,
        )  # fmt: skip
    if key == 'span_corpus':
        return 'span_corpus', dict(
            block_size=BLOCK_SIZE, padded_length=BLOCK_SIZE + edition['extra_pad']
        )
    if key == 'synthesizer':
        weights, inputs = synthesizer_case()
        config = dict(vocab_size=10, block_size=8, n_layer=1, n_head=3, n_embd=6)
        return 'module', dict(
            modules=['attention'], name='SynthesizerAttention', config=config, state=weights,
            inputs=inputs,
        )  # fmt: skip
    if key in ('down', 'up'):
        weights, inputs = perceiver_case(key)
        config = dict(vocab_size=10, block_size=8, n_layer=4, n_head=2, n_embd=6,
                      bottleneck_dim=4, perceiver=True)  # fmt: skip
        name = 'DownProjectBlock' if key == 'down' else 'UpProjectBlock'
        return 'module', dict(
            modules=['perceiver', 'model', 'models'],
            name=name,
            config=config,
            state=weights,
            inputs=inputs,
        )
    if key == 'rope_table':
        return 'function', dict(module_name='attention', name='precompute_rotary_emb', args=(8, 12))
    if key == 'rope_apply':
        args = rope_apply_inputs()
        return 'function', dict(module_name='attention', name='apply_rotary_emb', args=args)
    if key == 'rope_attention':
        weights, inputs = rope_attention_case()
        config = dict(vocab_size=10, block_size=8, n_layer=1, n_head=2, n_embd=16, rope=True)
        # precompute_rotary_emb stands in as the right table: this test is the wiring's
        stand_ins = {'precompute_rotary_emb': weights['rope_cache']}
        return 'module', dict(
            modules=['attention'], name='CausalSelfAttention', config=config, state=weights,
            inputs=inputs, stand_ins=stand_ins,
        )  # fmt: skip
    if key == 'machinery':
        return 'machinery', dict(variant=variant)
    if key == 'london':
        return 'london', dict(accuracy_file=ACCURACY_FILE)
    raise KeyError(key)


def start_method():
    """A fresh process per probe: on Linux forked from a server that has torch loaded
    already, elsewhere started from scratch (a few seconds more each)."""
    if sys.platform.startswith('linux'):  # macOS forks badly once system frameworks load
        context = multiprocessing.get_context('forkserver')
        # what every probe loads, once: creating an optimizer imports torch._dynamo (1.5 s)
        context.set_forkserver_preload(['torch', 'torch._dynamo', 'numpy', 'probes', 'sandbox'])
        return context
    return multiprocessing.get_context('spawn')


CONTEXT = start_method()


def run_probe(folder, name, arguments, timeout, box=None):
    """Runs one probe in a process of its own: {'ok': result} or {'error': reason}. The
    process works in folder/files (prepare_folder's); its inputs, log and result lie in
    `folder`, which stays the grader's, so that the process can write its log and result
    but put nothing else in their place (a link to a file of root's, say). `box`: the
    sandbox.Sandbox whose user the process runs as, or None."""
    inputs, log, result = folder / 'probe.inputs', folder / 'probe.log', folder / 'probe.result'
    torch.save(arguments, inputs)
    for path in (log, result):
        path.touch()
        if box:
            box.give(path)
    process = CONTEXT.Process(
        target=probes.run_probe,
        args=(name, str(folder / 'files'), str(inputs), str(log), str(result), box, timeout),
    )
    process.start()
    process.join(timeout)
    timed_out = process.is_alive()
    if timed_out:
        process.kill()
        process.join()
    if box:  # the grader's again: the user's files are removed once the probes are done
        for path in (log, result):
            os.chown(path, os.getuid(), os.getgid())
    if timed_out:
        return {'error': f"timed out after {timeout:g} s"}
    if result.stat().st_size == 0:
        tail = last_line(log)
        return {
            'error': f"the process ended without a result (exit code {process.exitcode})"
            + (f": {tail}" if tail else '')
        }
    try:
        outcome = torch.load(result, weights_only=True)
    except Exception as e:
        return {'error': f"its result cannot be read: {str(e).splitlines()[0][:120]}"}
    if outcome.get('error', '').endswith('printed:'):
        outcome['error'] += ' ' + (last_line(log) or 'nothing')
    return outcome


def tail(path, size=65536):
    """The end of a text file (a submission may print without end)."""
    try:
        with open(path, 'rb') as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - size))
            return f.read().decode('utf-8', errors='replace')
    except OSError:
        return ''


def last_line(path):
    lines = [line.strip() for line in tail(path).split('\n')]
    lines = [line for line in lines if line]
    return lines[-1][:200] if lines else ''


def prepare_folder(folder, submission, data, box=None):
    """A probe's folder, and in it files/, where the probe works: copies of the submission's
    src/ and london_baseline.py, and the data; files/ is `box`'s user's where given."""
    files = folder / 'files'
    files.mkdir(parents=True)
    outputs = ('__pycache__', '*.pyc', '*.params', '*.resume', '*.predictions', 'expt', '*.zip')
    shutil.copytree(submission / 'src', files / 'src', ignore=shutil.ignore_patterns(*outputs))
    if (submission / 'london_baseline.py').is_file():
        shutil.copy(submission / 'london_baseline.py', files)
    for name in DATA_FILES:
        shutil.copy(data / name, files)
    return files
