"""Every accuracy we publish, recomputed from the committed prediction files: README's
reference table from results/*.dev.predictions, and each grid (results/*/grid.json): its
grid.md is the table of its record, and every run whose dev predictions are committed
beside it scores what the record says."""

import pytest

import grid
import utils
from conftest import NO_DATA, ROOT

DEV = ROOT / 'data' / 'birth_dev.tsv'
NEEDS_DATA = pytest.mark.skipif(not DEV.exists(), reason=NO_DATA)
# README's reference rows and their predictions in results/ (None: London for everyone)
REFERENCE_ROWS = {
    'vanilla, no pretraining (part d)': 'vanilla.nopretrain',
    'vanilla, pretrain + finetune (part f)': 'vanilla.pretrain',
    'synthesizer, pretrain + finetune (part g)': 'synthesizer.pretrain',
    'London baseline': None,
    'RoPE, pretrain + finetune (2024)': 'rope.pretrain',
    'perceiver, pretrain + finetune (2023, m=64)': 'perceiver.pretrain',
}
GRIDS = sorted(ROOT.glob('results/*/grid.json'))


def dev_correct(predictions):
    total, correct = utils.evaluate_places(str(DEV), predictions)
    return int(correct), int(total)


def reference_table():
    """{row name: the 'ours' cell} of README's reference table."""
    text = (ROOT / 'README.md').read_text(encoding='utf-8')
    section = text.split('## Reference results')[1].split('\n## ')[0]
    rows = [line.split('|')[1:-1] for line in section.splitlines() if line.startswith('| ')]
    return {cells[0].strip(): cells[1].strip() for cells in rows[1:]}  # past the header


@NEEDS_DATA
def test_readmes_reference_results_are_their_predictions():
    table = reference_table()
    assert set(table) == set(REFERENCE_ROWS), "a row without its predictions here, or gone"
    for row, name in REFERENCE_ROWS.items():
        if name is None:
            predictions = ['London'] * len(DEV.read_text(encoding='utf-8').splitlines())
        else:
            path = ROOT / 'results' / f'{name}.dev.predictions'
            predictions = path.read_text(encoding='utf-8').splitlines()
        correct, total = dev_correct(predictions)
        assert table[row] == f"{100 * correct / total:.1f}% ({correct}/{total})", row


@pytest.mark.parametrize('path', GRIDS, ids=[p.parent.name for p in GRIDS])
def test_a_grids_table_is_its_record(path):
    record = grid.records.read_record(str(path))
    assert (path.parent / 'grid.md').read_text(encoding='utf-8') == grid.table(record)


@NEEDS_DATA
@pytest.mark.parametrize('path', GRIDS, ids=[p.parent.name for p in GRIDS])
def test_each_committed_grid_run_scores_what_its_record_says(path):
    """results/grid keeps no predictions (its runs' params stayed on the machine that ran
    them); a grid that keeps any, as results/seeds does, keeps them for every run."""
    record = grid.records.read_record(str(path))
    runs = [entry for entry in record.values() if entry.get('dev_total')]
    kept = {}
    for entry in runs:
        made = entry['made_with']
        prefix = grid.output_prefix(str(path.parent), made['model'], made['method'], made['seed'])
        kept[prefix] = entry
    files = {str(p).removesuffix('.dev.predictions') for p in path.parent.glob('*.dev.predictions')}
    assert files in (set(), set(kept)), "runs without predictions, or predictions without a run"
    for prefix in files:
        entry = kept[prefix]
        predictions = open(prefix + '.dev.predictions', encoding='utf-8').read().splitlines()
        assert dev_correct(predictions) == (entry['dev_correct'], entry['dev_total']), prefix
