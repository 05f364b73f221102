"""Tests for transformer/nn/vision.py (chapters/vision.md)."""

import gzip
import hashlib
import math
import shutil

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from transformer.tasks.digits import DIGITS_SHA256, load_digits, stratified_split
from transformer.nn.vision import (GridRelativeMultiHeadAttention, PatchEmbedding, grid_relations, patches,
    sinusoidal_encoding_2d)
from transformer import VisionTransformer, train_classifier
from transformer.tasks.classifier import accuracy
from transformer.paths import data_file
from transformer.nn.encoder import Encoder, EncoderLayer, LayerOptions
from transformer.nn.multihead import MultiHeadAttention
from transformer.nn.positional import sinusoidal_encoding
from transformer.nn.relative import RelativeMultiHeadAttention


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


# --- data ---------------------------------------------------------------------------------------

def test_digits_file_and_loader():
    raw = data_file("digits.csv.gz").read_bytes()
    assert hashlib.sha256(raw).hexdigest() == DIGITS_SHA256
    rows = gzip.decompress(raw).decode("ascii").splitlines()
    images, labels = load_digits()
    assert images.shape == (1797, 1, 8, 8) and images.dtype == torch.float32
    assert labels.shape == (1797,) and labels.dtype == torch.long
    # row 0 of the file, read independently: 64 pixel counts then the digit
    first = [int(v) for v in rows[0].split(",")]
    assert images[0].flatten().tolist() == [v / 16 for v in first[:64]] and labels[0] == first[64]
    assert torch.bincount(labels).tolist() == [178, 182, 177, 183, 181, 182, 181, 179, 174, 180]


def test_digits_altered_or_missing(tmp_path):
    altered = tmp_path / "digits.csv.gz"
    shutil.copy(data_file("digits.csv.gz"), altered)
    data = bytearray(altered.read_bytes())
    data[-10] ^= 1
    altered.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="is not the book's digits file: its SHA-256"):
        load_digits(altered)
    with pytest.raises(FileNotFoundError, match="no digits file at"):
        load_digits(tmp_path / "missing.csv.gz")


def test_stratified_split():
    labels = torch.tensor([0] * 10 + [1] * 7 + [2] * 4)
    train, test = stratified_split(labels, test_fraction=0.25, seed=3)
    assert sorted(train.tolist() + test.tolist()) == list(range(21))  # disjoint and complete
    assert torch.bincount(labels[test]).tolist() == [round(0.25 * 10), round(0.25 * 7), round(0.25 * 4)]
    again = stratified_split(labels, test_fraction=0.25, seed=3)
    assert torch.equal(test, again[1])  # deterministic
    torch.manual_seed(123)  # the global generator plays no part
    assert torch.equal(test, stratified_split(labels, test_fraction=0.25, seed=3)[1])
    with pytest.raises(ValueError, match=r"test_fraction must be a number in \(0, 1\)"):
        stratified_split(labels, test_fraction=1.0)
    with pytest.raises(ValueError, match="labels must be a 1-D integer tensor"):
        stratified_split(labels.float())


# --- patches ------------------------------------------------------------------------------------

def test_patches_against_slicing():
    x = torch.randn(2, 3, 6, 4)
    out = patches(x, 2)
    assert out.shape == (2, 6, 12)
    for b in range(2):
        n = 0
        for r in range(0, 6, 2):
            for c in range(0, 4, 2):
                assert torch.equal(out[b, n], x[b, :, r:r + 2, c:c + 2].flatten())
                n += 1


def test_patch_embedding_equals_convolution():
    torch.manual_seed(0)
    embed = PatchEmbedding(image_size=12, patch_size=4, in_channels=3, d_model=10)
    x = torch.randn(4, 3, 12, 12)
    weight = embed.proj.weight.reshape(10, 3, 4, 4)  # (d_model, C*P*P) -> (d_model, C, P, P)
    by_conv = F.conv2d(x, weight, embed.proj.bias, stride=4)  # (B, d_model, 3, 3)
    torch.testing.assert_close(embed(x), by_conv.flatten(2).transpose(1, 2))
    assert embed.num_patches == 9 and embed.grid_size == 3


def test_patch_bad_input():
    with pytest.raises(ValueError, match="patch_size must divide image_size"):
        PatchEmbedding(image_size=8, patch_size=3, in_channels=1, d_model=4)
    with pytest.raises(ValueError, match="patch_size must divide the height and the width"):
        patches(torch.randn(1, 1, 8, 6), 4)
    with pytest.raises(ValueError, match=r"images must have shape \(B, C, H, W\)"):
        patches(torch.randn(8, 8), 2)
    embed = PatchEmbedding(image_size=8, patch_size=2, in_channels=1, d_model=4)
    with pytest.raises(ValueError, match=r"images must have shape \(B, 1, 8, 8\) = \(B, C, H, W\), got \(2, 3, 8, 8\)"):
        embed(torch.randn(2, 3, 8, 8))
    with pytest.raises(ValueError, match=r"got \(2, 1, 6, 6\)"):
        embed(torch.randn(2, 1, 6, 6))
    with pytest.raises(TypeError, match="images must be a floating-point tensor, got dtype torch.int64"):
        embed(torch.ones(2, 1, 8, 8, dtype=torch.long))
    with pytest.raises(TypeError, match="images must be a torch.Tensor"):
        embed([[0.0]])
    with pytest.raises(TypeError, match="in_channels must be a positive int"):
        PatchEmbedding(image_size=8, patch_size=2, in_channels=1.5, d_model=4)


# --- positions ----------------------------------------------------------------------------------

def test_sinusoidal_2d():
    table = sinusoidal_encoding_2d(3, 8)
    one_d = sinusoidal_encoding(3, 4)
    for n in range(9):
        r, c = divmod(n, 3)
        assert torch.equal(table[n], torch.cat([one_d[r], one_d[c]]))
    with pytest.raises(ValueError, match="d_model must be a multiple of 4"):
        sinusoidal_encoding_2d(3, 6)


def test_grid_relations_by_formula():
    for grid, k, prefix in [(4, 2, 1), (3, 1, 2), (5, 3, 0)]:
        index = grid_relations(grid, k, prefix)
        size = prefix + grid * grid
        assert index.shape == (size, size)
        for i in range(size):
            for j in range(size):
                if i < prefix or j < prefix:
                    expected = (2 * k + 1) ** 2
                else:
                    (ri, ci), (rj, cj) = divmod(i - prefix, grid), divmod(j - prefix, grid)
                    expected = (max(-k, min(k, rj - ri)) + k) * (2 * k + 1) + max(-k, min(k, cj - ci)) + k
                assert index[i, j] == expected
    with pytest.raises(ValueError, match="num_prefix must be an int >= 0"):
        grid_relations(3, 1, -1)


def make_grid_attention(seed=0, **kwargs):
    torch.manual_seed(seed)
    layer = GridRelativeMultiHeadAttention(8, 2, **kwargs)
    with torch.no_grad():
        for table in (layer.rel_k, layer.rel_v):
            table.weight.normal_()
    return layer.eval()


def test_grid_attention_against_loop():
    """Shaw et al.'s equations one (b, h, i, j) at a time, with the 2-D offsets of the patches."""
    layer = make_grid_attention(max_distance=1, grid_size=3)
    assert layer.rel_k.weight.shape == (3 * 3 + 1, 4)
    torch.manual_seed(1)
    x = torch.randn(2, 10, 8)
    B, N, H, d_k = 2, 10, 2, 4
    q, k, v = (t.reshape(B, N, H, d_k).transpose(1, 2) for t in (layer.w_q(x), layer.w_k(x), layer.w_v(x)))
    heads = torch.zeros(B, H, N, d_k)
    for b in range(B):
        for h in range(H):
            for i in range(N):
                rows = []
                for j in range(N):
                    if i == 0 or j == 0:
                        rows.append(9)
                    else:
                        (ri, ci), (rj, cj) = divmod(i - 1, 3), divmod(j - 1, 3)
                        rows.append((max(-1, min(1, rj - ri)) + 1) * 3 + max(-1, min(1, cj - ci)) + 1)
                e = torch.stack([q[b, h, i] @ (k[b, h, j] + layer.rel_k.weight[r]) for j, r in enumerate(rows)])
                alpha = torch.softmax(e / math.sqrt(d_k), dim=0)
                heads[b, h, i] = sum(a * (v[b, h, j] + layer.rel_v.weight[r]) for j, (a, r) in enumerate(zip(alpha, rows)))
    expected = layer.w_o(heads.transpose(1, 2).reshape(B, N, 8))
    torch.testing.assert_close(layer(x, x, x), expected)
    out, weights = layer(x, x, x, need_weights=True)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(weights.sum(-1), torch.ones(B, H, N))


def test_grid_attention_zero_tables_is_plain_attention():
    """With both tables zero the layer is torch.nn.MultiheadAttention (weights copied)."""
    layer = make_grid_attention(max_distance=2, grid_size=2)
    with torch.no_grad():
        layer.rel_k.weight.zero_(), layer.rel_v.weight.zero_()
    reference = nn.MultiheadAttention(8, 2, batch_first=True).eval()
    with torch.no_grad():
        reference.in_proj_weight.copy_(torch.cat([layer.w_q.weight, layer.w_k.weight, layer.w_v.weight]))
        reference.in_proj_bias.copy_(torch.cat([layer.w_q.bias, layer.w_k.bias, layer.w_v.bias]))
        reference.out_proj.weight.copy_(layer.w_o.weight), reference.out_proj.bias.copy_(layer.w_o.bias)
    x = torch.randn(3, 5, 8)
    torch.testing.assert_close(layer(x, x, x), reference(x, x, x, need_weights=False)[0])


def test_grid_attention_bad_length():
    layer = make_grid_attention(max_distance=1, grid_size=3)
    x = torch.randn(1, 7, 8)
    with pytest.raises(ValueError, match="3x3 patches, 10 positions, got 7 queries and 7 keys"):
        layer(x, x, x)


def test_relative_subclass_hooks_change_only_geometry():
    """The 1-D layer through its hooks: tables of 2k + 1 rows and relative_positions as the index."""
    layer = RelativeMultiHeadAttention(8, 2, max_distance=3)
    assert layer.num_relations() == 7 and layer.rel_k.weight.shape == (7, 4)
    grid = GridRelativeMultiHeadAttention(8, 2, max_distance=3, grid_size=4)
    assert grid.num_relations() == 50 and grid.rel_v.weight.shape == (50, 4)


# --- encoder with a given self-attention --------------------------------------------------------

def test_encoder_self_attention_argument():
    relative = LayerOptions(
        self_attention=lambda d, h, dropout: RelativeMultiHeadAttention(d, h, dropout=dropout, max_distance=2))
    encoder = Encoder(2, 8, 2, 16, dropout=0.0, options=relative)
    assert all(isinstance(layer.self_attn, RelativeMultiHeadAttention) for layer in encoder.layers)
    assert encoder(torch.randn(2, 5, 8)).shape == (2, 5, 8)
    assert type(EncoderLayer(8, 2, 16).self_attn) is MultiHeadAttention  # the default
    with pytest.raises(TypeError, match="self_attention must be callable"):
        EncoderLayer(8, 2, 16, options=LayerOptions(self_attention="relative"))


# --- the model ----------------------------------------------------------------------------------

@pytest.mark.parametrize("positions", ["learned", "sinusoidal", "relative", "none"])
def test_vision_transformer_shapes_and_batch_independence(positions):
    torch.manual_seed(0)
    model = VisionTransformer(image_size=8, patch_size=2, in_channels=3, num_classes=5, d_model=16,
                              num_heads=2, d_ff=32, num_layers=2, positions=positions).eval()
    x = torch.randn(4, 3, 8, 8)
    logits = model(x)
    assert logits.shape == (4, 5)
    torch.testing.assert_close(model(x[1:2]), logits[1:2])  # each image alone gives its own row
    uses_relative = [isinstance(layer.self_attn, GridRelativeMultiHeadAttention) for layer in model.encoder.layers]
    assert all(uses_relative) == (positions == "relative")
    assert (model.pos_embed is not None) == (positions == "learned")


def test_vision_transformer_without_positions_sees_a_bag():
    """With no positions, permuting the patches leaves the class token's output, so the logits, unchanged."""
    torch.manual_seed(0)
    model = VisionTransformer(d_model=16, num_heads=2, d_ff=32, num_layers=2, positions="none").eval()
    x = torch.randn(3, 1, 8, 8)
    grid = x.reshape(3, 1, 4, 2, 4, 2)  # blocks of 2x2 pixels
    shuffled = grid.flip(2).reshape(3, 1, 8, 8)  # the rows of patches in the opposite order
    torch.testing.assert_close(model(shuffled), model(x))
    learned = VisionTransformer(d_model=16, num_heads=2, d_ff=32, num_layers=2, positions="learned").eval()
    with torch.no_grad():
        learned.pos_embed.normal_()
    assert not torch.allclose(learned(shuffled), learned(x), atol=1e-4)  # with positions it is not


def test_vision_transformer_bad_arguments():
    with pytest.raises(ValueError, match="positions must be 'learned', 'sinusoidal', 'relative' or 'none'"):
        VisionTransformer(positions="2d")
    with pytest.raises(ValueError, match="patch_size must divide image_size"):
        VisionTransformer(image_size=8, patch_size=3)
    with pytest.raises(ValueError, match="d_model must be a multiple of 4"):
        VisionTransformer(d_model=18, num_heads=2, positions="sinusoidal")
    with pytest.raises(ValueError, match=r"dropout must be in \[0, 1\)"):
        VisionTransformer(dropout=1.0)
    with pytest.raises(ValueError, match="num_classes must be a positive int"):
        VisionTransformer(num_classes=0)
    with pytest.raises(ValueError, match=r"images must have shape \(B, 1, 8, 8\)"):
        VisionTransformer()(torch.randn(2, 3, 8, 8))


@pytest.mark.slow  # a training run
def test_vision_transformer_learns_digits():
    """A short run on the digits ends far above chance (10%) on held-out images."""
    images, labels = load_digits()
    train, test = stratified_split(labels)
    torch.manual_seed(0)
    model = VisionTransformer(dropout=0.0)
    train_classifier(model, images[train], labels[train], steps=200, batch_size=64, lr=2e-3, warmup=20,
                     pad_id=None)
    assert accuracy(model, images[test], labels[test]) > 0.6
