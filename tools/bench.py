"""Speed of this codebase against the plain minGPT path, measured in one run on this machine.

    python tools/bench.py [--steps 5] [--questions 20] [--params vanilla.finetune.params]
                        [--variant vanilla|synthesizer|perceiver|rope] [--bottleneck_dim 32]
                        [--device cuda] [--precision fp16] [--paths eager compiled+graphed]
                        [--concurrent 5]

Where --variant and --bottleneck_dim are left out, the variant and the perceiver's
bottleneck are the params file's (without --params: vanilla and 32).

Pretraining: one step (building the batch of 128 span-corruption examples of wiki.txt,
then forward, backward, clipping, AdamW), with the same model and batch for both paths:
  plain  the model's forward as the handout writes it: fp32, every row padded to 127
         positions, torch's dropout (the original minGPT code path)
  ours   the Trainer's step: GPT.forward with packing (only positions that can affect the loss),
         dropout.Dropout, and the precision run.py picks (--precision auto); on a GPU
         the whole padded batch, run each of the ways --paths names: eager, graphed
         (replayed from a CUDA graph), compiled (torch.compile), compiled+graphed (what
         run.py's pretraining does on CUDA); on CUDA all but compiled by default. There the
         batches are built ahead by worker processes, so a step waits for the longer of
         the two, not for both; each path's start (compiling, capturing) is timed apart,
         and a graph's replay alone
--concurrent K (CUDA): K runs' graphed steps, each its own model, optimizer and graph,
replayed one after another on one stream and then each on a stream of its own at once:
whether one run's graphed step, about a tenth of a big GPU, leaves room for another's.
evaluate: time per birth_dev.tsv question, greedy-decoding 32 characters
  plain  one question at a time, re-running the whole prefix for every character
  ours   decoding.greedy_complete: questions batched by length, each step feeding only the
         newest character but to attention (decoding.Cache; the perceiver recomputes the
         prefix instead), early stop
Model FLOP/s counts only the work our step does, as a fraction of the measured matmul
peak of this machine at the same precision (square products of 2048 on the CPU, 8192 on
a GPU; vanilla and rope: model_flops does not count the synthesizer's or the
perceiver's layers).
"""

import import_paths  # noqa: F401 (first: src/ and tools/ on sys.path)

import machinery.cpu_libraries  # noqa: F401 (first: it sets up MKL and oneDNN before torch)

import argparse
import itertools
import math
import random
import sys
import time

import torch
import torch.nn as nn

import dataset
import run
import trainer
import utils
from machinery import (
    batch_producer,
    cuda_graphs,
    decoding,
    devices,
    dropout,
    files,
    packing,
    params_files,
)


def make_model(vocab_size, variant='vanilla', bottleneck_dim=32):
    torch.manual_seed(0)
    return run.new_model(variant, vocab_size, bottleneck_dim)


def torch_dropout(gpt):
    """gpt with torch's own dropout again, as the original uses (the Trainer makes its
    nn.Dropout layers dropout.Dropout)."""
    for layer in gpt.modules():
        if type(layer) is dropout.Dropout:
            layer.__class__ = nn.Dropout
    return gpt


def decoding_model(args, corpus):
    """The model that evaluation is timed with: --params loaded into a model of its variant
    and bottleneck, or without it an untrained one. Sets args.variant and
    args.bottleneck_dim where they were left out: the file's, else vanilla and 32."""
    if not args.params:
        args.variant, args.bottleneck_dim = args.variant or 'vanilla', args.bottleneck_dim or 32
        return make_model(corpus.vocab_size, args.variant, args.bottleneck_dim)
    args.variant, args.bottleneck_dim = params_files.variant_and_bottleneck(
        args.params, args.variant, args.bottleneck_dim, '--params'
    )
    gpt = make_model(corpus.vocab_size, args.variant, args.bottleneck_dim)
    params_files.load_params(args.params, gpt, 'wiki.txt', run.model_name(args.variant), '--params')
    return gpt


def time_steps(steps, n, device):
    """Median seconds of each of the given functions, run in turn n times after a warm-up:
    interleaving them spreads a shared machine's slow spells over all of them."""
    synchronize = synchronizer(device)
    for step in steps:
        step()
    times = [[] for _ in steps]
    for _ in range(n):
        for step, record in zip(steps, times):
            start = time.perf_counter()
            step()
            synchronize()
            record.append(time.perf_counter() - start)
    return [sorted(record)[n // 2] for record in times]


def matmul_peak(dtype, device):
    """FLOP/s of the best of 10 square matrix products big enough to keep the device busy
    (n = 2048 on the CPU, 8192 on a GPU, whose peak a small product never reaches)."""
    n = 2048 if device == 'cpu' else 8192
    a = torch.randn(n, n, dtype=dtype, device=device)
    b = torch.randn(n, n, dtype=dtype, device=device)
    seconds = min(time_steps([lambda: a @ b], 1, device)[0] for _ in range(10))
    return 2 * n**3 / seconds


# our step's ways of running on a GPU: (compiled, replayed from CUDA graphs)
PATHS = {
    'eager': (False, False),
    'graphed': (False, True),
    'compiled': (True, False),
    'compiled+graphed': (True, True),
}


def step_config(device, precision, **ways):
    """The Trainer's settings of every timed step: the pretraining's batch of 128 and its
    learning rate, 6e-3; `ways` are how the step runs (compile, cuda_graph)."""
    return trainer.TrainerConfig(batch_size=128, learning_rate=6e-3, device=device,
                                 precision=precision, **ways)  # fmt: skip


def first_batch(corpus):
    """The batch every step is timed on: the first 128 documents' span corruptions, seeded."""
    random.seed(0)
    x, y = zip(*[corpus[i] for i in range(128)])
    return torch.stack(x), torch.stack(y)  # (128, 127), on the CPU as the trainer builds them


def bench_pretraining(corpus, steps_per_path, variant, bottleneck_dim, precision, device, paths):
    """Median seconds of building a batch (the trainer's, span corruption of 128 documents
    on the CPU, the same in every path) and of each path's step on the same batch: plain,
    then ours run each of the ways in `paths`. Also the seconds each of ours took to
    start (its first steps: compiling, capturing), each graph's replay alone, and the
    positions of each row that our step computes."""
    x, y = first_batch(corpus)
    synchronize = synchronizer(device)
    steps, starts, replays, built = [], {}, {}, itertools.count()
    for path in ['plain', *paths]:
        compile, graphed = PATHS.get(path, (False, False))
        gpt = make_model(corpus.vocab_size, variant, bottleneck_dim)
        config = step_config(device, 'fp32' if path == 'plain' else precision,
                             compile=compile, cuda_graph=graphed)  # fmt: skip
        t = trainer.Trainer(gpt, corpus, None, config)
        if path == 'plain':
            torch_dropout(gpt)

        def step(gpt=gpt, t=t, plain=path == 'plain'):
            if plain:
                loss = gpt(*t.to_device(x, y))[1]
                t.update(loss)
            else:
                t.train_step(x, y)  # the trainer's: packing on the CPU, autocast, graphs

        start = time.perf_counter()
        for _ in range(cuda_graphs.WARMUP + 2 if graphed else 1):
            step()  # compiles, and a graphed step's eager steps, capture and first replay
        synchronize()
        starts[path] = time.perf_counter() - start
        steps.append(step)
        graph = graph_of(t) if graphed and t.graphed.captured else None
        if graph is not None:
            replays[path] = time_steps([graph.replay], steps_per_path, device)[0]
    steps.insert(0, lambda t=t: t.batch(corpus, next(built) % t.steps_per_epoch))  # ours
    names = ['batch', 'plain', *paths]
    results = dict(zip(names, time_steps(steps, steps_per_path, device)))
    # positions our step computes, per row: the CPU packs, a GPU computes the padded batch
    rows = packing.target_lengths(y) if devices.packs_batches(device) else [y.size(1)] * len(y)
    return results, starts, replays, [int(n) for n in rows]


def graphed_runs(corpus, k, variant, bottleneck_dim, precision):
    """K runs alone as the graphed path trains them (each from bench's initial model, on
    bench's batch), each stepped until its graph is captured and replayed once: their
    trainers, which own the memory their graphs read and write."""
    x, y = first_batch(corpus)
    config = step_config('cuda', precision, cuda_graph=True)
    runs = []
    for _ in range(k):
        t = trainer.Trainer(make_model(corpus.vocab_size, variant, bottleneck_dim), corpus,
                            None, config)  # fmt: skip
        for _ in range(cuda_graphs.WARMUP + 2):
            t.train_step(x, y)  # its eager steps, its capture and its first replay
        runs.append(t)
    return runs


def graph_of(run):
    """The CUDA graph of a run's step (one batch shape)."""
    (captured,) = run.graphed.captured.values()
    return captured.graph


def replay_at_once(graphs, streams):
    """Each graph replayed on a stream of its own, all after the work queued so far and
    before the work queued next."""
    main = torch.cuda.current_stream()
    for stream, graph in zip(streams, graphs):
        stream.wait_stream(main)
        with torch.cuda.stream(stream):
            graph.replay()
    for stream in streams:
        main.wait_stream(stream)


def bench_concurrent_replays(corpus, k, variant, bottleneck_dim, precision, steps):
    """Median seconds of one run's graphed step replayed alone, of K runs' replayed one
    after another on one stream, and of the K at once, each on a stream of its own."""
    runs = graphed_runs(corpus, k, variant, bottleneck_dim, precision)
    graphs = [graph_of(run) for run in runs]
    streams = [torch.cuda.Stream() for _ in graphs]

    def one_after_another():
        for graph in graphs:
            graph.replay()

    return time_steps(
        [graphs[0].replay, one_after_another, lambda: replay_at_once(graphs, streams)],
        steps,
        'cuda',
    )


def synchronizer(device):
    """A function that waits for the device's work to end."""
    return {'cuda': torch.cuda.synchronize, 'mps': torch.mps.synchronize}.get(device, lambda: None)


def producer_seconds(corpus, workers, epochs=2):
    """Seconds between the batches of 128 that batch_producer.BatchProducer's `workers`
    processes hand over, over `epochs` epochs after its first batch."""
    producer = batch_producer.BatchProducer(corpus, 128, 0, 0, epochs, seed=0, workers=workers)
    next(producer)
    start = time.perf_counter()
    n = sum(1 for _ in producer)
    producer.close()
    return (time.perf_counter() - start) / n


def duration(seconds):
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.1f} min"


def model_flops(kept_positions, rows, n_embd=256, n_layer=4, vocab=256):
    """Forward + backward FLOPs of the work our step does: 6 per weight per position in
    the linear layers, plus the attention products over each row's causal triangle."""
    linear = n_layer * 12 * n_embd * n_embd + n_embd * vocab
    attention_pairs = sum(n * (n + 1) / 2 for n in rows)
    return 6 * linear * kept_positions + 3 * n_layer * 4 * n_embd * attention_pairs


def bench_evaluate(corpus, gpt, n_plain, device):
    gpt.to(device).eval()
    questions = files.read_lines('birth_dev.tsv')
    room = decoding.question_room(run.BLOCK_SIZE, run.ANSWER_LENGTH)
    prompts = [decoding.encode_question(q.split('\t')[0], corpus, room).ids for q in questions]
    mask = corpus.stoi[corpus.MASK_CHAR]

    start = time.perf_counter()
    for p in prompts[:n_plain]:
        utils.sample(gpt, p[None].to(device), run.ANSWER_LENGTH)
    plain = (time.perf_counter() - start) / n_plain

    start = time.perf_counter()
    decoding.greedy_complete(gpt, prompts, run.ANSWER_LENGTH, mask)
    ours = (time.perf_counter() - start) / len(prompts)
    return plain, ours, len(prompts)


def parse_args(argv):
    argp = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    argp.add_argument('--steps', type=int, default=5, help="timed pretraining steps per path")
    argp.add_argument(
        '--questions', type=int, default=20, help="dev questions for the plain decoder"
    )
    argp.add_argument(
        '--params',
        help="finetuned params to decode with (default: untrained, "
        "which never stops early: the slowest case for ours)",
    )
    argp.add_argument(
        '--variant',
        choices=list(run.VARIANT_EDITION),
        help="default: the params file's, else vanilla",
    )
    argp.add_argument(
        '--bottleneck_dim',
        type=run.positive(int),
        help="the perceiver's (default: the params file's, else 32)",
    )
    devices.add_arguments(argp)
    argp.add_argument(
        '--paths',
        nargs='+',
        choices=list(PATHS),
        help="the ways our step runs (CUDA only but eager; default: on CUDA eager, graphed "
        "and compiled+graphed, elsewhere eager)",
    )
    argp.add_argument(
        '--concurrent', type=run.positive(int),
        help="CUDA: also K runs' graphed steps replayed one after another, and at once on "
        "K streams",
    )  # fmt: skip
    return argp.parse_args(argv)


def report_pretraining(args, corpus, precision, device):
    times, starts, replays, rows = bench_pretraining(
        corpus, args.steps, args.variant, args.bottleneck_dim, precision, device, args.paths
    )
    # what a user waits for: each step builds its batch first, on the CPU; ours on CUDA
    # takes batches that producer processes build meanwhile
    batch = times['batch']
    positions = 128 * (run.BLOCK_SIZE - 1)
    print(
        f"pretraining step (batch 128 x 127 positions; ours computes {sum(rows)} of {positions};"
        f" each path's time includes building the batch, {batch * 1000:.1f} ms):"
    )
    ahead = None
    if devices.builds_batches_ahead(device):
        workers = batch_producer.worker_count()
        ahead = producer_seconds(corpus, workers)
        alone = producer_seconds(corpus, 1) if workers > 1 else ahead
        print(
            f"  ours takes its batches from {workers} producer processes, which hand one over "
            f"every {ahead * 1000:.2f} ms (one process alone: every {alone * 1000:.2f} ms); "
            f"its step waits for the longer of that and its own work"
        )
    plain = times['plain'] + batch
    # a step of ours: its own work and its batch's, which workers build meanwhile on CUDA
    per_step = lambda path: max(times[path], ahead) if ahead else times[path] + batch
    print(f"  plain: {plain * 1000:8.2f} ms/step  {positions / plain:9,.0f} tokens/s")
    for path in args.paths:
        ours = per_step(path)
        replay = (
            f"; the graph's replay alone {replays[path] * 1000:.2f} ms" if path in replays else ""
        )
        print(
            f"  ours, {path}: {ours * 1000:8.2f} ms/step  {positions / ours:9,.0f} tokens/s   "
            f"{plain / ours:.1f}x faster (its own work {times[path] * 1000:.2f} ms; first "
            f"steps {starts[path]:.1f} s{replay})"
        )
    best = min(args.paths, key=lambda path: times[path])
    ours = per_step(best)
    steps_650 = 650 * math.ceil(len(corpus) / 128)
    print(
        f"  650-epoch pretraining ({steps_650} steps): plain {duration(steps_650 * plain)}, "
        f"ours {best} {duration(steps_650 * ours)} and its first steps"
    )
    if args.variant in ('vanilla', 'rope'):
        flops = model_flops(sum(rows), rows)
        dtype = devices.autocast_dtype(precision) or torch.float32
        peak = matmul_peak(dtype, device)
        print(
            f"  model FLOP/s (ours, {best}, batch building left out): "
            f"{flops / times[best] / 1e9:.0f} GFLOP/s = {flops / times[best] / peak:.0%} of "
            f"this machine's {precision} matmul peak ({peak / 1e9:.0f} GFLOP/s)"
        )


def main(argv=None):
    args = parse_args(argv)
    try:
        device = devices.pick_device(args.device)
        precision = devices.training_precision(args.precision, device)
        if args.paths is None:
            args.paths = ['eager', 'graphed', 'compiled+graphed'] if device == 'cuda' else ['eager']
        gpu_only = [path for path in args.paths if path != 'eager']
        cuda_flags = [f"--paths {' '.join(gpu_only)}"] if gpu_only else []
        cuda_flags += [f"--concurrent {args.concurrent}"] if args.concurrent else []
        if (args.concurrent or 0) > 32:  # each run's own capture stream, from a pool of 32
            raise files.UserError(f"--concurrent {args.concurrent}: 32 runs at most")
        if cuda_flags and device != 'cuda':
            raise files.UserError(
                f"{', '.join(cuda_flags)}: for CUDA GPUs only, and this runs on the {device}"
            )
        corpus = dataset.CharCorruptionDataset(files.read_text('wiki.txt'), run.BLOCK_SIZE)
        decoder = decoding_model(args, corpus)
    except files.UserError as e:
        sys.exit(files.report(e))
    print(
        f"machine: {devices.describe(device)} ({torch.get_num_threads()} threads); "
        f"variant {args.variant}; our precision {precision}"
    )
    report_pretraining(args, corpus, precision, device)
    if args.concurrent:
        k = args.concurrent
        alone, serial, together = bench_concurrent_replays(
            corpus, k, args.variant, args.bottleneck_dim, precision, args.steps
        )
        print(
            f"{k} runs' graphed steps ({precision}): one alone {alone * 1000:.2f} ms; the {k} "
            f"one after another {serial * 1000:.2f} ms; at once on {k} streams "
            f"{together * 1000:.2f} ms, {k * alone / together:.2f} runs' steps in the time of one"
        )
    plain, ours, n = bench_evaluate(corpus, decoder, args.questions, device)
    untrained = '' if args.params else ', untrained model'
    print(f"evaluate (birth_dev.tsv, 32 characters per question{untrained}):")
    print(f"  plain: {plain * 1000:8.1f} ms/question (first {args.questions})")
    print(f"  ours:  {ours * 1000:8.1f} ms/question (all {n})   {plain / ours:.1f}x faster")


if __name__ == '__main__':
    main()
