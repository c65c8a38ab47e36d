"""Does the model know it does not know? Linear probes on a finetuned model's hidden states.

    python research/linear_probes.py vanilla.finetune.params --exposure vanilla.exposure.json \\
        --json vanilla.probes.json

Each question ("Where was NAME born?" and its MASK) is run through the finetuned model, and
the hidden state at the MASK, where the answer begins, is read after each layer: the
embeddings, each block (the perceiver: its up-projection, the only one at the question's
positions) and the final layer norm. A logistic regression on each layer's states is
trained on the finetuning file's people and tested on the dev people, for two questions:
  real or invented  the people of the question files against invented ones (analyze.py's:
                    first and last names of the finetuning file that occur nowhere), a
                    different half of them for training and for testing
  seen or never     people whose place pretraining showed in some epoch against those it
                    never showed (exposure.py's --json)
Each probe's test AUROC stands beside that of the model's own confidence in its answer
(analyze.py's: the probability of the answer and its closing MASK) for the same split:
a probe above the confidence means the model holds, inside, what its answer does not show.

Beside each figure stand its floor and its control. The floor: the same measurement on an
untrained model of the same variant, initialised with the --seed of the params'
pretraining (their card's; 0 without one): an untrained model's random weights still mix
the name's characters, so a probe finds what the names look like in any model (0.60-0.65
on wiki.txt's splits from the first block on). The control: each probe trained on the same
states with the training labels shuffled, the mean test AUROC of SHUFFLES shuffles
(random.Random(--seed)): about 0.5, the probe's chance, where the labels and not the
states' accidents are what it learns.
"""

import import_paths  # noqa: F401 (first: src/ and tools/ on sys.path)

import machinery.cpu_libraries  # noqa: F401 (first: it sets up MKL and oneDNN before torch)

import argparse
import json
import random
import statistics
import sys

import torch

import analyze
import run
from machinery import checks, decoding, files

INVENTED = 600  # invented people: half to train the probe, half to test it
SHUFFLES = 5  # the control's probes, each on another shuffle of the labels: their mean AUROC


def layers(gpt):
    """[(name, module)] whose output's positions are the question's characters."""
    if hasattr(gpt, 'up_block'):  # the perceiver's middle blocks see its bottleneck only
        blocks = [('up block', gpt.up_block)]
    else:
        blocks = [(f"block {i + 1}", block) for i, block in enumerate(gpt.blocks)]
    return [('embeddings', gpt.drop), *blocks, ('final norm', gpt.ln_f)]


@torch.no_grad()
def hidden_states(gpt, questions, pretrain_dataset, batch_size=256):
    """{layer name: (len(questions), n_embd) tensor}: the state at each question's MASK."""
    gpt.eval()
    device = next(gpt.parameters()).device
    room = decoding.question_room(gpt.get_block_size(), run.ANSWER_LENGTH)
    prompts = [decoding.encode_question(q, pretrain_dataset, room).ids for q in questions]
    captured, handles = {}, []
    for name, module in layers(gpt):
        hook = lambda module, inputs, output, name=name: captured.__setitem__(name, output)
        handles.append(module.register_forward_hook(hook))
    states = {name: [None] * len(questions) for name, _ in layers(gpt)}
    try:
        # no padding: the MASK is every row's last position
        for batch in same_length_batches(prompts, batch_size):
            gpt(torch.stack([prompts[i] for i in batch]).to(device))
            for name, output in captured.items():
                for row, i in enumerate(batch):
                    states[name][i] = output[row, -1].float().cpu()  # (n_embd,)
    finally:
        for handle in handles:
            handle.remove()
    return {name: torch.stack(rows) for name, rows in states.items()}  # (N, n_embd)


def same_length_batches(prompts, batch_size):
    """Lists of at most batch_size indices of prompts of one length: stacked, their
    positions line up without padding."""
    by_length = {}
    for i, p in enumerate(prompts):
        by_length.setdefault(len(p), []).append(i)
    for indices in by_length.values():
        for start in range(0, len(indices), batch_size):
            yield indices[start : start + batch_size]


def fit_probe(x, labels, steps=200, l2=1e-3):
    """A logistic regression on standardized x (N, D) for labels (N,) of 0 and 1:
    a function from states to scores."""
    mean, std = x.mean(0), x.std(0) + 1e-6
    w = torch.zeros(x.size(1), dtype=torch.float64, requires_grad=True)
    b = torch.zeros((), dtype=torch.float64, requires_grad=True)
    z, y = ((x - mean) / std).double(), labels.double()
    optimizer = torch.optim.LBFGS([w, b], max_iter=steps, line_search_fn='strong_wolfe')

    def loss():
        optimizer.zero_grad()
        value = torch.nn.functional.binary_cross_entropy_with_logits(z @ w + b, y) + l2 * w @ w
        value.backward()
        return value

    optimizer.step(loss)
    return lambda states: (((states - mean) / std).double() @ w + b).detach()


def probe_aurocs(train_states, train_labels, test_states, test_labels):
    """{layer: test AUROC of the probe trained on that layer's train states}."""
    result = {}
    for name in train_states:
        score = fit_probe(train_states[name], torch.tensor(train_labels))
        result[name] = analyze.auroc(score(test_states[name]).tolist(), test_labels)
    return result


def parse_args(argv):
    argp = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    argp.add_argument('params', help="finetuned params")
    argp.add_argument('--exposure', required=True, help="exposure.py's --json of the pretraining")
    argp.add_argument('--finetune_corpus_path', default='birth_places_train.tsv')
    argp.add_argument('--eval_corpus_path', default='birth_dev.tsv')
    argp.add_argument('--pretrain_corpus_path', default='wiki.txt')
    argp.add_argument('--seed', type=int, default=0, help="of the invented names (default 0)")
    argp.add_argument('--json', help="write the AUROCs here")
    analyze.add_model_arguments(argp)
    return argp.parse_args(argv)


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        checks.check_reports(args, 'json')
        train = analyze.read_questions(args.finetune_corpus_path)
        dev = analyze.read_questions(args.eval_corpus_path)
        seen = analyze.read_exposure(args.exposure, args.params)
        missing = [p for _, p, place in train + dev if (p, place) not in seen]
        if missing:
            raise files.UserError(f"--exposure {args.exposure}: has no entry for {missing[0]}")
        for path, rows in [(args.finetune_corpus_path, train), (args.eval_corpus_path, dev)]:
            if len({seen[p, place] > 0 for _, p, place in rows}) < 2:
                raise files.UserError(
                    f"--exposure {args.exposure}: the people of {path} are all seen or all "
                    "never shown; the seen-or-never probe needs both"
                )
        corpus = files.read_text(args.pretrain_corpus_path)
        finetune_text = files.read_text(args.finetune_corpus_path)
        gpt, pretrain_dataset = analyze.load_model(args, corpus)
    except files.UserError as e:
        sys.exit(files.report(e))
    invented = analyze.invent_names(train, corpus, finetune_text, INVENTED, args.seed)
    half = len(invented) // 2
    questions = {
        'train': [q for q, _, _ in train] + [f"Where was {n} born?" for n in invented[:half]],
        'dev': [q for q, _, _ in dev] + [f"Where was {n} born?" for n in invented[half:]],
    }
    people = {'train': train, 'dev': dev}
    report = {'params': args.params, 'splits': splits(gpt, pretrain_dataset, questions, people,
                                                      seen, args.seed)}  # fmt: skip
    untrained, seed = analyze.untrained_model(args, pretrain_dataset)
    report['untrained'] = {
        'seed': seed,
        'splits': splits(untrained, pretrain_dataset, questions, people, seen, args.seed),
    }
    print_report(report)
    if args.json:
        text = json.dumps(report, indent=1)
        files.atomic_write(args.json, lambda f: f.write(text.encode('utf-8')))


def splits(gpt, pretrain_dataset, questions, people, seen, seed):
    """{split name: the counts, the answer's confidence AUROC, the probes' AUROCs, and the
    mean AUROC of each probe trained on the same states with its labels shuffled (the
    control)} for the two splits, the questions asked of gpt."""
    states, confidence = {}, {}
    for split, asked in questions.items():
        states[split] = hidden_states(gpt, asked, pretrain_dataset)
        answers = decoding.answer_questions(gpt, asked, pretrain_dataset, run.ANSWER_LENGTH, split)
        confidence[split] = analyze.confidences(gpt, asked, answers, pretrain_dataset)
    real = {s: [True] * len(people[s]) + [False] * (len(questions[s]) - len(people[s]))
            for s in questions}  # fmt: skip
    shown = {s: [seen[p, place] > 0 for _, p, place in people[s]] for s in people}
    result = {}
    for split_name, labels in [('real or invented', real), ('seen or never', shown)]:
        # the first len(labels) questions of each side: all, or the real people only
        train_n, test_n = len(labels['train']), len(labels['dev'])
        train_states = {k: v[:train_n] for k, v in states['train'].items()}
        test_states = {k: v[:test_n] for k, v in states['dev'].items()}
        rng, controls = random.Random(seed), []
        for _ in range(SHUFFLES):
            shuffled = rng.sample(labels['train'], len(labels['train']))
            controls.append(probe_aurocs(train_states, shuffled, test_states, labels['dev']))
        result[split_name] = {
            'train': [sum(labels['train']), train_n],
            'test': [sum(labels['dev']), test_n],
            'confidence auroc': analyze.auroc(confidence['dev'][:test_n], labels['dev']),
            'probe auroc': probe_aurocs(train_states, labels['train'], test_states, labels['dev']),
            'shuffled labels': {
                layer: statistics.mean(c[layer] for c in controls) for layer in controls[0]
            },  # fmt: skip
        }
    return result


def print_report(report):
    untrained = report['untrained']
    print(f"{report['params']}: test AUROC on the dev people (trained on the finetuning file's), "
          f"beside an untrained model's (initialised with --seed {untrained['seed']}) and the "
          "probe trained on shuffled labels")  # fmt: skip
    for name, split in report['splits'].items():
        floor = untrained['splits'][name]
        (positive, n), confidence = split['test'], split['confidence auroc']
        print(f"{name} ({positive} of {n} positive): the answer's confidence {confidence:.3f} "
              f"(untrained {floor['confidence auroc']:.3f})")  # fmt: skip
        for layer, auroc in split['probe auroc'].items():
            print(f"  probe after {layer:<12} {auroc:.3f}  (untrained "
                  f"{floor['probe auroc'][layer]:.3f}, shuffled labels "
                  f"{split['shuffled labels'][layer]:.3f})")  # fmt: skip


if __name__ == '__main__':
    main()
