"""Tests for transformer/nn/feedforward.py (chapters/feedforward.md)."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from transformer.nn.feedforward import PositionwiseFeedForward

D_MODEL, D_FF = 8, 32


def make_ffn(dropout=0.0, seed=0):
    """A module with non-zero biases (so that copying them is tested), in eval mode."""
    torch.manual_seed(seed)
    ffn = PositionwiseFeedForward(D_MODEL, D_FF, dropout=dropout).eval()
    with torch.no_grad():
        ffn.w_1.bias.normal_()
        ffn.w_2.bias.normal_()
    return ffn


def inputs(*shape, seed=1, dtype=torch.float32, requires_grad=False):
    torch.manual_seed(seed)
    return torch.randn(*shape, dtype=dtype, requires_grad=requires_grad)


def linear_copies(ffn):
    """Two fresh nn.Linear layers holding the weights of ``ffn``."""
    linear1, linear2 = nn.Linear(D_MODEL, D_FF), nn.Linear(D_FF, D_MODEL)
    linear1.load_state_dict(ffn.w_1.state_dict())
    linear2.load_state_dict(ffn.w_2.state_dict())
    return linear1, linear2


def encoder_layer_copy(ffn, dropout=0.0):
    """nn.TransformerEncoderLayer whose feed-forward block holds the weights of ``ffn``."""
    layer = nn.TransformerEncoderLayer(D_MODEL, nhead=2, dim_feedforward=D_FF, dropout=dropout, batch_first=True)
    with torch.no_grad():
        layer.linear1.weight.copy_(ffn.w_1.weight)
        layer.linear1.bias.copy_(ffn.w_1.bias)
        layer.linear2.weight.copy_(ffn.w_2.weight)
        layer.linear2.bias.copy_(ffn.w_2.bias)
    return layer


def torch_ff_block(layer, x):
    """The feed-forward block of nn.TransformerEncoderLayer: linear1 -> activation -> dropout -> linear2."""
    return layer.linear2(layer.dropout(layer.activation(layer.linear1(x))))


def formula(ffn, x):
    """max(0, x W_1 + b_1) W_2 + b_2 written out, with W = weight.T."""
    hidden = torch.clamp(x @ ffn.w_1.weight.T + ffn.w_1.bias, min=0)
    return hidden @ ffn.w_2.weight.T + ffn.w_2.bias


# --- structure and shapes --------------------------------------------------------------------


def test_layers_and_sizes():
    ffn = PositionwiseFeedForward(D_MODEL, D_FF)
    assert isinstance(ffn.w_1, nn.Linear) and isinstance(ffn.w_2, nn.Linear)
    assert ffn.w_1.weight.shape == (D_FF, D_MODEL) and ffn.w_1.bias.shape == (D_FF,)
    assert ffn.w_2.weight.shape == (D_MODEL, D_FF) and ffn.w_2.bias.shape == (D_MODEL,)
    assert (ffn.d_model, ffn.d_ff) == (D_MODEL, D_FF)
    assert {name for name, _ in ffn.named_parameters()} == {"w_1.weight", "w_1.bias", "w_2.weight", "w_2.bias"}


def test_default_d_ff_is_the_papers():
    ffn = PositionwiseFeedForward(512)
    assert ffn.d_ff == 2048
    assert ffn.w_1.out_features == 2048 and ffn.w_2.in_features == 2048
    assert ffn.dropout.p == 0.0


@pytest.mark.parametrize("shape", [(2, 5, D_MODEL), (5, D_MODEL), (D_MODEL,), (2, 3, 4, D_MODEL), (2, 0, D_MODEL)])
def test_output_shape_equals_input_shape(shape):
    ffn = make_ffn()
    x = inputs(*shape)
    out = ffn(x)
    assert out.shape == x.shape
    torch.testing.assert_close(out, formula(ffn, x))


# --- agreement with independent references ---------------------------------------------------


def test_matches_formula():
    ffn = make_ffn()
    x = inputs(3, 5, D_MODEL)
    torch.testing.assert_close(ffn(x), formula(ffn, x))


def test_matches_linear_relu_reference():
    ffn = make_ffn()
    linear1, linear2 = linear_copies(ffn)
    x = inputs(3, 5, D_MODEL)
    torch.testing.assert_close(ffn(x), linear2(F.relu(linear1(x))))


def test_matches_transformer_encoder_layer_feed_forward_block():
    ffn = make_ffn()
    layer = encoder_layer_copy(ffn).eval()
    assert layer.activation is F.relu  # the default, as in the paper
    x = inputs(3, 5, D_MODEL)
    torch.testing.assert_close(ffn(x), torch_ff_block(layer, x))


def test_gradients_match_linear_relu_reference():
    ffn = make_ffn()
    linear1, linear2 = linear_copies(ffn)
    x = inputs(3, 5, D_MODEL, requires_grad=True)
    target = inputs(3, 5, D_MODEL, seed=2)

    loss = (ffn(x) * target).sum()
    grads = torch.autograd.grad(loss, [x, ffn.w_1.weight, ffn.w_1.bias, ffn.w_2.weight, ffn.w_2.bias])
    ref_loss = (linear2(F.relu(linear1(x))) * target).sum()
    ref_grads = torch.autograd.grad(
        ref_loss, [x, linear1.weight, linear1.bias, linear2.weight, linear2.bias]
    )
    for grad, ref_grad in zip(grads, ref_grads):
        torch.testing.assert_close(grad, ref_grad)
    assert ffn.w_1.weight.grad is None  # autograd.grad does not accumulate


def test_gradients_match_transformer_encoder_layer():
    ffn = make_ffn()
    layer = encoder_layer_copy(ffn).eval()
    x = inputs(2, 4, D_MODEL, requires_grad=True)
    ffn(x).square().sum().backward()
    ours = [x.grad.clone(), ffn.w_1.weight.grad, ffn.w_1.bias.grad, ffn.w_2.weight.grad, ffn.w_2.bias.grad]
    x.grad = None
    torch_ff_block(layer, x).square().sum().backward()
    theirs = [x.grad, layer.linear1.weight.grad, layer.linear1.bias.grad, layer.linear2.weight.grad,
              layer.linear2.bias.grad]
    for grad, ref_grad in zip(ours, theirs):
        torch.testing.assert_close(grad, ref_grad)


def test_relu_zeroes_gradient_of_inactive_units():
    ffn = make_ffn()
    with torch.no_grad():
        ffn.w_1.bias[:3] = -100.0  # units 0, 1 and 2 are off at every position
    x = inputs(4, D_MODEL)
    ffn(x).sum().backward()
    inactive = (x @ ffn.w_1.weight.T + ffn.w_1.bias <= 0).all(dim=0)  # (d_ff,)
    assert inactive[:3].all() and not inactive.all()
    assert (ffn.w_1.bias.grad[inactive] == 0).all()
    assert (ffn.w_1.weight.grad[inactive] == 0).all()


@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-12), (torch.bfloat16, 5e-2), (torch.float16, 5e-3)])
def test_other_dtypes(dtype, tol):
    ffn = make_ffn()
    reference = formula(ffn.double(), inputs(2, 5, D_MODEL, dtype=torch.float64))
    ffn = ffn.to(dtype)
    out = ffn(inputs(2, 5, D_MODEL, dtype=torch.float64).to(dtype))
    assert out.dtype == dtype
    torch.testing.assert_close(out.double(), reference, rtol=tol, atol=tol)


# --- position-wise ---------------------------------------------------------------------------


def test_equals_applying_it_row_by_row():
    ffn = make_ffn()
    x = inputs(2, 6, D_MODEL)
    rows = torch.stack([torch.stack([ffn(x[b, i]) for i in range(6)]) for b in range(2)])
    torch.testing.assert_close(ffn(x), rows)


def test_changing_one_position_changes_only_its_output():
    ffn = make_ffn()
    x = inputs(2, 6, D_MODEL)
    x_changed = x.clone()
    x_changed[1, 3] += 1.0
    changed = (ffn(x_changed) != ffn(x)).any(dim=-1)  # (B, N)
    expected = torch.zeros(2, 6, dtype=torch.bool)
    expected[1, 3] = True
    assert torch.equal(changed, expected)


def test_equals_two_convolutions_with_kernel_size_1():
    ffn = make_ffn()
    conv_1 = nn.Conv1d(D_MODEL, D_FF, kernel_size=1)
    conv_2 = nn.Conv1d(D_FF, D_MODEL, kernel_size=1)
    with torch.no_grad():
        conv_1.weight.copy_(ffn.w_1.weight.unsqueeze(-1))  # (d_ff, d_model, 1)
        conv_1.bias.copy_(ffn.w_1.bias)
        conv_2.weight.copy_(ffn.w_2.weight.unsqueeze(-1))  # (d_model, d_ff, 1)
        conv_2.bias.copy_(ffn.w_2.bias)
    x = inputs(2, 6, D_MODEL)
    by_conv = conv_2(F.relu(conv_1(x.transpose(1, 2)))).transpose(1, 2)  # channels first and back
    torch.testing.assert_close(ffn(x), by_conv)


# --- dropout ---------------------------------------------------------------------------------


def test_dropout_only_in_training():
    ffn = make_ffn(dropout=0.5)
    reference = make_ffn(dropout=0.0)  # same seed: same weights
    x = inputs(2, 5, D_MODEL)
    ffn.eval()
    torch.testing.assert_close(ffn(x), reference(x))
    torch.testing.assert_close(ffn(x), ffn(x))
    ffn.train()
    torch.manual_seed(3)
    first = ffn(x)
    torch.manual_seed(4)
    second = ffn(x)
    assert not torch.allclose(first, reference(x))
    assert not torch.allclose(first, second)


def test_dropout_acts_on_the_hidden_units_as_in_torch():
    ffn = make_ffn(dropout=0.5).train()
    linear1, linear2 = linear_copies(ffn)
    layer = encoder_layer_copy(ffn, dropout=0.5).train()
    x = inputs(2, 5, D_MODEL)
    torch.manual_seed(5)
    out = ffn(x)
    torch.manual_seed(5)
    expected = linear2(F.dropout(F.relu(linear1(x)), p=0.5, training=True))
    torch.manual_seed(5)
    torch_out = torch_ff_block(layer, x)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(out, torch_out)


# --- parameters ------------------------------------------------------------------------------


@pytest.mark.parametrize("d_model, d_ff", [(D_MODEL, D_FF), (512, 2048), (3, 1)])
def test_parameter_count(d_model, d_ff):
    ffn = PositionwiseFeedForward(d_model, d_ff)
    assert sum(p.numel() for p in ffn.parameters()) == 2 * d_model * d_ff + d_ff + d_model


def test_base_model_parameter_count():
    assert sum(p.numel() for p in PositionwiseFeedForward(512, 2048).parameters()) == 2_099_712


def test_state_dict_round_trip():
    ffn = make_ffn()
    copy = PositionwiseFeedForward(D_MODEL, D_FF)
    copy.load_state_dict(ffn.state_dict())
    x = inputs(2, 5, D_MODEL)
    torch.testing.assert_close(copy.eval()(x), ffn(x))
    assert set(ffn.state_dict()) == {"w_1.weight", "w_1.bias", "w_2.weight", "w_2.bias"}


# --- bad input -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(d_model=0), ValueError, r"d_model must be a positive int, got 0"),
        (dict(d_model=-8), ValueError, r"d_model must be a positive int, got -8"),
        (dict(d_model=8.0), TypeError, r"d_model must be a positive int, got float 8.0"),
        (dict(d_model=True), TypeError, r"d_model must be a positive int, got bool True"),
        (dict(d_model=8, d_ff=0), ValueError, r"d_ff must be a positive int, got 0"),
        (dict(d_model=8, d_ff="32"), TypeError, r"d_ff must be a positive int, got str '32'"),
        (dict(d_model=8, dropout=1.0), ValueError, r"dropout must be in \[0, 1\), got 1.0"),
        (dict(d_model=8, dropout=-0.1), ValueError, r"dropout must be in \[0, 1\), got -0.1"),
        (dict(d_model=8, dropout=None), TypeError, r"dropout must be a float in \[0, 1\), got NoneType"),
    ],
)
def test_bad_constructor_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        PositionwiseFeedForward(**kwargs)


@pytest.mark.parametrize("shape", [(2, 5, D_MODEL + 1), (2, 5, 1), (D_MODEL - 1,)])
def test_wrong_feature_width(shape):
    ffn = make_ffn()
    pattern = r"x must have shape \(.*d_model=8\), got " + str(shape).replace("(", r"\(").replace(")", r"\)")
    with pytest.raises(ValueError, match=pattern):
        ffn(torch.randn(*shape))


def test_zero_dimensional_tensor():
    with pytest.raises(ValueError, match=r"x must have shape \(d_model=8\), got \(\)"):
        make_ffn()(torch.tensor(1.0))


def test_integer_tensor():
    with pytest.raises(TypeError, match=r"x must be a floating-point tensor, got dtype torch.int64"):
        make_ffn()(torch.ones(2, 5, D_MODEL, dtype=torch.long))


def test_not_a_tensor():
    with pytest.raises(TypeError, match=r"x must be a torch.Tensor, got list"):
        make_ffn()([[0.0] * D_MODEL])


@pytest.mark.parametrize("name, reference", [
    ("relu", nn.ReLU()), ("gelu", nn.GELU()), ("gelu_tanh", nn.GELU(approximate="tanh")),
    ("silu", nn.SiLU()), ("swish", nn.SiLU()),
])
def test_activation_option_equals_torch_activation_modules(name, reference):
    base = make_ffn()
    ffn = PositionwiseFeedForward(D_MODEL, D_FF, activation=name).eval()
    ffn.load_state_dict(base.state_dict())
    x = torch.randn(2, 5, D_MODEL)
    torch.testing.assert_close(ffn(x), ffn.w_2(reference(ffn.w_1(x))))
    assert PositionwiseFeedForward(D_MODEL, D_FF).activation == "relu"  # the paper by default


def test_activations_differ_from_each_other():
    base, x = make_ffn(), torch.randn(2, 5, D_MODEL)
    outputs = {}
    for name in ("relu", "gelu", "gelu_tanh", "silu"):
        ffn = PositionwiseFeedForward(D_MODEL, D_FF, activation=name).eval()
        ffn.load_state_dict(base.state_dict())
        outputs[name] = ffn(x)
    names = list(outputs)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            assert not torch.allclose(outputs[a], outputs[b]), (a, b)


def test_bad_activation_is_refused_with_its_name():
    with pytest.raises(ValueError, match=r"activation must be one of .*'relu'.*, got 'tanh'"):
        PositionwiseFeedForward(D_MODEL, D_FF, activation="tanh")
    with pytest.raises(TypeError, match="activation must be a str"):
        PositionwiseFeedForward(D_MODEL, D_FF, activation=torch.relu)


def test_activation_reaches_every_layer_of_the_models():
    from transformer import DecoderOnlyLM, LayerOptions
    from transformer.nn.model import Transformer

    model = Transformer(11, 11, d_model=8, num_heads=2, num_layers=2, d_ff=16, options=LayerOptions(activation="silu"))
    lm = DecoderOnlyLM(11, d_model=8, num_heads=2, d_ff=16, num_layers=2,
                       options=LayerOptions(norm_first=True, activation="gelu_tanh"))
    ffns = [m for m in model.modules() if isinstance(m, PositionwiseFeedForward)]
    assert len(ffns) == 4 and all(f.activation == "silu" for f in ffns)
    assert all(m.activation == "gelu_tanh" for m in lm.modules() if isinstance(m, PositionwiseFeedForward))


def test_input_of_another_dtype_is_named():
    """A float32 network given float64 or bfloat16 input: a TypeError naming x and both dtypes."""
    ffn = PositionwiseFeedForward(D_MODEL, D_FF)
    for dtype in (torch.float64, torch.bfloat16):
        with pytest.raises(TypeError, match=rf"x must have the dtype of the module's parameters, torch.float32, got {dtype}"):
            ffn(inputs(2, 5, D_MODEL, dtype=dtype))
    with torch.autocast("cpu", dtype=torch.bfloat16):  # under autocast the two differ by design
        assert ffn(inputs(2, 5, D_MODEL).to(torch.bfloat16)).shape == (2, 5, D_MODEL)
