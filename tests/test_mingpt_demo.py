"""Tests for mingpt-demo/: the small minGPT package and the play_char notebook.

The notebook test runs every code cell in order with tiny settings and a text file written by
the test, so it needs neither data/wiki.txt nor Jupyter and finishes in a few seconds.
"""

import json
import math
import sys
from pathlib import Path

import pytest
import torch
from torch.utils.data import TensorDataset

DEMO_DIR = Path(__file__).resolve().parent.parent / "mingpt-demo"
NOTEBOOK = DEMO_DIR / "play_char.ipynb"

# the demo is not an installed package; import it the way the notebook does
if str(DEMO_DIR) not in sys.path:
    sys.path.insert(0, str(DEMO_DIR))

from mingpt.model import GPT, GPT1Config, GPTConfig  # noqa: E402
from mingpt.trainer import Trainer, TrainerConfig  # noqa: E402
from mingpt.utils import sample, set_seed, top_k_logits  # noqa: E402

TINY_TEXT = (
    "Alan Turing. Alan Turing was born in London .\n"
    "Ada Lovelace. Ada Lovelace was born in London .\n"
    "Marie Curie. Marie Curie was born in Warsaw .\n"
    "Niels Bohr. Niels Bohr was born in Copenhagen .\n"
)

# Applied right after the notebook's settings cell; {text_path} is filled in by the test.
TINY_SETTINGS = """
text_path = {text_path!r}
max_chars = 3000
block_size = 32
n_layer = 1
n_head = 2
n_embd = 32
max_epochs = 1
batch_size = 32
learning_rate = 5e-3
context = "was born in "
n_sample_chars = 50
top_k = 5
seed = 0
"""


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Run these tiny models on one thread, restoring the setting afterwards.

    Their matrices are too small to gain from a second thread, and on a busy 2-core machine
    two threads that wait for each other make every step up to a hundred times slower.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def tiny_config(**kwargs):
    settings = dict(n_layer=2, n_head=2, n_embd=16)
    settings.update(kwargs)
    return GPTConfig(vocab_size=11, block_size=8, **settings)


# ---------------------------------------------------------------------------------------------
# the notebook
# ---------------------------------------------------------------------------------------------


def load_notebook():
    return json.loads(NOTEBOOK.read_text(encoding="utf-8"))


def code_cells():
    return [
        "".join(cell["source"]) for cell in load_notebook()["cells"] if cell["cell_type"] == "code"
    ]


def settings_cell_index(cells):
    matches = [
        i for i, src in enumerate(cells) if "n_sample_chars =" in src and "max_chars =" in src
    ]
    assert len(matches) == 1, "expected exactly one settings cell"
    return matches[0]


def test_notebook_is_clean_nbformat4():
    nb = load_notebook()
    assert nb["nbformat"] == 4
    assert any(cell["cell_type"] == "markdown" for cell in nb["cells"])
    for cell in nb["cells"]:
        assert isinstance(cell["source"], list)
        assert all(isinstance(line, str) for line in cell["source"])
        if cell["cell_type"] == "code":
            assert cell["outputs"] == []
            assert cell["execution_count"] is None


def test_notebook_runs_top_to_bottom_with_tiny_settings(tmp_path, monkeypatch):
    # the settings cell checks for data/wiki.txt relative to the kernel's folder, so the tiny
    # text goes there (the override points text_path at it too, to make that explicit)
    text_file = tmp_path / "data" / "wiki.txt"
    text_file.parent.mkdir()
    text_file.write_text(TINY_TEXT * 20, encoding="utf-8")
    monkeypatch.chdir(tmp_path)

    cells = code_cells()
    settings = settings_cell_index(cells)
    ns = {"__name__": "__main__"}
    for i, src in enumerate(cells):
        exec(compile(src, f"{NOTEBOOK.name}[code cell {i}]", "exec"), ns)
        if i == settings:
            exec(TINY_SETTINGS.format(text_path=str(text_file)), ns)

    # the data set: every window of block_size + 1 characters, y is x shifted by one
    dataset = ns["train_dataset"]
    text = ns["text"]
    assert text == (TINY_TEXT * 20)[:3000]
    assert len(dataset) == len(text) - 32
    x, y = dataset[7]
    assert "".join(dataset.itos[int(i)] for i in x) == text[7:39]
    assert "".join(dataset.itos[int(i)] for i in y) == text[8:40]

    # training went over the whole (tiny) epoch and learned something
    losses = ns["trainer"].train_losses
    assert len(losses) == math.ceil(len(dataset) / 32)
    assert all(math.isfinite(loss) for loss in losses)
    assert sum(losses[-5:]) / 5 < losses[0] - 0.5

    # the sample continues the prompt by exactly n_sample_chars characters from the vocabulary
    completion = ns["completion"]
    assert completion.startswith("was born in ")
    assert len(completion) == len("was born in ") + 50
    assert set(completion) <= set(text)


def test_notebook_settings_cell_explains_missing_data(tmp_path, monkeypatch):
    empty = tmp_path / "kernel_dir"
    empty.mkdir()
    monkeypatch.chdir(empty)

    cells = code_cells()
    settings = settings_cell_index(cells)
    ns = {"__name__": "__main__"}
    for src in cells[:settings]:
        exec(src, ns)
    with pytest.raises(FileNotFoundError, match="data/"):
        exec(cells[settings], ns)


# ---------------------------------------------------------------------------------------------
# mingpt.model
# ---------------------------------------------------------------------------------------------


def test_config_kwargs_become_attributes():
    config = GPTConfig(vocab_size=5, block_size=7, n_layer=3, attn_pdrop=0.0)
    assert (config.vocab_size, config.block_size, config.n_layer, config.attn_pdrop) == (
        5,
        7,
        3,
        0.0,
    )
    assert config.resid_pdrop == 0.1
    gpt1 = GPT1Config(vocab_size=5, block_size=7)
    assert (gpt1.n_layer, gpt1.n_head, gpt1.n_embd) == (12, 12, 768)


def test_forward_shapes_and_initial_loss():
    set_seed(0)
    model = GPT(tiny_config())
    model.eval()
    idx = torch.randint(0, 11, (3, 8))

    logits, loss = model(idx)
    assert logits.shape == (3, 8, 11)
    assert loss is None

    # small initial weights give near-uniform predictions, so the loss starts near ln(vocab_size)
    logits, loss = model(idx, idx)
    assert loss.dim() == 0
    assert abs(loss.item() - math.log(11)) < 0.1

    logits, _ = model(idx[:, :5])
    assert logits.shape == (3, 5, 11)
    with pytest.raises(AssertionError):
        model(torch.zeros(1, 9, dtype=torch.long))


def test_attention_is_causal():
    set_seed(0)
    model = GPT(tiny_config())
    model.eval()
    idx = torch.randint(0, 11, (2, 8))
    changed = idx.clone()
    changed[:, 5] = (changed[:, 5] + 1) % 11

    with torch.no_grad():
        before, _ = model(idx)
        after, _ = model(changed)
    # positions before the change cannot see it; positions from it on do
    assert torch.allclose(before[:, :5], after[:, :5], atol=1e-6)
    assert not torch.allclose(before[:, 5:], after[:, 5:])


def test_optimizer_decays_only_linear_weights():
    model = GPT(tiny_config())
    optimizer = model.configure_optimizers(TrainerConfig(weight_decay=0.3, learning_rate=1e-3))
    decay_group, no_decay_group = optimizer.param_groups
    assert decay_group["weight_decay"] == 0.3
    assert no_decay_group["weight_decay"] == 0.0

    linear_weights = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Linear)}
    assert {id(p) for p in decay_group["params"]} == linear_weights
    no_decay = {id(p) for p in no_decay_group["params"]}
    assert id(model.pos_emb) in no_decay
    assert id(model.tok_emb.weight) in no_decay
    assert id(model.ln_f.weight) in no_decay
    assert len(decay_group["params"]) + len(no_decay_group["params"]) == len(
        list(model.parameters())
    )


# ---------------------------------------------------------------------------------------------
# mingpt.utils
# ---------------------------------------------------------------------------------------------


def test_set_seed_makes_runs_repeatable():
    set_seed(123)
    first = torch.rand(3)
    set_seed(123)
    assert torch.equal(first, torch.rand(3))


def test_top_k_logits_keeps_exactly_k():
    logits = torch.randn(4, 20)
    out = top_k_logits(logits, 5)
    finite = torch.isfinite(out)
    assert finite.sum(dim=1).tolist() == [5, 5, 5, 5]
    # the kept entries are the k largest, unchanged
    top = torch.topk(logits, 5).values
    assert torch.equal(
        torch.sort(out[finite].view(4, 5), dim=1).values, torch.sort(top, dim=1).values
    )
    # ties with the k-th value must not let extra entries through
    assert torch.isfinite(top_k_logits(torch.zeros(1, 6), 2)).sum() == 2


def test_sample_length_and_greedy_determinism():
    set_seed(0)
    model = GPT(tiny_config())
    x = torch.randint(0, 11, (2, 3))

    greedy = sample(model, x, steps=4)
    assert greedy.shape == (2, 7)
    assert torch.equal(greedy[:, :3], x)
    assert torch.equal(sample(model, x, steps=4), greedy)
    # sampling restricted to the single most likely token is greedy decoding
    assert torch.equal(sample(model, x, steps=4, sample=True, top_k=1), greedy)

    # contexts longer than block_size are cropped rather than rejected
    long_context = torch.randint(0, 11, (1, 12))
    out = sample(model, long_context, steps=3, sample=True, top_k=3)
    assert out.shape == (1, 15)
    assert int(out.min()) >= 0 and int(out.max()) < 11


# ---------------------------------------------------------------------------------------------
# mingpt.trainer
# ---------------------------------------------------------------------------------------------


def successor_dataset(n):
    """Sequences where every next token is the current one plus one (mod 11): trivially learnable."""
    start = torch.randint(0, 11, (n, 1))
    seq = (start + torch.arange(9)) % 11  # (n, 9)
    return TensorDataset(seq[:, :-1], seq[:, 1:])


def mean_loss(model, dataset, device):
    x, y = dataset.tensors
    model.eval()
    with torch.no_grad():
        _, loss = model(x.to(device), y.to(device))
    return loss.item()


def test_trainer_lowers_loss_and_saves_checkpoint(tmp_path):
    set_seed(0)
    train_data, test_data = successor_dataset(512), successor_dataset(64)
    model = GPT(tiny_config(embd_pdrop=0.0, resid_pdrop=0.0, attn_pdrop=0.0))
    ckpt = tmp_path / "model.pt"
    config = TrainerConfig(
        max_epochs=1,
        batch_size=16,
        learning_rate=1e-2,
        lr_decay=True,
        warmup_tokens=16 * 8 * 2,
        final_tokens=512 * 8,
        ckpt_path=str(ckpt),
    )
    trainer = Trainer(model, train_data, test_data, config)
    before = mean_loss(model, test_data, trainer.device)

    trainer.train()

    after = mean_loss(model, test_data, trainer.device)
    assert len(trainer.train_losses) == 512 // 16
    assert trainer.tokens == 512 * 8
    assert after < 0.5 * before

    # the checkpoint is a plain state_dict that a fresh model can load
    fresh = GPT(tiny_config())
    fresh.load_state_dict(torch.load(ckpt, map_location="cpu"))
    assert torch.equal(fresh.head.weight, model.head.weight.cpu())
