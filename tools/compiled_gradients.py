"""Where compiled training parts from eager in bf16: the handout's model's loss and
gradients on one batch, eager and compiled under bf16 autocast, each against the same
computation in fp32, at the initial weights and after some eager training steps.

    python tools/compiled_gradients.py [--variant vanilla] [--after 0 30 100]
        [--paths inductor aot_eager inductor-forward inductor-backward
                 inductor:emulate_precision_casts=True] [--device cuda]

On a GPU, `--compile` in bf16 diverges where eager learns (docs/gpus-and-macs.md); the
same traced graph run by eager kernels (aot_eager) learns, and so does inductor in fp32.
This finds the layers: for each parameter, the relative error of its gradient against
fp32's, |g - g_fp32| / |g_fp32| (vector norms), eager's and each compiled path's. bf16
puts eager's near 5e-3; a path far above eager names the layers where its kernels
compute differently. The paths, each compiled afresh:

  inductor             torch.compile as --compile trains (inductor's kernels throughout)
  aot_eager            the same traced forward and backward, run by eager kernels
  inductor-forward     inductor's kernels for the forward, the backward's graph eager
  inductor-backward    the forward's graph eager, inductor's kernels for the backward
  inductor:NAME=VALUE  inductor with one setting of torch._inductor.config changed:
                       emulate_precision_casts=True, pattern_matcher=False, ...

The weights are those after each --after count of eager bf16 training steps (the
Trainer's step, learning rate 6e-3, batches of 128 from wiki.txt); the batch measured is
bench.py's. Dropout is off: compiled dropout draws other masks. In the split paths the
eager side runs inductor's decomposed graph (aten ops), not the model's own modules.
"""

import import_paths  # noqa: F401 (first: src/ and tools/ on sys.path)

import machinery.cpu_libraries  # noqa: F401 (first: it sets up MKL and oneDNN before torch)

import argparse
import ast
import contextlib
import math
import random
import sys

import torch
import torch._functorch.config
import torch._inductor.config

import bench
import dataset
import run
import trainer
from machinery import devices, dropout, files

SPLIT = {'inductor-forward': 'forward', 'inductor-backward': 'backward'}


def parse_path(text):
    """(backend, inductor config changes) of a --paths entry; raises UserError."""
    if text in ('inductor', 'aot_eager', *SPLIT):
        return text, {}
    name, _, value = text.removeprefix('inductor:').partition('=')
    if not text.startswith('inductor:') or not name or not value:
        raise files.UserError(
            f"--paths {text}: not a path (inductor, aot_eager, inductor-forward, "
            f"inductor-backward, inductor:NAME=VALUE)"
        )
    try:
        value = ast.literal_eval(value)
    except (ValueError, SyntaxError):
        raise files.UserError(f"--paths {text}: {value} is not a Python value") from None
    try:
        with torch._inductor.config.patch({name: value}):
            pass
    except (AttributeError, KeyError, AssertionError, TypeError):
        raise files.UserError(f"--paths {text}: torch._inductor.config has no {name}") from None
    return 'inductor', {name: value}


def inductor_on(side):
    """A torch.compile backend that gives inductor's kernels one side of the step (forward
    or backward) and runs the other side's graph as eager aten ops."""
    from functorch.compile import make_boxed_func
    from torch._inductor.compile_fx import compile_fx, compile_fx_inner

    def backend(gm, example_inputs):
        def inner(graph, inputs, **kwargs):
            if kwargs.get('is_backward', False) == (side == 'backward'):
                return compile_fx_inner(graph, inputs, **kwargs)
            return make_boxed_func(graph.forward)

        return compile_fx(gm, example_inputs, inner_compile=inner)

    return backend


def trained_weights(corpus, variant, device, after):
    """The model's state after each count in `after` of eager bf16 training steps."""
    gpt = dropout.switched_off(bench.make_model(corpus.vocab_size, variant))
    t = trainer.Trainer(gpt, corpus, None, bench.step_config(device, 'bf16', cuda_graph=False))
    random.seed(1)
    states, done = {}, 0
    for count in sorted(set(after)):
        for _ in range(count - done):
            x, y = zip(*[corpus[random.randrange(len(corpus))] for _ in range(128)])
            t.train_step(torch.stack(x), torch.stack(y))
        done = count
        states[count] = {k: v.detach().clone() for k, v in gpt.state_dict().items()}
    return gpt, states


def loss_and_gradients(gpt, forward, x, y, precision, device):
    """The loss (a float) and each parameter's gradient (fp32) of one step's forward."""
    gpt.zero_grad(set_to_none=True)
    with devices.autocast(device, precision):
        loss = forward(x, y)[1]
    loss.backward()
    grads = {name: p.grad.detach().float().clone() for name, p in gpt.named_parameters()}
    return loss.item(), grads


def relative_error(g, reference):
    return (torch.linalg.vector_norm(g - reference) / torch.linalg.vector_norm(reference)).item()


def uncached():
    """A context in which each path compiles afresh: no graph or kernels cached by another
    path (whose compiler the cache keys need not tell apart from inductor's own)."""
    stack = contextlib.ExitStack()
    for config, name in [(torch._inductor.config, 'fx_graph_cache'),
                         (torch._functorch.config, 'enable_autograd_cache')]:  # fmt: skip
        if hasattr(config, name):
            stack.enter_context(config.patch({name: False}))
    return stack


def measure(gpt, states, paths, x, y, device):
    """{count: {'fp32' | 'eager' | path: (loss, {name: gradient})}}."""
    results = {count: {} for count in states}
    for count, state in states.items():
        gpt.load_state_dict(state)
        results[count]['fp32'] = loss_and_gradients(gpt, gpt, x, y, 'fp32', device)
        results[count]['eager'] = loss_and_gradients(gpt, gpt, x, y, 'bf16', device)
    for path in paths:
        backend, changes = parse_path(path)
        backend = inductor_on(SPLIT[path]) if path in SPLIT else backend
        with uncached(), torch._inductor.config.patch(changes):
            torch._dynamo.reset()
            forward = torch.compile(gpt, backend=backend, **devices.COMPILE_OPTIONS)
            for count, state in states.items():
                gpt.load_state_dict(state)
                results[count][path] = loss_and_gradients(gpt, forward, x, y, 'bf16', device)
    return results


def zero_in_exact_arithmetic(fp32_grads):
    """The parameters whose fp32 gradient is rounding alone (under a millionth of the
    largest parameter's): the attention keys' biases, which add the same score to every
    key of a query and so leave its softmax as it was."""
    norms = {n: torch.linalg.vector_norm(g).item() for n, g in fp32_grads.items()}
    return {n for n, norm in norms.items() if norm < 1e-6 * max(norms.values())}


def report(results, paths):
    """Per --after count, a table of each path's loss and each parameter's gradient
    error, and a line per compiled path: its errors over eager's."""
    columns = ['eager', *paths]
    lines = []
    for count, by_path in results.items():
        fp32_loss, fp32_grads = by_path['fp32']
        zero = zero_in_exact_arithmetic(fp32_grads)
        lines.append(
            f"after {count} eager steps: loss in fp32 {fp32_loss:.5f}; the relative error of "
            f"each gradient (|g| where fp32's is 0 but for rounding)"
        )
        lines.append('| parameter | ' + ' | '.join(f"{c} (bf16)" for c in columns) + ' |')
        lines.append('|---' * (len(columns) + 1) + '|')
        losses = [f"{by_path[c][0]:.5f}" for c in columns]
        lines.append('| loss | ' + ' | '.join(losses) + ' |')
        measured = {n: g for n, g in fp32_grads.items() if n not in zero}
        errors = {c: {n: relative_error(by_path[c][1][n], g) for n, g in measured.items()}
                  for c in columns}  # fmt: skip
        for name in fp32_grads:
            if name in zero:
                norms = [torch.linalg.vector_norm(by_path[c][1][name]).item() for c in columns]
                cells = [f"|g| {norm:.1e}" for norm in norms]
            else:
                cells = [f"{errors[c][name]:.2e}" for c in columns]
            lines.append(f"| {name} | " + ' | '.join(cells) + ' |')
        eager = errors['eager']
        for c in paths:
            ratios = sorted((errors[c][n] / eager[n], n) for n in eager if eager[n] > 0)
            if not ratios or any(math.isnan(ratio) for ratio, _ in ratios):
                lines.append(f"{c}: no comparison (its gradients are not finite, or eager's "
                             f"equal fp32's)")  # fmt: skip
                continue
            median, (worst, name) = ratios[len(ratios) // 2][0], ratios[-1]
            lines.append(
                f"{c}: its gradients' error is {median:.2f}x eager's (median over the "
                f"parameters), at most {worst:.2f}x ({name})"
            )
        lines.append('')
    return '\n'.join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--variant', default='vanilla', choices=list(run.VARIANT_EDITION))
    parser.add_argument('--after', type=int, nargs='+', default=[0, 30, 100],
                        help='eager bf16 training steps before each measurement')  # fmt: skip
    parser.add_argument('--paths', nargs='+',
                        default=['inductor', 'aot_eager', 'inductor-forward', 'inductor-backward',
                                 'inductor:emulate_precision_casts=True'])  # fmt: skip
    parser.add_argument('--device', default='auto', choices=['auto', 'cuda', 'cpu'])
    args = parser.parse_args(argv)
    try:
        device = devices.pick_device(args.device)
        for path in args.paths:
            parse_path(path)
        if any(n < 0 for n in args.after):
            raise files.UserError("--after: a number of steps, 0 or more")
        corpus = dataset.CharCorruptionDataset(files.read_text('wiki.txt'), run.BLOCK_SIZE)
    except files.UserError as e:
        sys.exit(files.report(e))
    print(f"machine: {devices.describe(device)}; variant {args.variant}; dropout off")
    gpt, states = trained_weights(corpus, args.variant, device, args.after)
    x, y = (t.to(device) for t in bench.first_batch(corpus))
    print(report(measure(gpt, states, args.paths, x, y, device), args.paths))


if __name__ == '__main__':
    main()
