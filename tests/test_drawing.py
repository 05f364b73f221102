"""Tests for transformer/tasks/drawing.py (chapters/drawing.md)."""

import pytest
import torch

from transformer.tasks.drawing import (DRAWING_VOCAB_SIZE, PIXELS, digit_sequences, drawing_batches, drawn_images,
    prompt_ids)
from transformer.nn.decoder_only import DecoderOnlyLM
from transformer.generation.sampling import sample
from transformer.tasks.scenes import DIGIT_NAMES, PIXEL_LEVELS

from committed_runs import ROOT, assert_same_start, plain_path_history, train_command


def test_sequences_round_trip():
    counts = torch.randint(0, 17, (5, 1, 8, 8))
    images = counts.float() / 16
    labels = torch.tensor([0, 3, 7, 9, 1])
    sequences = digit_sequences(images, labels)
    assert sequences.shape == (5, 65)
    assert sequences[:, 0].tolist() == [17 + d for d in labels.tolist()]
    assert torch.equal(sequences[:, 1:], counts.flatten(1))  # row by row, the counts themselves
    assert torch.equal(drawn_images(sequences), images)


def test_prompt_ids_and_errors():
    assert prompt_ids(["zero", "nine"]).tolist() == [[PIXEL_LEVELS], [PIXEL_LEVELS + 9]]
    assert DRAWING_VOCAB_SIZE == PIXEL_LEVELS + len(DIGIT_NAMES) == 27
    with pytest.raises(ValueError, match="prompt words"):
        prompt_ids(["eleven"])
    with pytest.raises(TypeError, match="one str"):
        prompt_ids("seven")
    with pytest.raises(TypeError, match="floating-point"):
        digit_sequences(torch.ones(2, 1, 8, 8, dtype=torch.long), torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="8x8"):
        digit_sequences(torch.ones(2, 1, 16, 16), torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="shape"):
        drawn_images(torch.zeros(2, 64, dtype=torch.long))


def test_word_ids_in_pixels_are_drawn_blank():
    tokens = torch.full((1, 65), 16)
    tokens[0, 0], tokens[0, 5] = 20, 20
    image = drawn_images(tokens)
    assert image[0, 0, 0, 4] == 0 and image.sum() == 63


def test_batches_are_shifted():
    sequences = torch.arange(3 * 65).view(3, 65) % 27
    inputs, targets = next(drawing_batches(sequences, 4, seed=0))
    assert inputs.shape == targets.shape == (4, 64) and torch.equal(inputs[:, 1:], targets[:, :-1])


def test_sampling_with_cache_equals_without():
    torch.manual_seed(0)
    model = DecoderOnlyLM(DRAWING_VOCAB_SIZE, d_model=16, num_heads=2, d_ff=32, num_layers=1, max_len=1 + PIXELS)
    prompts = prompt_ids(["two", "eight"])
    fast = sample(model, prompts, PIXELS, generator=torch.Generator().manual_seed(3))
    slow = sample(model, prompts, PIXELS, use_cache=False, generator=torch.Generator().manual_seed(3))
    assert torch.equal(fast, slow) and fast.shape == (2, 65)
    with pytest.raises(ValueError, match="max_len"):
        sample(model, prompts, PIXELS + 2)


# --- the committed drawer (models/drawer)


FOLDER = ROOT / "models" / "drawer"


def _committed():
    """The committed drawer, its checkpoint and its recorded scores."""
    import json

    from transformer.tasks.drawing import make_drawer
    from transformer.training.checkpoint import load_checkpoint, read_checkpoint

    model = make_drawer()
    load_checkpoint(FOLDER / "model.pt", model)
    return model.eval(), read_checkpoint(FOLDER / "model.pt"), json.loads((FOLDER / "results.json").read_text())


def test_train_drawer_repeats_a_run_and_refuses_no_steps():
    from transformer.tasks.drawing import train_drawer

    sequences = torch.randint(0, PIXEL_LEVELS, (32, 65), generator=torch.Generator().manual_seed(0))
    (first, history), (second, again) = (train_drawer(sequences, 3, 5) for _ in range(2))
    assert history == again and len(history["loss"]) == 3 and not first.training
    assert all(torch.equal(a, b) for a, b in zip(first.state_dict().values(), second.state_dict().values()))
    with pytest.raises(ValueError, match="steps"):
        train_drawer(sequences, 0, 5)


def test_the_committed_drawer_reproduces_its_recorded_scores():
    """models/drawer/results.json, recomputed from the committed weights (a second)."""
    train = train_command(FOLDER)
    model, checkpoint, recorded = _committed()
    assert (checkpoint["step"], checkpoint["seed"]) == (recorded["steps"], recorded["seed"]) == (1500, 0)
    assert len(checkpoint["history"]["loss"]) == 1500
    measured = train.scores(model, train.chapter_sequences())
    for key in ("held_out_loss", "train_loss"):
        assert measured[key] == pytest.approx(recorded[key], abs=1e-3), key


@pytest.mark.parametrize("arguments, message", [
    (["--steps", "0"], "--steps must be a positive number, got 0"),
    (["--out", "{tmp}/file"], "--out must be a folder, got the file {tmp}/file"),
])
def test_the_drawer_command_refuses_bad_input_in_one_line(arguments, message, tmp_path, monkeypatch, capsys):
    (tmp_path / "file").write_text("not a folder")
    monkeypatch.setattr("sys.argv", ["train.py", *(a.format(tmp=tmp_path) for a in arguments)])
    with pytest.raises(SystemExit) as ended:
        train_command(FOLDER).main()
    assert ended.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"train.py: {message.format(tmp=tmp_path)}"]


@pytest.mark.slow  # trains the recipe's first 50 steps (about 15 s)
def test_the_committed_drawer_is_the_recipes_run(tmp_path):
    """The recipe's first 50 steps, within its warm-up (train.py on the plain path, as the README's
    run; about ten seconds): bit for bit the committed history's first 50 steps, loss and gradient
    norm, so the same initial weights, batches, loss and optimiser; and every later step's rate is the recipe's
    cosine decay over 1,500 steps (peak 3e-3 after 100 steps of warm-up)."""
    from transformer.training.schedules import warmup_cosine

    committed = _committed()[1]["history"]
    start = plain_path_history(FOLDER, 50, tmp_path)
    assert_same_start(start, committed, 50)
    assert committed["lr"] == [3e-3 * warmup_cosine(step, 100, 1500) for step in range(1, 1501)]
