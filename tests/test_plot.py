"""plot.py: reading metrics CSVs (resumed and thinned ones too) and drawing the curves."""

import csv

import pytest

import plot
from machinery import files


def write_metrics(path, rows):
    with open(path, 'w', newline='', encoding='utf-8') as f:
        writer = csv.writer(f)
        writer.writerow(['epoch', 'step', 'loss', 'lr', 'tokens', 'seconds'])
        for epoch, step, loss in rows:
            writer.writerow([epoch, step, loss, 1e-3 / step, step * 100, 0.1 * step])


def test_epochs_are_fractions_and_a_resumed_step_keeps_its_later_row(tmp_path):
    # 4 steps per epoch, 3 epochs; the run was resumed from the end of epoch 2, so steps 9-10 repeat
    rows = [((s - 1) // 4 + 1, s, 10.0 - s) for s in range(1, 11)]
    rows += [((s - 1) // 4 + 1, s, 100.0 + s) for s in range(9, 13)]
    write_metrics(tmp_path / 'm.csv', rows)
    epochs, losses, lrs = plot.read_metrics(tmp_path / 'm.csv')
    assert epochs == [s / 4 for s in range(1, 13)]
    assert losses[:8] == [10.0 - s for s in range(1, 9)] and losses[8:] == [
        100.0 + s for s in range(9, 13)
    ]
    assert lrs == pytest.approx([1e-3 / s for s in range(1, 13)])


def test_thinned_metrics_keep_their_epochs(tmp_path):
    rows = [
        ((s - 1) // 23 + 1, s, 1.0) for s in range(1, 23 * 7 + 1) if s % 10 == 0 or s in (1, 23 * 7)
    ]
    write_metrics(tmp_path / 'thin.csv', rows)
    epochs, _, _ = plot.read_metrics(tmp_path / 'thin.csv')
    assert epochs == [s / 23 for _, s, _ in rows]


@pytest.mark.parametrize(
    'content',
    [
        '',
        'epoch,step,loss,lr\n',
        'a,b\n1,2\n',
        'epoch,step,loss,lr\n1,x,2,1\n',
        'epoch,step,loss\n1,1,2\n',
    ],
)
def test_bad_metrics_are_one_clear_error(tmp_path, content):
    (tmp_path / 'bad.csv').write_text(content, encoding='utf-8')
    with pytest.raises(files.UserError, match='bad.csv'):
        plot.read_metrics(tmp_path / 'bad.csv')


def test_running_mean():
    assert plot.running_mean([1, 3, 5, 7], 2) == [1, 2, 4, 6]


def test_plot_writes_a_picture(tmp_path):
    pytest.importorskip('matplotlib', reason='plot.py draws with matplotlib, an optional install')
    write_metrics(
        tmp_path / 'vanilla.pretrain.params.metrics.csv', [(1, s, 5.0 / s) for s in range(1, 9)]
    )
    write_metrics(
        tmp_path / 'vanilla.finetune.params.metrics.csv', [(1, s, 2.0 / s) for s in range(1, 9)]
    )
    out = tmp_path / 'curves.png'
    plot.main([str(p) for p in sorted(tmp_path.glob('*.csv'))] + ['--out', str(out)])
    assert out.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
