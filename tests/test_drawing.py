"""Tests for transformer/tasks/drawing.py (chapters/drawing.md)."""

import pytest
import torch

from transformer.tasks.drawing import (DRAWING_VOCAB_SIZE, PIXELS, digit_sequences, drawing_batches, drawn_images,
    prompt_ids)
from transformer.nn.decoder_only import DecoderOnlyLM
from transformer.generation.sampling import sample
from transformer.tasks.scenes import DIGIT_NAMES, PIXEL_LEVELS


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
