"""Tests for transformer/nn/residual.py (chapters/add_and_norm.md)."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from transformer.nn.multihead import MultiHeadAttention
from transformer.nn.residual import LayerNorm, add_and_norm

D_MODEL = 8


def make_pair(d_model=D_MODEL, eps=1e-5, dtype=torch.float32, seed=0):
    """Our LayerNorm with random weight and bias, and nn.LayerNorm with the same parameters."""
    torch.manual_seed(seed)
    ours = LayerNorm(d_model, eps=eps).to(dtype)
    with torch.no_grad():
        ours.weight.normal_()
        ours.bias.normal_()
    theirs = nn.LayerNorm(d_model, eps=eps).to(dtype)
    with torch.no_grad():
        theirs.weight.copy_(ours.weight)
        theirs.bias.copy_(ours.bias)
    return ours, theirs


def assert_same_values_and_grads(ours, theirs, x):
    """Outputs, and gradients of input, weight and bias, agree for one random upstream gradient."""
    x_ours = x.clone().requires_grad_(True)
    x_theirs = x.clone().requires_grad_(True)
    out_ours, out_theirs = ours(x_ours), theirs(x_theirs)
    assert out_ours.dtype == out_theirs.dtype == x.dtype
    torch.testing.assert_close(out_ours, out_theirs)
    upstream = torch.randn_like(out_ours)
    grads_ours = torch.autograd.grad(out_ours, (x_ours, ours.weight, ours.bias), upstream)
    grads_theirs = torch.autograd.grad(out_theirs, (x_theirs, theirs.weight, theirs.bias), upstream)
    for g_ours, g_theirs in zip(grads_ours, grads_theirs):
        torch.testing.assert_close(g_ours, g_theirs)


def layer_norm_formula(x, weight, bias, eps=1e-5, correction=0):
    """g * (x - mean) / sqrt(var + eps) + b, written out; correction=1 is Bessel's variance."""
    d = x.shape[-1]
    mean = x.sum(-1, keepdim=True) / d
    var = ((x - mean) ** 2).sum(-1, keepdim=True) / (d - correction)
    return weight * (x - mean) / torch.sqrt(var + eps) + bias


# --- LayerNorm against nn.LayerNorm ---------------------------------------------------------


def test_init_and_parameters_match_torch_layout():
    norm = LayerNorm(D_MODEL)
    torch.testing.assert_close(norm.weight.detach(), torch.ones(D_MODEL))
    torch.testing.assert_close(norm.bias.detach(), torch.zeros(D_MODEL))
    assert [name for name, _ in norm.named_parameters()] == ["weight", "bias"]
    assert norm.eps == 1e-5 and norm.d_model == D_MODEL
    # state_dicts are interchangeable with nn.LayerNorm's
    reference = nn.LayerNorm(D_MODEL)
    assert norm.state_dict().keys() == reference.state_dict().keys()
    norm.load_state_dict(reference.state_dict())


@pytest.mark.parametrize("shape", [(D_MODEL,), (3, D_MODEL), (2, 5, D_MODEL), (2, 3, 4, D_MODEL)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_matches_nn_layernorm_values_and_grads(shape, dtype):
    ours, theirs = make_pair(dtype=dtype)
    torch.manual_seed(1)
    x = (3 * torch.randn(shape) + 1).to(dtype)
    assert_same_values_and_grads(ours, theirs, x)


@pytest.mark.parametrize("d_model", [2, 3, 16])
def test_matches_nn_layernorm_other_widths(d_model):
    ours, theirs = make_pair(d_model=d_model)
    torch.manual_seed(2)
    assert_same_values_and_grads(ours, theirs, torch.randn(2, 4, d_model))


def test_width_one_gives_the_bias():
    ours, theirs = make_pair(d_model=1)
    x = torch.randn(2, 4, 1)
    torch.testing.assert_close(ours(x), ours.bias.detach().expand(2, 4, 1))
    torch.testing.assert_close(ours(x), theirs(x))


def test_eps_is_used_like_torch():
    ours, theirs = make_pair(eps=0.1)
    torch.manual_seed(3)
    x = 0.2 * torch.randn(2, 5, D_MODEL)  # variance comparable to eps, so eps matters
    assert_same_values_and_grads(ours, theirs, x)
    plain = LayerNorm(D_MODEL, eps=1e-5)
    plain.load_state_dict(ours.state_dict())
    assert not torch.allclose(plain(x), ours(x), atol=1e-3)


def test_matches_formula_in_float64():
    ours, _ = make_pair(dtype=torch.float64)
    torch.manual_seed(4)
    x = torch.randn(3, 6, D_MODEL, dtype=torch.float64)
    expected = layer_norm_formula(x, ours.weight, ours.bias)
    torch.testing.assert_close(ours(x), expected)


def test_constant_rows_are_finite_and_equal_bias():
    ours, theirs = make_pair()
    x = torch.stack([torch.full((D_MODEL,), 5.0), torch.zeros(D_MODEL), torch.randn(D_MODEL)])
    x.requires_grad_(True)
    out = ours(x)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out[:2], ours.bias.detach().expand(2, D_MODEL))
    torch.testing.assert_close(out, theirs(x))
    out.square().sum().backward()
    assert torch.isfinite(x.grad).all()
    assert torch.isfinite(ours.weight.grad).all() and torch.isfinite(ours.bias.grad).all()


def test_large_magnitude_inputs():
    ours, theirs = make_pair()
    torch.manual_seed(5)
    x = 1e3 * torch.randn(2, 5, D_MODEL) + 1e4  # large offset and spread, float32
    out = ours(x)
    assert torch.isfinite(out).all()
    # reference: the formula in float64
    expected = layer_norm_formula(x.double(), ours.weight.double(), ours.bias.double())
    torch.testing.assert_close(out.double(), expected, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(out, theirs(x), atol=1e-4, rtol=1e-4)


def test_output_rows_are_standardised_by_default():
    norm = LayerNorm(D_MODEL)
    torch.manual_seed(6)
    y = norm(4 * torch.randn(3, 7, D_MODEL) - 2)
    torch.testing.assert_close(y.mean(-1), torch.zeros(3, 7), atol=1e-5, rtol=0)
    torch.testing.assert_close(y.var(-1, correction=0), torch.ones(3, 7), atol=1e-3, rtol=0)


def test_biased_variance_differs_from_bessel_corrected():
    norm = LayerNorm(D_MODEL)
    torch.manual_seed(7)
    x = torch.randn(4, D_MODEL)
    biased = layer_norm_formula(x, norm.weight, norm.bias, correction=0)
    bessel = layer_norm_formula(x, norm.weight, norm.bias, correction=1)
    torch.testing.assert_close(norm(x), biased)
    assert not torch.allclose(norm(x), bessel, atol=1e-2)
    # the Bessel version shrinks each standardised row by sqrt((d - 1) / d)
    ratio = bessel.std(-1, correction=0) / biased.std(-1, correction=0)
    torch.testing.assert_close(ratio, torch.full((4,), math.sqrt((D_MODEL - 1) / D_MODEL)),
                               atol=1e-4, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_keeps_dtype_and_is_close(dtype):
    ours, _ = make_pair()
    torch.manual_seed(8)
    x = torch.randn(2, 5, D_MODEL)
    out = ours(x.to(dtype))
    assert out.dtype == dtype
    torch.testing.assert_close(out.float(), ours(x.to(dtype).float()), atol=3e-2, rtol=3e-2)


def test_half_precision_module_matches_float32():
    ours, _ = make_pair()
    half = LayerNorm(D_MODEL).bfloat16()
    half.load_state_dict(ours.state_dict())
    torch.manual_seed(9)
    x = torch.randn(2, 5, D_MODEL).bfloat16()
    out = half(x)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), ours(x.float()), atol=5e-2, rtol=5e-2)


# --- add_and_norm against the two formulas ---------------------------------------------------


def make_sublayer(seed=10):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(D_MODEL, 16), nn.ReLU(), nn.Linear(16, D_MODEL))


def make_norm(seed=11):
    torch.manual_seed(seed)
    norm = nn.LayerNorm(D_MODEL)
    with torch.no_grad():
        norm.weight.normal_()
        norm.bias.normal_()
    return norm


def test_post_ln_matches_formula():
    sublayer, norm = make_sublayer(), make_norm()
    torch.manual_seed(12)
    x = torch.randn(2, 5, D_MODEL)
    out = add_and_norm(x, sublayer, norm, nn.Dropout(0.0), norm_first=False)
    torch.testing.assert_close(out, norm(x + sublayer(x)))


def test_pre_ln_matches_formula():
    sublayer, norm = make_sublayer(), make_norm()
    torch.manual_seed(12)
    x = torch.randn(2, 5, D_MODEL)
    out = add_and_norm(x, sublayer, norm, nn.Dropout(0.0), norm_first=True)
    torch.testing.assert_close(out, x + sublayer(norm(x)))


@pytest.mark.parametrize("norm_first", [False, True])
def test_gradients_match_formula(norm_first):
    sublayer, norm = make_sublayer(), make_norm()
    torch.manual_seed(13)
    x = torch.randn(2, 5, D_MODEL)
    params = [x.requires_grad_(True), *sublayer.parameters(), *norm.parameters()]

    def formula(y):
        return y + sublayer(norm(y)) if norm_first else norm(y + sublayer(y))

    out = add_and_norm(x, sublayer, norm, nn.Identity(), norm_first=norm_first)
    upstream = torch.randn_like(out)
    grads = torch.autograd.grad(out, params, upstream)
    expected = torch.autograd.grad(formula(x), params, upstream)
    for g, e in zip(grads, expected):
        torch.testing.assert_close(g, e)


@pytest.mark.parametrize("norm_first", [False, True])
def test_with_attention_sublayer_and_our_layernorm(norm_first):
    torch.manual_seed(14)
    attn = MultiHeadAttention(D_MODEL, num_heads=2)
    norm = LayerNorm(D_MODEL)
    x = torch.randn(2, 5, D_MODEL)
    mask = torch.ones(5, 5, dtype=torch.bool).triu(1)
    out = add_and_norm(x, lambda y: attn(y, y, y, mask=mask), norm, nn.Dropout(0.0), norm_first)
    if norm_first:
        h = norm(x)
        expected = x + attn(h, h, h, mask=mask)
    else:
        expected = norm(x + attn(x, x, x, mask=mask))
    torch.testing.assert_close(out, expected)


@pytest.mark.parametrize("norm_first", [False, True])
def test_dropout_only_in_training(norm_first):
    sublayer, norm = make_sublayer(), make_norm()
    dropout = nn.Dropout(0.5)
    torch.manual_seed(15)
    x = torch.randn(2, 5, D_MODEL)

    def formula(drop):
        return x + drop(sublayer(norm(x))) if norm_first else norm(x + drop(sublayer(x)))

    dropout.eval()
    evaluated = add_and_norm(x, sublayer, norm, dropout, norm_first)
    torch.testing.assert_close(evaluated, formula(lambda t: t))

    dropout.train()
    torch.manual_seed(16)
    trained = add_and_norm(x, sublayer, norm, dropout, norm_first)
    torch.manual_seed(16)
    expected = formula(lambda t: F.dropout(t, p=0.5, training=True))
    torch.testing.assert_close(trained, expected)
    assert not torch.allclose(trained, evaluated)


def test_dropout_never_touches_the_residual_path():
    # pre-LN with a sublayer that returns zeros: whatever dropout does, the output is x itself
    x = torch.randn(2, 5, D_MODEL)
    out = add_and_norm(x, torch.zeros_like, LayerNorm(D_MODEL), nn.Dropout(0.9).train(), True)
    torch.testing.assert_close(out, x)


def test_works_on_any_leading_shape():
    sublayer, norm = make_sublayer(), make_norm()
    x = torch.randn(3, D_MODEL)
    out = add_and_norm(x, sublayer, norm, nn.Identity(), norm_first=False)
    torch.testing.assert_close(out, norm(x + sublayer(x)))


# --- bad input -------------------------------------------------------------------------------


@pytest.mark.parametrize("d_model", [0, -4])
def test_layernorm_rejects_non_positive_d_model(d_model):
    with pytest.raises(ValueError, match=rf"d_model must be a positive int, got {d_model}"):
        LayerNorm(d_model)


@pytest.mark.parametrize("d_model", [2.0, "8", True, None])
def test_layernorm_rejects_non_integer_d_model(d_model):
    with pytest.raises(TypeError, match="d_model must be a positive int"):
        LayerNorm(d_model)


@pytest.mark.parametrize("eps", [0.0, -1e-5, float("nan"), float("inf")])
def test_layernorm_rejects_bad_eps_value(eps):
    with pytest.raises(ValueError, match="eps must be a positive finite float"):
        LayerNorm(D_MODEL, eps=eps)


@pytest.mark.parametrize("eps", ["1e-5", None, True, torch.tensor(1e-5)])
def test_layernorm_rejects_eps_that_is_not_a_number(eps):
    with pytest.raises(TypeError, match="eps must be a positive float"):
        LayerNorm(D_MODEL, eps=eps)


def test_layernorm_rejects_wrong_last_dimension():
    with pytest.raises(ValueError, match=r"x must have shape \(\.\.\., \.\.\., d_model=8\), got \(2, 5, 7\)"):
        LayerNorm(D_MODEL)(torch.randn(2, 5, 7))
    with pytest.raises(ValueError, match=r"d_model=8\), got \(\)"):
        LayerNorm(D_MODEL)(torch.tensor(1.0))


def test_layernorm_rejects_non_float_and_non_tensor_input():
    with pytest.raises(TypeError, match="x must be a floating-point tensor, got dtype torch.int64"):
        LayerNorm(D_MODEL)(torch.ones(2, D_MODEL, dtype=torch.long))
    with pytest.raises(TypeError, match="x must be a torch.Tensor, got list"):
        LayerNorm(D_MODEL)([[0.0] * D_MODEL])


@pytest.mark.parametrize("norm_first", [False, True])
def test_add_and_norm_rejects_shape_changing_sublayer(norm_first):
    x = torch.randn(2, 5, D_MODEL)
    with pytest.raises(ValueError, match=r"sublayer output must have the shape of x, \(2, 5, 8\), got \(2, 5, 4\)"):
        add_and_norm(x, nn.Linear(D_MODEL, 4), LayerNorm(D_MODEL), nn.Identity(), norm_first)


def test_add_and_norm_rejects_broadcasting_sublayer_output():
    x = torch.randn(2, 5, D_MODEL)
    with pytest.raises(ValueError, match=r"got \(1, 5, 8\)"):
        add_and_norm(x, lambda y: y[:1], LayerNorm(D_MODEL), nn.Identity(), norm_first=False)


def test_add_and_norm_rejects_sublayer_returning_a_tuple():
    attn = MultiHeadAttention(D_MODEL, num_heads=2)
    x = torch.randn(2, 5, D_MODEL)
    with pytest.raises(TypeError, match="sublayer must return a torch.Tensor, got tuple"):
        add_and_norm(x, lambda y: attn(y, y, y, need_weights=True), LayerNorm(D_MODEL),
                     nn.Identity(), norm_first=False)


def test_add_and_norm_rejects_bad_arguments():
    x = torch.randn(2, 5, D_MODEL)
    norm, sublayer = LayerNorm(D_MODEL), nn.Identity()
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        add_and_norm(x.tolist(), sublayer, norm, nn.Identity(), False)
    with pytest.raises(TypeError, match="sublayer must be callable, got int"):
        add_and_norm(x, 3, norm, nn.Identity(), False)
    with pytest.raises(TypeError, match="norm must be callable"):
        add_and_norm(x, sublayer, None, nn.Identity(), False)
    with pytest.raises(TypeError, match="dropout must be callable, got float"):
        add_and_norm(x, sublayer, norm, 0.1, False)
    with pytest.raises(TypeError, match="norm_first must be a bool, got str"):
        add_and_norm(x, sublayer, norm, nn.Identity(), "pre")
