"""Tests for transformer/encoder.py (chapters/08_encoder.md)."""

import pytest
import torch
from torch import nn

from transformer.attention import padding_mask
from transformer.encoder import Encoder, EncoderLayer
from transformer.feedforward import PositionwiseFeedForward
from transformer.multihead import MultiHeadAttention
from transformer.residual import LayerNorm
from torch_reference import randomise, torch_names

D_MODEL, NUM_HEADS, D_FF = 8, 2, 16


def make_layer(norm_first=False, seed=0, dropout=0.0):
    torch.manual_seed(seed)
    return randomise(EncoderLayer(D_MODEL, NUM_HEADS, D_FF, dropout=dropout, norm_first=norm_first))


def make_encoder(norm_first=False, num_layers=3, seed=0, dropout=0.0):
    torch.manual_seed(seed)
    encoder = Encoder(num_layers, D_MODEL, NUM_HEADS, D_FF, dropout=dropout, norm_first=norm_first)
    return randomise(encoder)


def torch_layer(layer):
    ref = nn.TransformerEncoderLayer(D_MODEL, NUM_HEADS, D_FF, dropout=0.0, activation="relu",
                                     batch_first=True, norm_first=layer.norm_first)
    ref.load_state_dict(torch_names(dict(layer.named_parameters())))  # strict: every weight copied
    return ref


def torch_encoder(encoder):
    norm_first = encoder.layers[0].norm_first
    layer = nn.TransformerEncoderLayer(D_MODEL, NUM_HEADS, D_FF, dropout=0.0, activation="relu",
                                       batch_first=True, norm_first=norm_first)
    norm = nn.LayerNorm(D_MODEL) if norm_first else None
    ref = nn.TransformerEncoder(layer, len(encoder.layers), norm=norm, enable_nested_tensor=False)
    ref.load_state_dict(torch_names(dict(encoder.named_parameters())))
    return ref


def batch(seed=1, requires_grad=False):
    """Inputs (2, 5, d_model), and tokens whose second row ends in two padding positions (id 0)."""
    torch.manual_seed(seed)
    x = torch.randn(2, 5, D_MODEL, requires_grad=requires_grad)
    tokens = torch.tensor([[5, 6, 7, 8, 9], [5, 6, 7, 0, 0]])
    return x, tokens


def assert_same_values_and_grads(ours, ref, x, run_ours, run_ref):
    """Outputs, input gradients and parameter gradients of the two modules agree."""
    torch.manual_seed(2)
    out, ref_out = run_ours(x), run_ref(x)
    torch.testing.assert_close(out, ref_out)
    probe = torch.randn_like(out)  # a loss whose gradient is not trivially zero through a LayerNorm
    grads = torch.autograd.grad((out * probe).sum(), [x, *ours.parameters()])
    ref_grads = torch.autograd.grad((ref_out * probe).sum(), [x, *ref.parameters()])
    torch.testing.assert_close(grads[0], ref_grads[0])
    names = [n for n, _ in ours.named_parameters()]
    mapped = torch_names(dict(zip(names, grads[1:])))
    ref_named = dict(zip([n for n, _ in ref.named_parameters()], ref_grads[1:]))
    assert mapped.keys() == ref_named.keys()
    for name in mapped:
        torch.testing.assert_close(mapped[name], ref_named[name], msg=name)


# --- structure --------------------------------------------------------------------------------


def test_layer_submodules():
    layer = EncoderLayer(D_MODEL, NUM_HEADS, D_FF, dropout=0.2, norm_first=True)
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


def test_stack_structure_and_final_norm():
    post = Encoder(4, D_MODEL, NUM_HEADS, D_FF)
    assert isinstance(post.layers, nn.ModuleList) and len(post.layers) == 4
    assert all(isinstance(layer, EncoderLayer) and not layer.norm_first for layer in post.layers)
    assert post.norm is None
    pre = Encoder(2, D_MODEL, NUM_HEADS, D_FF, norm_first=True)
    assert all(layer.norm_first for layer in pre.layers)
    assert isinstance(pre.norm, LayerNorm)


def test_base_layer_parameter_count_matches_torch():
    def count(module):
        return sum(p.numel() for p in module.parameters())

    ours = EncoderLayer(512, 8, 2048)
    assert count(ours) == count(nn.TransformerEncoderLayer(512, 8, 2048)) == 3_152_384


def test_layers_have_independent_weights():
    encoder = Encoder(3, D_MODEL, NUM_HEADS, D_FF)
    for name, p in encoder.layers[0].named_parameters():
        others = [dict(layer.named_parameters())[name] for layer in encoder.layers[1:]]
        assert all(p.data_ptr() != q.data_ptr() for q in others), name
        if "w_" in name and name.endswith("weight"):  # random initial values, drawn per layer
            assert all(not torch.equal(p, q) for q in others), name
    before = [layer.self_attn.w_q.weight.clone() for layer in encoder.layers]
    with torch.no_grad():
        encoder.layers[0].self_attn.w_q.weight.add_(1.0)
    for layer, old in zip(encoder.layers[1:], before[1:]):
        torch.testing.assert_close(layer.self_attn.w_q.weight, old)


# --- shapes -----------------------------------------------------------------------------------


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("shape", [(1, 1), (2, 5), (3, 7)])
def test_shapes_stay(norm_first, shape):
    x = torch.randn(*shape, D_MODEL)
    layer = EncoderLayer(D_MODEL, NUM_HEADS, D_FF, norm_first=norm_first)
    encoder = Encoder(2, D_MODEL, NUM_HEADS, D_FF, norm_first=norm_first)
    assert layer(x).shape == x.shape
    assert encoder(x).shape == x.shape


def test_stack_is_its_layers_in_turn():
    encoder = make_encoder(norm_first=False).eval()
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


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("masked", [False, True])
def test_layer_matches_torch(norm_first, masked):
    layer = make_layer(norm_first)
    ref = torch_layer(layer)
    x, tokens = batch(requires_grad=True)
    mask = padding_mask(tokens, 0) if masked else None
    key_padding = (tokens == 0) if masked else None
    assert_same_values_and_grads(layer, ref, x, lambda v: layer(v, mask=mask),
                                 lambda v: ref(v, src_key_padding_mask=key_padding))


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("masked", [False, True])
def test_stack_matches_torch(norm_first, masked):
    encoder = make_encoder(norm_first)
    ref = torch_encoder(encoder)
    x, tokens = batch(requires_grad=True)
    mask = padding_mask(tokens, 0) if masked else None
    key_padding = (tokens == 0) if masked else None
    assert_same_values_and_grads(encoder, ref, x, lambda v: encoder(v, mask=mask),
                                 lambda v: ref(v, src_key_padding_mask=key_padding))


@pytest.mark.parametrize("norm_first", [False, True])
def test_stack_matches_torch_in_eval_without_grad(norm_first):
    encoder = make_encoder(norm_first).eval()
    ref = torch_encoder(encoder).eval()
    x, tokens = batch()
    with torch.no_grad():  # torch may take its fused fast path here
        expected = ref(x, src_key_padding_mask=tokens == 0)
        out = encoder(x, mask=padding_mask(tokens, 0))
    real = tokens != 0
    torch.testing.assert_close(out[real], expected[real])


# --- masks --------------------------------------------------------------------------------------


@pytest.mark.parametrize("norm_first", [False, True])
def test_padded_source_positions_do_not_change_real_outputs(norm_first):
    encoder = make_encoder(norm_first).eval()
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
    encoder = make_encoder().eval()
    x, tokens = batch()
    mask = padding_mask(tokens, 0)  # (B, 1, 1, N)
    full = mask.expand(2, NUM_HEADS, 5, 5)  # (B, H, N, N)
    torch.testing.assert_close(encoder(x, mask=full), encoder(x, mask=mask))


# --- training behaviour ---------------------------------------------------------------------------


@pytest.mark.parametrize("norm_first", [False, True])
def test_gradients_reach_every_parameter(norm_first):
    encoder = Encoder(3, D_MODEL, NUM_HEADS, D_FF, dropout=0.0, norm_first=norm_first)
    x, tokens = batch(requires_grad=True)
    out = encoder(x, mask=padding_mask(tokens, 0))
    (out * torch.randn_like(out)).sum().backward()
    for name, p in encoder.named_parameters():
        assert p.grad is not None, name
        assert torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, name
    assert torch.isfinite(x.grad).all()


def test_dropout_acts_in_training_only():
    dropped = make_encoder(dropout=0.5)
    plain = Encoder(3, D_MODEL, NUM_HEADS, D_FF, dropout=0.0)
    plain.load_state_dict(dropped.state_dict())
    x, _ = batch()
    dropped.eval()
    torch.testing.assert_close(dropped(x), plain.eval()(x))
    dropped.train()
    torch.manual_seed(3)
    first = dropped(x)
    torch.manual_seed(4)
    assert not torch.allclose(first, dropped(x))


def test_float64():
    encoder = make_encoder(norm_first=True).eval()
    x, tokens = batch()
    mask = padding_mask(tokens, 0)
    out64 = encoder.double()(x.double(), mask=mask)
    assert out64.dtype == torch.float64
    torch.testing.assert_close(out64.float(), encoder.float()(x, mask=mask), atol=1e-5, rtol=1e-5)


# --- bad input ------------------------------------------------------------------------------------


@pytest.mark.parametrize("num_layers", [0, -2])
def test_non_positive_num_layers(num_layers):
    with pytest.raises(ValueError, match=f"num_layers must be a positive int, got {num_layers}"):
        Encoder(num_layers, D_MODEL, NUM_HEADS, D_FF)


def test_non_integer_num_layers():
    with pytest.raises(TypeError, match="num_layers must be a positive int, got float"):
        Encoder(2.0, D_MODEL, NUM_HEADS, D_FF)


@pytest.mark.parametrize("cls", [EncoderLayer, lambda *a, **k: Encoder(2, *a, **k)])
def test_bad_constructor_arguments(cls):
    with pytest.raises(ValueError, match="d_model must be divisible by num_heads, got d_model=10"):
        cls(10, 4, D_FF)
    for dropout in (1.0, -0.1):
        with pytest.raises(ValueError, match=rf"dropout must be in \[0, 1\), got {dropout}"):
            cls(D_MODEL, NUM_HEADS, D_FF, dropout=dropout)
    with pytest.raises(ValueError, match="d_ff must be a positive int, got 0"):
        cls(D_MODEL, NUM_HEADS, 0)
    with pytest.raises(TypeError, match="norm_first must be a bool, got str"):
        cls(D_MODEL, NUM_HEADS, D_FF, norm_first="yes")


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
