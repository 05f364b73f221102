"""Tests for transformer/nn/encoder.py (chapters/encoder.md)."""

import pytest
import torch
from torch import nn

from transformer.nn.attention import padding_mask
from transformer.nn.encoder import Encoder, EncoderLayer, LayerOptions
from transformer.nn.feedforward import PositionwiseFeedForward
from transformer.nn.multihead import MultiHeadAttention
from transformer.nn.residual import LayerNorm
from factories import D_FF, D_MODEL, NUM_HEADS, random_module
from torch_reference import assert_same_values_and_grads, torch_counterpart


def batch(seed=1, requires_grad=False):
    """Inputs (2, 5, d_model), and tokens whose second row ends in two padding positions (id 0)."""
    torch.manual_seed(seed)
    x = torch.randn(2, 5, D_MODEL, requires_grad=requires_grad)
    tokens = torch.tensor([[5, 6, 7, 8, 9], [5, 6, 7, 0, 0]])
    return x, tokens


# --- structure --------------------------------------------------------------------------------


def test_layer_submodules():
    layer = EncoderLayer(D_MODEL, NUM_HEADS, D_FF, dropout=0.2, options=LayerOptions(norm_first=True))
    assert isinstance(layer.self_attn, MultiHeadAttention)
    # the paper's dropout only: none on the attention weights or the feed-forward hidden units
    assert layer.self_attn.num_heads == NUM_HEADS and layer.self_attn.dropout == 0.0
    assert isinstance(layer.feed_forward, PositionwiseFeedForward)
    assert layer.feed_forward.w_1.weight.shape == (D_FF, D_MODEL)
    assert layer.feed_forward.dropout.p == 0.0
    assert isinstance(layer.norm1, LayerNorm) and isinstance(layer.norm2, LayerNorm)
    assert isinstance(layer.dropout1, nn.Dropout) and layer.dropout1.p == 0.2
    assert isinstance(layer.dropout2, nn.Dropout) and layer.dropout2.p == 0.2
    assert layer.norm_first is True and EncoderLayer(D_MODEL, NUM_HEADS, D_FF).norm_first is False


# --- shapes -----------------------------------------------------------------------------------


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("shape", [(1, 1), (2, 5), (3, 7)])
def test_shapes_stay(norm_first, shape):
    x = torch.randn(*shape, D_MODEL)
    layer = EncoderLayer(D_MODEL, NUM_HEADS, D_FF, options=LayerOptions(norm_first=norm_first))
    encoder = Encoder(2, D_MODEL, NUM_HEADS, D_FF, options=LayerOptions(norm_first=norm_first))
    assert layer(x).shape == x.shape
    assert encoder(x).shape == x.shape


def test_stack_is_its_layers_in_turn():
    encoder = random_module(Encoder, norm_first=False).eval()
    x, tokens = batch()
    mask = padding_mask(tokens, 0)
    h = x
    for layer in encoder.layers:
        h = layer(h, mask=mask)
    torch.testing.assert_close(encoder(x, mask=mask), h)


def test_post_ln_output_is_normalised():
    x, _ = batch()
    out = EncoderLayer(D_MODEL, NUM_HEADS, D_FF).eval()(3 * x + 1)
    torch.testing.assert_close(out.mean(-1), torch.zeros(2, 5), atol=1e-5, rtol=0)
    torch.testing.assert_close(out.var(-1, unbiased=False), torch.ones(2, 5), atol=1e-3, rtol=0)


# --- agreement with torch.nn --------------------------------------------------------------------


@pytest.mark.parametrize("module_class", [EncoderLayer, Encoder], ids=["layer", "stack"])
@pytest.mark.parametrize("norm_first", [False, True], ids=["post_ln", "pre_ln"])
@pytest.mark.parametrize("masked", [False, True], ids=["unmasked", "masked"])
def test_values_and_gradients_match_torch(module_class, norm_first, masked):
    ours = random_module(module_class, norm_first)
    ref = torch_counterpart(ours, D_MODEL, NUM_HEADS, D_FF)
    x, tokens = batch(requires_grad=True)
    mask = padding_mask(tokens, 0) if masked else None
    key_padding = (tokens == 0) if masked else None
    assert_same_values_and_grads(ours, ref, (x,), lambda v: ours(v, mask=mask),
                                 lambda v: ref(v, src_key_padding_mask=key_padding))


@pytest.mark.parametrize("norm_first", [False, True])
def test_stack_matches_torch_in_eval_without_grad(norm_first):
    encoder = random_module(Encoder, norm_first).eval()
    ref = torch_counterpart(encoder, D_MODEL, NUM_HEADS, D_FF).eval()
    x, tokens = batch()
    with torch.no_grad():  # torch may take its fused fast path here
        expected = ref(x, src_key_padding_mask=tokens == 0)
        out = encoder(x, mask=padding_mask(tokens, 0))
    real = tokens != 0
    torch.testing.assert_close(out[real], expected[real])


# --- masks --------------------------------------------------------------------------------------


@pytest.mark.parametrize("norm_first", [False, True])
def test_padded_source_positions_do_not_change_real_outputs(norm_first):
    encoder = random_module(Encoder, norm_first).eval()
    x, tokens = batch()
    mask = padding_mask(tokens, 0)
    changed = x.clone()
    changed[1, 3:] = 50 * torch.randn(2, D_MODEL)
    real = tokens != 0
    torch.testing.assert_close(encoder(changed, mask=mask)[real], encoder(x, mask=mask)[real])
    # the first sequence has no padding: untouched entirely
    torch.testing.assert_close(encoder(changed, mask=mask)[0], encoder(x, mask=mask)[0])
    # without the mask the change leaks into the real positions of the second sequence
    assert not torch.allclose(encoder(changed)[1, :3], encoder(x)[1, :3])


def test_mask_broadcast_forms_agree():
    encoder = random_module(Encoder).eval()
    x, tokens = batch()
    mask = padding_mask(tokens, 0)  # (B, 1, 1, N)
    full = mask.expand(2, NUM_HEADS, 5, 5)  # (B, H, N, N)
    torch.testing.assert_close(encoder(x, mask=full), encoder(x, mask=mask))


# --- training behaviour ---------------------------------------------------------------------------


@pytest.mark.parametrize("norm_first", [False, True])
def test_gradients_reach_every_parameter(norm_first):
    encoder = Encoder(3, D_MODEL, NUM_HEADS, D_FF, dropout=0.0, options=LayerOptions(norm_first=norm_first))
    x, tokens = batch(requires_grad=True)
    out = encoder(x, mask=padding_mask(tokens, 0))
    (out * torch.randn_like(out)).sum().backward()
    for name, p in encoder.named_parameters():
        assert p.grad is not None, name
        assert torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, name
    assert torch.isfinite(x.grad).all()


def test_float64():
    encoder = random_module(Encoder, norm_first=True).eval()
    x, tokens = batch()
    mask = padding_mask(tokens, 0)
    out64 = encoder.double()(x.double(), mask=mask)
    assert out64.dtype == torch.float64
    torch.testing.assert_close(out64.float(), encoder.float()(x, mask=mask), atol=1e-5, rtol=1e-5)


# --- bad input ------------------------------------------------------------------------------------


def test_bad_inputs():
    encoder = Encoder(2, D_MODEL, NUM_HEADS, D_FF)
    x, tokens = batch()
    with pytest.raises(ValueError, match=r"x must have shape \(\.\.\., \.\.\., d_model=8\), got \(2, 5, 7\)"):
        encoder(torch.randn(2, 5, 7))
    with pytest.raises(ValueError, match=r"x must have shape .*got \(5, 8\)"):
        encoder(torch.randn(5, D_MODEL))
    with pytest.raises(TypeError, match="x must be a floating-point tensor"):
        encoder(tokens)
    with pytest.raises(ValueError, match=r"mask must broadcast .*\(2, 2, 5, 5\), got shape \(2, 1, 1, 6\)"):
        encoder(x, mask=torch.zeros(2, 1, 1, 6, dtype=torch.bool))
    with pytest.raises(TypeError, match="mask must be a bool tensor"):
        encoder(x, mask=padding_mask(tokens, 0).float())
