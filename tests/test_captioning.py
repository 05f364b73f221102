"""Tests for transformer/tasks/scenes.py, transformer/nn/captioner.py and transformer/tasks/captioning.py
(chapters/captioning.md)."""

import pytest
import torch
import torch.nn.functional as F

from transformer.nn.cache import DecoderCache
from transformer.tasks.captioning import ImageCaptioner, caption_batches, caption_scores
from transformer.generation.decoding import beam_search, greedy_decode
from transformer.nn.model import Transformer
from transformer.tasks.scenes import (CANVAS_SIZE, DIGIT_NAMES, PIXEL_LEVELS, CaptionVocab, is_held_out, make_scenes,
                                     pixel_tokens)
from transformer.nn.vision import patches

from committed_runs import ROOT, assert_same_start, plain_path_history, train_command


def marked_digits():
    """Ten 8x8 'digits', digit d a block of grey level d + 1 (out of 16) with one dark corner pixel."""
    images = torch.zeros(10, 1, 8, 8)
    for d in range(10):
        images[d, 0, 1:7, 1:7] = (d + 1) / 16
        images[d, 0, 0, 0] = 1.0
    return images, torch.arange(10)


def read_scene(image):
    """An independent reading of a scene built from ``marked_digits``: its caption from the cells."""
    found = []
    for row in range(2):
        for column in range(2):
            cell = image[0, 8 * row:8 * row + 8, 8 * column:8 * column + 8]
            if cell.abs().sum() > 0:
                found.append((row, column, round(cell[3, 3].item() * 16) - 1))
    (r1, c1, a), (r2, c2, b) = found  # reading order: left before right, top before bottom
    layout = "left of" if r1 == r2 else "above"
    return f"{DIGIT_NAMES[a]} {layout} {DIGIT_NAMES[b]}"


def test_captions_match_layouts():
    images, labels = marked_digits()
    scenes = make_scenes(images, labels, 200, seed=0)
    assert [read_scene(image) for image in scenes.images] == scenes.captions
    for caption, digits, layout in zip(scenes.captions, scenes.digits.tolist(), scenes.layouts.tolist()):
        assert not is_held_out(*digits, layout)
        assert caption.split()[0] == DIGIT_NAMES[digits[0]] and caption.split()[-1] == DIGIT_NAMES[digits[1]]


def test_held_out_wordings_and_determinism():
    images, labels = marked_digits()
    held = make_scenes(images, labels, 300, seed=5, held_out=True)
    assert all(is_held_out(*d, layout) for d, layout in zip(held.digits.tolist(), held.layouts.tolist()))
    assert len(set(held.captions)) == 20
    again = make_scenes(images, labels, 300, seed=5, held_out=True)
    assert torch.equal(held.images, again.images) and held.captions == again.captions


def test_scene_of_known_image_has_known_patches():
    images, labels = marked_digits()
    scenes = make_scenes(images, labels, 50, seed=1)
    grid = patches(scenes.images, 4)  # (M, 16, 16): 4x4 patches of 4x4 pixels
    for i in range(50):
        for which in range(2):
            row, column = scenes.cells[i, which].tolist()
            own = patches(images[scenes.digits[i, which]].unsqueeze(0), 4)[0]  # (4, 16)
            indices = [(2 * row + r) * 4 + 2 * column + c for r in range(2) for c in range(2)]
            assert torch.equal(grid[i, indices], own)
        blank = torch.ones(16, dtype=torch.bool)
        for row, column in scenes.cells[i].tolist():
            blank[[(2 * row + r) * 4 + 2 * column + c for r in range(2) for c in range(2)]] = False
        assert grid[i, blank].abs().sum() == 0


def test_test_scenes_use_only_the_given_images():
    images, labels = marked_digits()
    scenes = make_scenes(images[:5], labels[:5], 100, seed=2)
    assert scenes.digits.max() < 5


def test_patch_front_end_equals_strided_convolution():
    torch.manual_seed(0)
    model = ImageCaptioner(16, patch_size=4, d_model=32, num_heads=4, dropout=0.0).eval()
    ids = torch.randint(0, 17, (3, CANVAS_SIZE * CANVAS_SIZE))
    front = model.src_embed
    proj = front.patch_embed.proj
    images = ids.float().div(16).view(3, 1, 16, 16)
    conv = F.conv2d(images, proj.weight.view(32, 1, 4, 4), proj.bias, stride=4)  # (3, 32, 4, 4)
    expected = conv.flatten(2).transpose(1, 2) + front.pos_embed  # (3, 16, 32)
    torch.testing.assert_close(front(ids), expected)


def test_incremental_decoding_equals_full_forward():
    torch.manual_seed(0)
    model = ImageCaptioner(16, d_model=32, num_heads=4, max_len=6, dropout=0.0).eval()
    src = torch.randint(0, 17, (4, 256))
    tgt = torch.randint(3, 16, (4, 5))
    full = model(src, tgt)  # (4, 5, 16)
    with torch.no_grad():
        memory = model.encode(src)
        cache = DecoderCache(len(model.decoder.layers))
        steps = [model.output(model.decode(tgt[:, t:t + 1], memory, cache=cache)) for t in range(5)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)
    fast = greedy_decode(model, src, 6, 1, 2)
    assert torch.equal(fast, greedy_decode(model, src, 6, 1, 2, use_cache=False))
    assert torch.equal(beam_search(model, src, 6, 1, 2, beam_size=1), fast[:, :beam_search(model, src, 6, 1, 2,
                                                                                            beam_size=1).shape[1]])


def test_bad_input():
    model = ImageCaptioner(16, max_len=6)
    src = torch.randint(0, 17, (2, 256))
    with pytest.raises(TypeError, match="grey levels as token ids"):
        model.encode(torch.rand(2, 1, 16, 16))
    with pytest.raises(ValueError, match="256 pixel tokens"):
        model.encode(src[:, :64])
    with pytest.raises(ValueError, match="max_len=6"):
        model(src, torch.ones(2, 7, dtype=torch.long))
    with pytest.raises(ValueError, match="more than max_len=4"):
        CaptionVocab().encode(["three left of seven"], 4)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        CaptionVocab().encode(["three right of seven"], 6)
    with pytest.raises(TypeError, match="floating-point"):
        pixel_tokens(torch.ones(1, 1, 16, 16, dtype=torch.long))
    with pytest.raises(ValueError, match=r"\(B, 1, H, W\)"):
        pixel_tokens(torch.ones(16, 16))
    images, labels = marked_digits()
    with pytest.raises(ValueError, match=r"\(M, 1, 8, 8\)"):
        make_scenes(torch.zeros(10, 1, 16, 16), labels, 5, seed=0)
    with pytest.raises(TypeError, match="floating-point"):
        make_scenes(images.long(), labels, 5, seed=0)


def test_vocab_round_trip_and_scores():
    vocab = CaptionVocab()
    ids = vocab.encode(["nine above zero"], 6)
    assert ids[0].tolist()[:5] == [1, vocab.stoi["nine"], vocab.stoi["above"], vocab.stoi["zero"], 2]
    assert vocab.decode(ids[0].tolist()) == "nine above zero"
    exact, words = caption_scores(["a b c", "a b d e"], ["a b c", "a x d"])
    assert exact == 0.5 and words == pytest.approx(5 / 6)


def test_caption_batches():
    src = torch.arange(10)[:, None].expand(10, 256) % 17
    captions = torch.arange(10)[:, None].expand(10, 6)
    batch = next(caption_batches(src, captions, 4, 16, seed=0))
    assert torch.equal(batch.src[:, 0], batch.tgt_in[:, 0]) and batch.src_mask.shape == (4, 1, 1, 16)
    assert torch.equal(batch.tgt_out, batch.tgt_in)  # constant rows: the shift is by one position


def test_the_captioner_lives_in_nn_and_plugs_its_front_end_into_transformer():
    import transformer.nn.captioner as captioner
    import transformer.tasks.captioning as task

    assert task.ImageCaptioner is captioner.ImageCaptioner and task.PatchFrontEnd is captioner.PatchFrontEnd
    model = ImageCaptioner(16)
    assert isinstance(model.src_embed, captioner.PatchFrontEnd)
    assert (model.src_embed.image_size, model.src_embed.vocab_size) == (CANVAS_SIZE, PIXEL_LEVELS)  # the scenes'
    assert type(model).encode is Transformer.encode  # the front-end hook, no encode of its own
    table = [name for name, p in model.named_parameters() if p.shape[0] == PIXEL_LEVELS]
    assert table == []  # no token table of the grey levels built and thrown away
    other = ImageCaptioner(16, image_size=8, patch_size=4, pixel_levels=5)
    assert other.src_embed.vocab_size == 5 and other.encode(torch.randint(0, 5, (2, 64))).shape == (2, 4, 64)
    with pytest.raises(ValueError, match="pixel_levels must be at least 2"):
        ImageCaptioner(16, pixel_levels=1)


# --- the committed captioner (models/captioner)


FOLDER = ROOT / "models" / "captioner"


def _committed():
    """The committed captioner, its checkpoint and its recorded scores."""
    import json

    from transformer.training.checkpoint import load_checkpoint, read_checkpoint

    model = ImageCaptioner(len(CaptionVocab()), max_len=train_command(FOLDER).MAX_LEN)
    load_checkpoint(FOLDER / "model.pt", model)
    return model.eval(), read_checkpoint(FOLDER / "model.pt"), json.loads((FOLDER / "results.json").read_text())


def test_train_captioner_repeats_a_run_and_refuses_no_steps():
    from transformer.tasks.captioning import train_captioner

    images, labels = marked_digits()
    scenes, vocab = make_scenes(images, labels, 64, seed=0), CaptionVocab()
    src, captions = pixel_tokens(scenes.images), vocab.encode(scenes.captions, 6)
    (first, history), (second, again) = (train_captioner(src, captions, 3, 5, len(vocab)) for _ in range(2))
    assert history == again and len(history["loss"]) == 3 and not first.training
    assert all(torch.equal(a, b) for a, b in zip(first.state_dict().values(), second.state_dict().values()))
    with pytest.raises(ValueError, match="steps"):
        train_captioner(src, captions, 0, 5, len(vocab))


def test_the_committed_captioner_reproduces_its_recorded_scores():
    """models/captioner/results.json, recomputed from the committed weights (a few seconds)."""
    train = train_command(FOLDER)
    model, checkpoint, recorded = _committed()
    assert (checkpoint["step"], checkpoint["seed"]) == (recorded["steps"], recorded["seed"]) == (4000, 0)
    assert len(checkpoint["history"]["loss"]) == 4000
    measured = train.scores(model, train.chapter_scenes())
    for key in ("test_exact", "test_words", "composition_exact", "composition_words"):
        assert measured[key] == pytest.approx(recorded[key], abs=0.005), key


@pytest.mark.parametrize("arguments, message", [
    (["--steps", "0"], "--steps must be a positive number, got 0"),
    (["--out", "{tmp}/file"], "--out must be a folder, got the file {tmp}/file"),
])
def test_the_captioner_command_refuses_bad_input_in_one_line(arguments, message, tmp_path, monkeypatch, capsys):
    (tmp_path / "file").write_text("not a folder")
    monkeypatch.setattr("sys.argv", ["train.py", *(a.format(tmp=tmp_path) for a in arguments)])
    with pytest.raises(SystemExit) as ended:
        train_command(FOLDER).main()
    assert ended.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"train.py: {message.format(tmp=tmp_path)}"]


@pytest.mark.slow  # trains the recipe's first 100 steps (about 15 s)
def test_the_committed_captioner_is_the_recipes_run(tmp_path):
    """The recipe's 100 warm-up steps (train.py on the plain path, as the README's run; about ten
    seconds): bit for bit the committed history's first 100 steps, loss, accuracy and gradient norm,
    so the same initial weights, batches, loss and optimiser; and every later step's rate is the
    recipe's cosine decay over 4,000 steps (peak 2e-3 after 100 steps of warm-up)."""
    from transformer.training.schedules import warmup_cosine

    committed = _committed()[1]["history"]
    start = plain_path_history(FOLDER, 100, tmp_path)
    assert_same_start(start, committed, 100)
    assert committed["lr"] == [2e-3 * warmup_cosine(step, 100, 4000) for step in range(1, 4001)]
