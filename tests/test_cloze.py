"""cloze.py: each probe's prompt and continuation against the plain decoder run on the
prompt written out by hand, the document probability against a step-by-step product,
what counts as right, the bands by hand, and the command with bad input as one line."""

import json
import math
import re

import pytest
import torch
from torch.nn import functional as F

import analyze
import cloze
import dataset
import run
import utils
from conftest import write
from test_analyze import CORPUS, DEV, tsv


def test_a_continuation_is_right_when_it_begins_with_the_place_as_a_word():
    assert cloze.right('London', 'London') and cloze.right('London, England', 'London')
    assert cloze.right('Maida Vale .', 'Maida Vale')
    assert not cloze.right('Londonderry', 'London') and not cloze.right('in London', 'London')
    assert not cloze.right('Lond', 'London')
    # the question's answer is, as in evaluation, exactly what comes before the MASK
    mask = dataset.MASK_CHAR
    assert cloze.answered(f'London{mask}xx', 'London', mask)
    assert cloze.answered('London', 'London', mask)
    assert not cloze.answered(f'London, England{mask}', 'London', mask)
    assert not cloze.answered(f' London{mask}', 'London', mask)


def sample_text(gpt, ds, prompt, steps):
    """The plain minGPT decoder's greedy continuation of the prompt."""
    ids = torch.tensor([[ds.stoi[c] for c in prompt]])
    out = utils.sample(gpt, ids, steps)[0, len(prompt) :].tolist()
    return ''.join(ds.itos[i] for i in out)


@pytest.mark.parametrize('variant', ['vanilla', 'synthesizer', 'perceiver', 'rope'])
def test_probes_equal_the_plain_decoder_on_the_prompts_written_out(variant):
    ds = dataset.CharCorruptionDataset(CORPUS, run.BLOCK_SIZE)
    torch.manual_seed(0)
    gpt = run.new_model(variant, ds.vocab_size, 16).eval()
    for p in gpt.parameters():  # far from uniform, so that a wrong position shows
        torch.nn.init.normal_(p, std=0.3)
    rows = [(f"Where was {person} born?", person, place) for person, place in DEV]
    records = cloze.probe(gpt, ds, rows, CORPUS)
    steps = len('Maida Vale') + 1  # the longest place, and one more character
    mask = ds.MASK_CHAR
    # Ada's document up to "London"; Grace Hopper's lacks "New York"
    prompts = {
        'document': ['Ada Lovelace. Ada Lovelace was born in ',
                     'Alan Turing. Alan Turing was born in ', None,
                     'Kurt Godel. Kurt Godel was born in ', 'Max Born. Max Born was born in '],
        'name': [f"{person} was born in " for person, _ in DEV],
        'question': [f"Where was {person} born?{mask}" for person, _ in DEV],
    }  # fmt: skip
    with torch.no_grad():
        for name, texts in prompts.items():
            for record, text in zip(records, texts):
                if text is None:
                    assert name not in record and record['document probability'] is None
                    continue
                expected = sample_text(gpt, ds, text, steps)
                found = record[name]['continuation']
                # greedy decoding stops at a MASK; the plain decoder goes on
                assert found == (
                    expected[: expected.index(mask) + 1] if mask in found else expected
                )
        for record, text in zip(records, prompts['document']):
            if text is not None:
                direct = 1.0
                for k, c in enumerate(record['place']):
                    ids = torch.tensor([[ds.stoi[ch] for ch in text + record['place'][:k]]])
                    direct *= F.softmax(gpt(ids)[0][0, -1], dim=-1)[ds.stoi[c]].item()
                assert record['document probability'] == pytest.approx(direct, rel=1e-4)
    assert (
        len(
            {
                round(math.log(r['document probability']), 3)
                for r in records
                if r['document probability']
            }
        )
        == 4
    )


def test_bands_by_hand():
    def record(seen, document, name, question, probability, finetuned):
        r = {'fraction seen': seen, 'document probability': probability,
             'name': {'right': name}, 'question': {'right': question},
             'finetuned right': finetuned}  # fmt: skip
        if document is not None:
            r['document'] = {'right': document}
        return r

    records = [
        record(0.5, True, True, False, 0.9, True),
        record(0.3, False, False, False, 0.2, False),
        record(0.6, False, True, False, 0.4, True),
        record(0.1, True, False, False, 0.7, False),
        record(0.0, None, False, False, None, False),
    ]
    split = cloze.bands(records)
    assert list(split) == ['never', 'rarely (under 25%)', 'often (25% or more)']
    often = split['often (25% or more)']
    assert often['people'] == 3 and often['document'] == pytest.approx(1 / 3)
    assert often['name'] == pytest.approx(2 / 3) and often['question'] == 0
    assert often['median document probability'] == 0.4
    assert often['finetuned'] == pytest.approx(2 / 3)
    assert often['auroc'] == 1.0  # 0.9 and 0.4 (right) above 0.2 (wrong)
    never = split['never']
    assert never['document'] is None and never['median document probability'] is None
    assert never['auroc'] is None and never['finetuned'] == 0


def test_the_command_writes_json_and_bad_input_is_one_line(params, capsys):
    args = [str(params / 'vanilla.params'), '--eval_corpus_path', str(params / 'dev.tsv'),
            '--finetune_corpus_path', str(params / 'train.tsv'),
            '--pretrain_corpus_path', str(params / 'wiki.txt'), '--device', 'cpu']  # fmt: skip
    rows = analyze.read_questions(params / 'dev.tsv')
    people = [p for _, p, _ in rows]
    write(params / 'exposure.json', json.dumps(
        [{'name': p, 'place': place, 'fraction_seen': 0.5} for _, p, place in rows]
    ))  # fmt: skip
    # the finetuned model is right on the first question only (and answers the second with
    # a longer name that begins with the place)
    places = [r[2] for r in analyze.read_questions(params / 'dev.tsv')]
    answers = [places[0], places[1] + 'ville'] + ['Nowhere'] * (len(places) - 2)
    write(params / 'dev.predictions', ''.join(a + '\n' for a in answers))
    cloze.main([*args, '--exposure', str(params / 'exposure.json'),
                '--finetuned', str(params / 'dev.predictions'),
                '--json', str(params / 'cloze.json')])  # fmt: skip
    out = capsys.readouterr().out
    assert re.search(rf"often \(25% or more\) +{len(people)} ", out), out
    report = json.loads((params / 'cloze.json').read_text())
    assert [r['person'] for r in report['records']] == people
    assert [r['finetuned right'] for r in report['records']] == [True] + [False] * (len(people) - 1)
    often = report['bands']['often (25% or more)']
    assert often['finetuned'] == pytest.approx(1 / len(people))
    assert list(report['bands']) == ['often (25% or more)']
    # the params are an untrained model of seed 0, as the floor is (no card: run.py's default)
    assert report['untrained'] == {'seed': 0, 'bands': report['bands']}
    assert len(re.findall(rf"often \(25% or more\) +{len(people)} ", out)) == 2
    assert 'the floor: an untrained model of the same variant (initialised with --seed 0)' in out
    # analyze.py's report of the same predictions gives the same answers; one whose people
    # are in another order is refused
    analysis = {'name': 'm', 'questions': len(people), 'categories': {}, 'prior places': [],
                'auroc': None, 'accuracy at coverage': {}, 'median confidence': 0.5,
                'invented people': {},
                'records': [{'person': p, 'prediction': a, 'confidence': 0.5}
                            for p, a in zip(people, answers)]}  # fmt: skip
    write(params / 'analysis.json', json.dumps(analysis))
    cloze.main([*args, '--finetuned', str(params / 'analysis.json'),
                '--json', str(params / 'again.json')])  # fmt: skip
    again = json.loads((params / 'again.json').read_text())
    assert [r['finetuned right'] for r in again['records']] == [True] + [False] * (len(people) - 1)
    analysis['records'].reverse()
    write(params / 'reversed.json', json.dumps(analysis))
    write(params / 'short.predictions', 'London\n')
    write(params / 'train.json', tsv([('Ada Lovelace', 'London')]))
    for flag, path, error in [
        ('--finetuned', 'short.predictions', f'1 predictions for the {len(people)} questions'),
        ('--finetuned', 'reversed.json', 'its questions are not those of'),
        ('--finetuned', 'exposure.json', 'not a report of analyze.py'),
        ('--exposure', 'train.json', 'not the --json of exposure.py'),
    ]:
        with pytest.raises(SystemExit) as stop:
            cloze.main([*args, flag, str(params / path)])
        err = capsys.readouterr().err
        assert stop.value.code == 2 and error in err and len(err.splitlines()) == 1
