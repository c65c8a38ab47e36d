"""analyze.py on hand-built corpora where every figure can be worked out by hand: the
categories and splits, the AUROC and the coverage curve, the confidence against a direct
step-by-step computation, the invented names, and bad input as one line."""

import hashlib
import json
import math
import re

import pytest
import torch
from torch.nn import functional as F

import analyze
import dataset
import run
from conftest import NO_DATA, ROOT, write
from machinery import files

CORPUS = '\n'.join([
    'Ada Lovelace. Ada Lovelace was born in London and lived in Paris .',
    'Alan Turing. Alan Turing was born in Maida Vale ; Alan Turing worked in Manchester .',
    'Grace Hopper. Grace Hopper was a computer scientist .',
    'Kurt Godel. Kurt Godel was born in Brno . Kurt Godel . Kurt Godel . Kurt Godel .',
    'Max Born. Max Born was born in Breslau .',
    'Who was born where ? We know .',
]) + '\n'  # fmt: skip
DEV = [
    ('Ada Lovelace', 'London'),  # answered London: correct
    ('Alan Turing', 'Maida Vale'),  # answered Manchester: in his document, wrong
    ('Grace Hopper', 'New York'),  # answered Paris: not in her document, a top place
    ('Kurt Godel', 'Brno'),  # answered Atlantis: made up
    ('Max Born', 'Breslau'),  # answered Breslau: correct
]
PREDICTIONS = ['London', 'Manchester', 'Paris', 'Atlantis', 'Breslau']
TRAIN = [('Emmy Noether', 'Paris'), ('Lise Meitner', 'Paris'), ('Niels Bohr', 'Vienna')]


def tsv(rows):
    return ''.join(f"Where was {person} born?\t{place}\n" for person, place in rows)


@pytest.fixture
def folder(tmp_path):
    write(tmp_path / 'wiki.txt', CORPUS)
    write(tmp_path / 'dev.tsv', tsv(DEV))
    write(tmp_path / 'train.tsv', tsv(TRAIN))
    write(tmp_path / 'dev.predictions', ''.join(p + '\n' for p in PREDICTIONS))
    return tmp_path


def records(folder):
    rows = analyze.read_questions(folder / 'dev.tsv')
    prior = analyze.top_places(analyze.read_questions(folder / 'train.tsv'))
    assert prior == ['Paris', 'Vienna']
    return analyze.categorize(rows, PREDICTIONS, CORPUS, prior)


def test_each_prediction_falls_in_its_category(folder):
    found = records(folder)
    assert [r['person'] for r in found] == [p for p, _ in DEV]
    assert [r['category'] for r in found] == [
        'correct', 'own document', 'prior', 'made up', 'correct'
    ]  # fmt: skip
    # New York is not in Grace Hopper's document; Godel's place is, as whole words only
    assert [r['gold in document'] for r in found] == [True, True, False, True, True]
    # whole words: "Max Born" twice, not counting "born"; Godel's name five times
    assert [r['name count'] for r in found] == [2, 3, 2, 5, 2]


def test_accuracy_splits(folder):
    found = records(folder)
    by_document = analyze.split_accuracy(found, lambda r: r['gold in document'])
    assert by_document == {'True': [2, 4], 'False': [0, 1]}
    by_count = analyze.split_accuracy(found, lambda r: analyze.name_bin(r['name count']))
    assert by_count == {'2-3': [2, 4], '4-7': [0, 1]}
    assert [analyze.name_bin(n) for n in (0, 1, 2, 3, 4, 7, 8, 100)] == [
        '0', '1', '2-3', '2-3', '4-7', '4-7', '8+', '8+'
    ]  # fmt: skip


def test_a_place_in_the_document_counts_as_whole_words_only():
    assert analyze.occurs('born in Paris .', 'Paris')
    assert not analyze.occurs('born in Parisian hills', 'Paris')
    assert not analyze.occurs('anything', '')
    assert analyze.category('', 'Rome', 'born in Rome', ['Paris']) == 'made up'
    corpus = 'Ada Lovelaceson. Born in Rome .\nAda Lovelace. Born in London .\n'
    assert analyze.documents(corpus, [('Ada Lovelace', 'London')]) == [
        'Ada Lovelace. Born in London .'
    ]


def test_each_person_gets_their_own_document():
    """wiki.txt holds a document per question, and names repeat: two George Stones
    (Fulham in the finetuning file, London in dev), a George Bruce after George Bruce
    Malleson, two identical documents for two rows of one name."""
    lines = ['George Bruce Malleson. Born in Wimbledon .',
             'George Stone. Born in Fulham, he studied at the London School .',
             'Gregory Woods. Born in Egypt, he grew up in Ghana .',
             'Gregory Woods. Born in Egypt, he grew up in Ghana .',
             'George Bruce. Born in Scotland .',
             'George Stone. Born in London .']  # fmt: skip
    corpus = '\n'.join(lines) + '\n'
    train = [('George Bruce Malleson', 'Wimbledon'), ('George Stone', 'Fulham'),
             ('Gregory Woods', 'Egypt'), ('Gregory Woods', 'Ghana'), ('George Bruce', 'Scotland')]  # fmt: skip
    london = [('George Stone', 'London')]
    assert analyze.document_lines(corpus.split('\n'), train + london) == list(range(6))
    assert analyze.documents(corpus, london, before=train) == [lines[5]]
    # without the finetuning file's people, both George Stones' lines name London: the first
    assert analyze.documents(corpus, london) == [lines[1]]
    # a place picks George Bruce's own line; without one, the first line of the name
    assert analyze.documents(
        corpus, [('Ada Lovelace', 'London'), ('George Bruce', 'Scotland')]
    ) == [
        '',
        lines[4],
    ]
    assert analyze.documents(corpus, [('George Bruce', None)]) == [lines[0]]
    dev = [('Where was George Stone born?', 'George Stone', 'London')]
    [record] = analyze.categorize(dev, ['London'], corpus, [], before=train)
    assert record['place end'] == len('George Stone. Born in London')
    assert record['category'] == 'correct' and record['gold in document']


def test_the_finetuning_file_is_recognised_under_any_of_its_names(tmp_path, monkeypatch):
    """Its people are matched to documents first, unless the question file is the finetuning file
    itself: a bare name found in data/, a relative path and an absolute one are one file."""
    (tmp_path / 'data').mkdir()
    write(tmp_path / 'data' / 'train.tsv', tsv(TRAIN))
    write(tmp_path / 'dev.tsv', tsv(DEV))
    monkeypatch.setattr(files, 'DATA_DIR', tmp_path / 'data')
    monkeypatch.chdir(tmp_path)
    for name in ['train.tsv', 'data/train.tsv', str(tmp_path / 'data' / 'train.tsv')]:
        assert analyze.people_before([name], 'data/../data/train.tsv') == []
    assert analyze.people_before(['dev.tsv'], 'train.tsv') == [tuple(row) for row in TRAIN]


def test_exposure_is_read_by_person_and_place(tmp_path):
    report = [{'name': 'George Stone', 'place': 'Fulham', 'fraction_seen': 0.7},
              {'name': 'George Stone', 'place': 'London', 'fraction_seen': 0.8}]  # fmt: skip
    write(tmp_path / 'exposure.json', json.dumps(report))
    seen = analyze.read_exposure(tmp_path / 'exposure.json')
    assert seen == {('George Stone', 'Fulham'): 0.7, ('George Stone', 'London'): 0.8}


def test_auroc_and_coverage_by_hand():
    scores, labels = [0.9, 0.8, 0.7, 0.1], [True, False, True, False]
    # right 0.9 and 0.7 against wrong 0.8 and 0.1: 0.9 beats both, 0.7 beats 0.1 only
    assert analyze.auroc(scores, labels) == 3 / 4
    assert analyze.auroc([0.5, 0.5], [True, False]) == 0.5  # a tie counts half
    assert analyze.auroc([0.9, 0.1], [True, True]) is None
    assert analyze.auroc([0.1, 0.9], [True, False]) == 0.0
    assert analyze.coverage_accuracy(scores, labels) == {
        '0.25': 1.0, '0.5': 0.5, '0.75': 2 / 3, '1.0': 0.5
    }  # fmt: skip


def direct_confidence(gpt, ds, question, answer):
    """P(answer + MASK | question + MASK), one character at a time with the plain forward."""
    ids = [ds.stoi[c] for c in question] + [ds.stoi[ds.MASK_CHAR]]
    probability = 1.0
    for c in list(answer) + [ds.MASK_CHAR]:
        logits, _ = gpt(torch.tensor([ids]))
        probability *= F.softmax(logits[0, -1].double(), dim=-1)[ds.stoi[c]].item()
        ids.append(ds.stoi[c])
    return probability


@pytest.mark.parametrize('variant', ['vanilla', 'synthesizer', 'perceiver', 'rope'])
def test_confidence_equals_the_step_by_step_probability(variant):
    ds = dataset.CharCorruptionDataset(CORPUS, 128)
    torch.manual_seed(0)
    gpt = run.new_model(variant, ds.vocab_size, 16).eval()
    for p in gpt.parameters():  # far from uniform, so that a wrong position shows
        torch.nn.init.normal_(p, std=0.3)
    questions = ['Where was Ada Lovelace born?', 'Where was Max born?', 'Who?']
    answers = ['London', '', 'Maida Vale and more']
    found = analyze.confidences(gpt, questions, answers, ds, batch_size=2)
    with torch.no_grad():
        expected = [direct_confidence(gpt, ds, q, a) for q, a in zip(questions, answers)]
    assert found == pytest.approx(expected, rel=1e-4)
    assert len({round(math.log(p), 3) for p in found}) == 3


def test_invented_names_are_new_and_made_of_the_finetuning_names(folder):
    rows = analyze.read_questions(folder / 'train.tsv')
    text = (folder / 'train.tsv').read_text()
    names = analyze.invent_names(rows, CORPUS, text, 4, seed=1)
    assert len(names) == len(set(names)) == 4
    assert names == analyze.invent_names(rows, CORPUS, text, 4, seed=1)
    for name in names:
        first, last = name.split()
        assert first in {'Emmy', 'Lise', 'Niels'} and last in {'Noether', 'Meitner', 'Bohr'}
        assert name not in CORPUS and name not in text


def test_the_command_reports_and_writes_json(params, capsys):
    """End to end on the suite's tiny corpus, with an untrained model's params (whose own
    answers may hold newlines: the predictions here are written by hand)."""
    write(params / 'dev.predictions', 'London\nParis\n\nRome\n')  # one per dev question
    analyze.main([
        str(params / 'dev.predictions'), '--eval_corpus_path', str(params / 'dev.tsv'),
        '--pretrain_corpus_path', str(params / 'wiki.txt'), '--finetune_corpus_path',
        str(params / 'train.tsv'), '--params', str(params / 'vanilla.params'), '--invented', '3',
        '--json', str(params / 'report.json'), '--name', 'untrained', '--device', 'cpu',
    ])  # fmt: skip
    out = capsys.readouterr().out
    assert 'untrained: accuracy' in out and 'invented people (3)' in out
    report = json.loads((params / 'report.json').read_text())
    assert report['questions'] == 4 and sum(report['categories'].values()) == 4
    assert all(0 < r['confidence'] <= 1 for r in report['records'])
    assert len(report['invented people']['answers']) == 3


def test_the_variant_and_bottleneck_are_the_params_files(params, capsys):
    """The perceiver's params (bottleneck 64) without --variant or --bottleneck_dim; a flag
    that the file contradicts is one line."""
    write(params / 'dev.predictions', 'London\nParis\n\nRome\n')
    perceiver = str(params / 'perceiver.params')
    argv = [
        str(params / 'dev.predictions'), '--eval_corpus_path', str(params / 'dev.tsv'),
        '--pretrain_corpus_path', str(params / 'wiki.txt'), '--finetune_corpus_path',
        str(params / 'train.tsv'), '--params', perceiver, '--invented', '2', '--device', 'cpu',
    ]  # fmt: skip
    analyze.main(argv)
    assert 'invented people (2)' in capsys.readouterr().out
    for flags, message in (
        (['--variant', 'rope'], 'holds a perceiver model, but the variant is rope'),
        (['--bottleneck_dim', '32'], 'made with --bottleneck_dim 64, but the flag is 32'),
    ):
        with pytest.raises(SystemExit) as stop:
            analyze.main(argv + flags)
        assert stop.value.code == 2
        assert capsys.readouterr().err == f"error: --params {perceiver}: {message}\n"


@pytest.mark.parametrize('predictions, tsv_text, message', [
    ('London\n', None, r"dev.predictions: 1 predictions for the 5 questions of .*dev.tsv$"),
    (None, 'Where was Ada born?\n', r"dev.tsv, line 1: expected 'question<TAB>place'$"),
])  # fmt: skip
def test_mismatched_files_are_one_clear_line(folder, capsys, predictions, tsv_text, message):
    if predictions is not None:
        write(folder / 'dev.predictions', predictions)
    if tsv_text is not None:
        write(folder / 'dev.tsv', tsv_text)
    with pytest.raises(SystemExit) as stop:
        analyze.main([
            str(folder / 'dev.predictions'), '--eval_corpus_path', str(folder / 'dev.tsv'),
            '--pretrain_corpus_path', str(folder / 'wiki.txt'),
            '--finetune_corpus_path', str(folder / 'train.tsv'),
        ])  # fmt: skip
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.startswith('error: ')
    assert len(err.splitlines()) == 1
    assert re.search(message, err), err


def test_reports_side_by_side_a_table_and_a_picture(tmp_path, capsys):
    """The table holds each report's figures; dev answers among the top places are counted
    from its records (Paris twice of four)."""
    records = [{'confidence': c, 'category': k, 'prediction': p} for c, k, p in
               [(0.9, 'correct', 'Brno'), (0.5, 'made up', 'Atlantis'), (0.2, 'prior', 'Paris'),
                (0.1, 'own document', 'Paris')]]  # fmt: skip
    report = {
        'name': 'm', 'questions': 4, 'prior places': ['Paris', 'Vienna'], 'auroc': 1.0,
        'categories': {'correct': 1, 'own document': 1, 'prior': 1, 'made up': 1},
        'accuracy at coverage': {'0.25': 1.0, '0.5': 0.5, '0.75': 1 / 3, '1.0': 0.25},
        'median confidence': 0.35, 'records': records,
        'invented people': {'people': 5, 'share among the top places': 0.2, 'median confidence':
                            0.125, 'most common answers': [['Rome', 3], ['', 1], ['Paris', 1]]},
    }  # fmt: skip
    write(tmp_path / 'r.json', json.dumps(report))
    write(tmp_path / 'no_params.json', json.dumps({'name': 'n', 'records': [{'category': 'x'}]}))
    with pytest.raises(SystemExit) as stop:
        analyze.main([str(tmp_path / 'r.json'), str(tmp_path / 'no_params.json'),
                      '--coverage_plot', str(tmp_path / 'c.png')])  # fmt: skip
    assert stop.value.code == 2 and capsys.readouterr().err.endswith(
        "no_params.json: not a report of analyze.py --params ... --json\n"
    )
    pytest.importorskip('matplotlib', reason='the picture needs matplotlib, an optional install')
    capsys.readouterr()
    analyze.main([str(tmp_path / 'r.json'), '--coverage_plot', str(tmp_path / 'c.png')])
    assert (tmp_path / 'c.png').read_bytes()[:4] == b'\x89PNG'
    assert (
        '| m | 25.0% | 25.0% | 25.0% | 25.0% | 1.00 (1 right) | 100.0% / 50.0% / 33.3% / '
        '25.0% | 0.350 / 0.125 | 50.0% / 20.0% | Rome 3, (empty) 1, Paris 1 |'
        in (capsys.readouterr().out)
    )

    with pytest.raises(SystemExit):  # the picture of exposure needs --exposure's records
        analyze.main([str(tmp_path / 'r.json'), '--exposure_plot', str(tmp_path / 'e.png')])
    assert capsys.readouterr().err.endswith("m was made without --exposure\n")
    for record, seen in zip(records, [0, 0.2, 0.5, 0.7]):  # no one in 20-40%: a gap
        record['fraction seen'] = seen
    write(tmp_path / 'r.json', json.dumps(report))
    capsys.readouterr()
    analyze.main([str(tmp_path / 'r.json'), '--exposure_plot', str(tmp_path / 'e.png')])
    assert (tmp_path / 'e.png').read_bytes()[:4] == b'\x89PNG'
    out = capsys.readouterr().out  # the picture's figures: 0.2 is up to 20%, 0.5 in 40-60%
    assert (
        '| model | never | up to 20% | 20%-40% | 40%-60% | 60%-100% |\n|---|---|---|---|---|---|'
        in out
    )
    assert '| m | 100.0% of 1 | 0.0% of 1 | - | 0.0% of 1 | 0.0% of 1 |' in out


def test_accuracy_by_where_the_place_ends_and_by_exposure(folder, capsys):
    """The gold place's end in the document, counted by hand, and its bins against the
    longest window (112 characters); with exposure.py's report, the split by the
    fraction of epochs that showed the place."""
    found = records(folder)
    # 'Ada Lovelace. Ada Lovelace was born in London' ends at 45; Grace Hopper's lacks it
    assert [r['place end'] for r in found] == [45, 47, None, 39, 38]
    assert [analyze.position_bin(n) for n in (None, 1, 40, 41, 80, 81, 112, 113)] == [
        'not in it', '1-40', '1-40', '41-80', '41-80', '81-112', '81-112', 'after 112'
    ]  # fmt: skip
    assert [analyze.exposure_bin(f) for f in (None, 0, 0.01, 0.2499, 0.25, 1)] == [
        'unknown', 'never', 'rarely (under 25%)', 'rarely (under 25%)',
        'often (25% or more)', 'often (25% or more)',
    ]  # fmt: skip
    seen = zip(DEV, [0.5, 0.1, 0.0, 0.3, 0.0])
    write(folder / 'exposure.json', json.dumps([
        {'name': p, 'place': place, 'fraction_seen': f} for (p, place), f in seen
    ]))  # fmt: skip
    args = analyze.parse_args(
        [str(folder / 'dev.predictions'), '--exposure', str(folder / 'exposure.json')]
    )
    args.eval_corpus_path, args.pretrain_corpus_path = folder / 'dev.tsv', folder / 'wiki.txt'
    args.finetune_corpus_path = folder / 'train.tsv'
    report = analyze.analyze(args)
    assert report['by place position'] == {'41-80': [1, 2], 'not in it': [0, 1], '1-40': [1, 2]}
    assert report['by name count at each place position'] == {
        '1-40': {'4-7': [0, 1], '2-3': [1, 1]}, '41-80': {'2-3': [1, 2]}, 'not in it': {'2-3': [0, 1]}
    }  # fmt: skip

    def band(correct, own, prior, made_up):
        categories = dict(zip(analyze.CATEGORIES, (correct, own, prior, made_up)))
        n = sum(categories.values())
        return {'questions': n, 'correct': correct, 'categories': categories,
                'median confidence': None}  # fmt: skip

    assert report['by exposure'] == {
        'often (25% or more)': band(1, 0, 0, 1), 'rarely (under 25%)': band(0, 1, 0, 0),
        'never': band(1, 0, 1, 0),
    }  # fmt: skip
    # no dev place is a finetuning answer
    assert report['by answer count'] == {'0': band(2, 1, 1, 1)}
    write(folder / 'bad.json', '{"not": "a report"}')
    with pytest.raises(analyze.files.UserError, match='not the --json of exposure.py'):
        analyze.read_exposure(folder / 'bad.json')


def test_an_earlier_report_is_split_again_with_its_confidence(folder, capsys):
    """A report made with --params, given back as the input: the same predictions and
    confidences, now split by exposure, with the median confidence of each band."""
    found = records(folder)
    for r, confidence in zip(found, [0.9, 0.2, 0.4, 0.1, 0.7]):
        r['confidence'] = confidence
    invented = {'people': 2, 'share among the top places': 0.5, 'median confidence': 0.3,
                'most common answers': [['Rome', 2]], 'answers': []}  # fmt: skip
    earlier = {'name': 'm', 'questions': 5, 'categories': {}, 'prior places': [],
               'auroc': None, 'accuracy at coverage': {}, 'median confidence': 0.4,
               'invented people': invented, 'records': found}  # fmt: skip
    write(folder / 'earlier.json', json.dumps(earlier))
    seen = zip(DEV, [0.5, 0.1, 0.0, 0.3, 0.0])
    write(folder / 'exposure.json', json.dumps([
        {'name': p, 'place': place, 'fraction_seen': f} for (p, place), f in seen
    ]))  # fmt: skip
    common = ['--eval_corpus_path', str(folder / 'dev.tsv'), '--pretrain_corpus_path',
              str(folder / 'wiki.txt'), '--finetune_corpus_path', str(folder / 'train.tsv')]  # fmt: skip
    analyze.main([str(folder / 'earlier.json'), '--exposure', str(folder / 'exposure.json'),
                  '--json', str(folder / 'again.json'), *common])  # fmt: skip
    again = json.loads((folder / 'again.json').read_text())
    assert again['name'] == 'm' and again['invented people'] == invented
    assert [r['prediction'] for r in again['records']] == PREDICTIONS
    assert again['auroc'] == 1.0 and again['median confidence'] == 0.4
    # often: Ada 0.9 and Kurt 0.1; rarely: Alan 0.2; never: Grace 0.4 and Max 0.7
    medians = {k: v['median confidence'] for k, v in again['by exposure'].items()}
    assert medians == {'often (25% or more)': 0.5, 'rarely (under 25%)': 0.2, 'never': 0.55}
    assert '  never                        2        50.0%' in capsys.readouterr().out
    for argv, error in [
        (['--params', 'x.params'], 'already holds the confidence'),
        (['--eval_corpus_path', str(folder / 'train.tsv')], 'its questions are not those of'),
    ]:
        with pytest.raises(SystemExit):
            analyze.main([str(folder / 'earlier.json'), *common, *argv])
        assert error in capsys.readouterr().err


def test_the_untrained_model_is_the_one_run_py_initialises_with_the_pretrainings_seed(params):
    """A probe's floor: with a card naming the pretraining's --seed 3, the model run.py
    builds with --seed 3 before it trains; without a card, seed 0 (run.py's default)."""
    args = analyze.argparse.Namespace(params=str(params / 'rope.params'), variant=None,
                                      bottleneck_dim=None, device='cpu')  # fmt: skip
    ds = dataset.CharCorruptionDataset((params / 'wiki.txt').read_text(encoding='utf-8'), 128)
    for seed in (0, 3):
        if seed:
            (params / 'rope.params.json').write_text(json.dumps(
                {'phase': 'pretrain', 'variant': 'rope', 'bottleneck_dim': None, 'seed': 3,
                 'params_md5': hashlib.md5((params / 'rope.params').read_bytes()).hexdigest()}
            ))  # fmt: skip
        untrained, told = analyze.untrained_model(args, ds)
        built = run.build_model(
            run.parse_args(['pretrain', 'rope', 'wiki.txt', '--seed', str(seed)]), ds
        )
        assert told == seed
        assert all(torch.equal(a, b) for a, b in zip(untrained.state_dict().values(),
                                                      built.state_dict().values()))  # fmt: skip


@pytest.mark.skipif(not (ROOT / 'data' / 'wiki.txt').exists(), reason=NO_DATA)
def test_wiki_txt_people_get_the_same_documents_from_the_corpus_reversed():
    """The finetuning and dev people's documents do not depend on wiki.txt's order: the
    corpus's lines reversed, each person gets the same text."""
    lines = (ROOT / 'data' / 'wiki.txt').read_text(encoding='utf-8').split('\n')
    people = [(person, place) for name in ('birth_places_train.tsv', 'birth_dev.tsv')
              for _, person, place in analyze.read_questions(ROOT / 'data' / name)]  # fmt: skip
    found = analyze.document_lines(lines, people)
    backwards = analyze.document_lines(lines[::-1], people)
    assert None not in found and len(set(found)) == len(people)
    texts = [lines[i] for i in found]
    assert texts == [lines[::-1][i] for i in backwards]
    assert all(text.startswith(person) for text, (person, _) in zip(texts, people))
