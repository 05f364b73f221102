"""Tests for transformer.nn.positional: the sinusoidal table and the two positional-encoding layers."""

import math

import pytest
import torch
from torch import nn

from transformer.nn.model import Transformer
from transformer.nn.positional import LearnedPositionalEncoding, SinusoidalPositionalEncoding, sinusoidal_encoding


def _formula_table(num_positions, d_model, base=10000.0):
    """The paper's table written out with math.sin/math.cos, in Python floats (double precision)."""
    rows = []
    for pos in range(num_positions):
        row = []
        for i in range(d_model // 2):
            angle = pos / base ** (2 * i / d_model)
            row += [math.sin(angle), math.cos(angle)]
        rows.append(row)
    return torch.tensor(rows, dtype=torch.float64)


def _formula_rotation(k, d_model, base=10000.0):
    """M_k: block-diagonal 2x2 rotations with PE[pos + k] = PE[pos] @ M_k (row vectors)."""
    m = torch.zeros(d_model, d_model, dtype=torch.float64)
    for i in range(d_model // 2):
        b = k / base ** (2 * i / d_model)
        # [sin a, cos a] @ [[cos b, -sin b], [sin b, cos b]] = [sin(a + b), cos(a + b)]
        m[2 * i, 2 * i] = math.cos(b)
        m[2 * i, 2 * i + 1] = -math.sin(b)
        m[2 * i + 1, 2 * i] = math.sin(b)
        m[2 * i + 1, 2 * i + 1] = math.cos(b)
    return m


def _x(shape, seed=0, dtype=torch.float32):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


# sinusoidal_encoding --------------------------------------------------------------------------


@pytest.mark.parametrize("num_positions, d_model", [(1, 2), (7, 4), (50, 16), (20, 6)])
def test_sinusoidal_encoding_matches_formula(num_positions, d_model):
    table = sinusoidal_encoding(num_positions, d_model)
    assert table.shape == (num_positions, d_model)
    torch.testing.assert_close(table.double(), _formula_table(num_positions, d_model), atol=1e-6, rtol=0)


def test_sinusoidal_encoding_first_row_and_columns():
    table = sinusoidal_encoding(10, 8)
    # Position 0: sin 0 = 0 in the even columns, cos 0 = 1 in the odd ones.
    assert (table[0, 0::2] == 0).all()
    assert (table[0, 1::2] == 1).all()
    # Column 0 has frequency 1: sin(pos).
    for pos in range(10):
        assert math.isclose(table[pos, 0].item(), math.sin(pos), abs_tol=1e-6)
        assert math.isclose(table[pos, 1].item(), math.cos(pos), abs_tol=1e-6)


@pytest.mark.parametrize("base", [100.0, 2.0, 1e6, 500])
def test_sinusoidal_encoding_honours_base(base):
    table = sinusoidal_encoding(30, 8, base=base)
    torch.testing.assert_close(table.double(), _formula_table(30, 8, base=base), atol=1e-6, rtol=0)
    if base != 10000.0:
        assert not torch.allclose(table, sinusoidal_encoding(30, 8))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_sinusoidal_encoding_dtype_follows_default_dtype(dtype):
    previous = torch.get_default_dtype()
    try:
        torch.set_default_dtype(dtype)
        table = sinusoidal_encoding(12, 8)
    finally:
        torch.set_default_dtype(previous)
    assert table.dtype == dtype
    tol = 1e-12 if dtype == torch.float64 else 1e-6
    torch.testing.assert_close(table.double(), _formula_table(12, 8), atol=tol, rtol=0)


@pytest.mark.parametrize("k", [1, 3, 17])
def test_sinusoidal_encoding_relative_position_is_a_rotation(k):
    d_model = 16
    table = sinusoidal_encoding(60, d_model).double()
    m_k = _formula_rotation(k, d_model)
    for pos in [0, 5, 20, 42]:
        torch.testing.assert_close(table[pos + k], table[pos] @ m_k, atol=1e-6, rtol=0)
    # And for all positions at once.
    torch.testing.assert_close(table[k:], table[:-k] @ m_k, atol=1e-6, rtol=0)


def test_sinusoidal_encoding_row_norm_is_sqrt_half_d_model():
    for d_model in [2, 8, 64]:
        norms = sinusoidal_encoding(200, d_model).norm(dim=1)
        torch.testing.assert_close(norms, torch.full((200,), math.sqrt(d_model / 2)))


def test_sinusoidal_encoding_large_positions_are_accurate():
    d_model = 64
    table = sinusoidal_encoding(5000, d_model)
    pos = 4999
    expected = []
    for c in range(d_model):
        angle = pos / 10000.0 ** (2 * (c // 2) / d_model)  # Python floats: double precision
        expected.append(math.sin(angle) if c % 2 == 0 else math.cos(angle))
    expected = torch.tensor(expected, dtype=torch.float64)
    torch.testing.assert_close(table[pos].double(), expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("d_model", [1, 7, 33])
def test_sinusoidal_encoding_rejects_odd_d_model(d_model):
    with pytest.raises(ValueError, match=rf"d_model must be even .*got {d_model}"):
        sinusoidal_encoding(10, d_model)


@pytest.mark.parametrize("args, err, pattern", [
    ((0, 8), ValueError, r"num_positions must be a positive int, got 0"),
    ((-5, 8), ValueError, r"num_positions must be a positive int, got -5"),
    ((10, 0), ValueError, r"d_model must be a positive int, got 0"),
    ((10.0, 8), TypeError, r"num_positions must be a positive int, got float 10.0"),
    ((10, 8.0), TypeError, r"d_model must be a positive int, got float 8.0"),
    ((True, 8), TypeError, r"num_positions must be a positive int, got bool True"),
])
def test_sinusoidal_encoding_rejects_bad_sizes(args, err, pattern):
    with pytest.raises(err, match=pattern):
        sinusoidal_encoding(*args)


@pytest.mark.parametrize("base, type_name", [("10000", "str"), (None, "NoneType"), (True, "bool")])
def test_sinusoidal_encoding_rejects_base_of_wrong_type(base, type_name):
    with pytest.raises(TypeError, match=rf"base must be a number, got {type_name}"):
        sinusoidal_encoding(10, 8, base=base)


@pytest.mark.parametrize("base", [1.0, 0.5, 0, -10.0])
def test_sinusoidal_encoding_rejects_base_not_above_one(base):
    with pytest.raises(ValueError, match=rf"base must be a number greater than 1, got {base!r}"):
        sinusoidal_encoding(10, 8, base=base)


# SinusoidalPositionalEncoding ----------------------------------------------------------------


def test_sinusoidal_layer_eval_output_is_x_plus_table():
    layer = SinusoidalPositionalEncoding(d_model=8, max_len=32).eval()
    x = _x((3, 10, 8))
    out = layer(x)
    assert out.shape == x.shape
    torch.testing.assert_close(out, x + _formula_table(10, 8).float(), atol=1e-6, rtol=0)


def test_sinusoidal_layer_table_is_non_persistent_buffer():
    layer = SinusoidalPositionalEncoding(d_model=8, max_len=20)
    assert "table" in dict(layer.named_buffers())
    assert list(layer.parameters()) == []
    assert len(layer.state_dict()) == 0
    # Loading an empty state dict is strict-compatible.
    layer.load_state_dict({}, strict=True)
    assert layer.table.shape == (20, 8)
    torch.testing.assert_close(layer.table, sinusoidal_encoding(20, 8))


def test_sinusoidal_layer_moves_with_dtype_and_device():
    layer = SinusoidalPositionalEncoding(d_model=8, max_len=16).double()
    assert layer.table.dtype == torch.float64
    torch.testing.assert_close(layer.table, _formula_table(16, 8), atol=1e-6, rtol=0)
    x = _x((2, 5, 8), dtype=torch.float64)
    out = layer(x)
    assert out.dtype == torch.float64
    torch.testing.assert_close(out, x + layer.table[:5])
    # The buffer follows .to(device) too (the meta device stands in for a GPU here).
    assert layer.to("meta").table.device.type == "meta"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_sinusoidal_layer_output_dtype_follows_input(dtype):
    layer = SinusoidalPositionalEncoding(d_model=8, max_len=16).eval()
    x = _x((2, 6, 8)).to(dtype)
    out = layer(x)
    assert out.dtype == dtype
    expected = x.double() + _formula_table(6, 8)
    tol = 1e-6 if dtype in (torch.float32, torch.float64) else 2e-2
    torch.testing.assert_close(out.double(), expected, atol=tol, rtol=tol)


def test_sinusoidal_layer_dropout_in_train_mode():
    torch.manual_seed(0)
    p = 0.5
    layer = SinusoidalPositionalEncoding(d_model=16, max_len=64, dropout=p).train()
    x = _x((4, 32, 16))
    out = layer(x)
    summed = x + sinusoidal_encoding(32, 16)
    assert (summed != 0).all()  # so that a zero in the output can only come from dropout
    kept = out != 0
    assert 0 < kept.sum() < kept.numel()
    fraction_dropped = 1 - kept.float().mean().item()
    assert abs(fraction_dropped - p) < 0.05  # 2048 entries
    expected = torch.where(kept, summed / (1 - p), torch.zeros_like(summed))
    torch.testing.assert_close(out, expected)


def test_sinusoidal_layer_eval_mode_is_deterministic():
    layer = SinusoidalPositionalEncoding(d_model=8, max_len=16, dropout=0.5).eval()
    x = _x((2, 7, 8))
    first, second = layer(x), layer(x)
    torch.testing.assert_close(first, second, rtol=0, atol=0)
    torch.testing.assert_close(first, x + sinusoidal_encoding(7, 8))


def test_sinusoidal_layer_n_equal_to_max_len_works_and_one_more_raises():
    layer = SinusoidalPositionalEncoding(d_model=4, max_len=9)
    out = layer(_x((1, 9, 4)))
    assert out.shape == (1, 9, 4)
    with pytest.raises(ValueError, match=r"x has sequence length 10, longer than max_len=9"):
        layer(_x((1, 10, 4)))


def test_sinusoidal_layer_gradient_flows_to_x():
    layer = SinusoidalPositionalEncoding(d_model=8, max_len=16)
    x = _x((2, 5, 8)).requires_grad_()
    upstream = _x((2, 5, 8), seed=3)
    (layer(x) * upstream).sum().backward()
    torch.testing.assert_close(x.grad, upstream)


def test_sinusoidal_layer_broadcasts_over_batch():
    layer = SinusoidalPositionalEncoding(d_model=8, max_len=16)
    x = torch.zeros(3, 6, 8)
    out = layer(x)
    for b in range(3):
        torch.testing.assert_close(out[b], sinusoidal_encoding(6, 8))


# LearnedPositionalEncoding -------------------------------------------------------------------


def test_learned_layer_table_is_trainable_parameter_in_state_dict():
    layer = LearnedPositionalEncoding(d_model=6, max_len=12)
    assert isinstance(layer.table, nn.Parameter)
    assert layer.table.requires_grad
    assert layer.table.shape == (12, 6)
    assert dict(layer.named_parameters()).keys() == {"table"}
    assert list(layer.state_dict()) == ["table"]
    assert "table" not in dict(layer.named_buffers())


def test_the_two_position_layers_take_their_arguments_in_one_order():
    # (d_model, max_len): one positional call builds either layer, with a table of the same shape
    for layer in (SinusoidalPositionalEncoding(6, 12), LearnedPositionalEncoding(6, 12)):
        assert layer.table.shape == (12, 6) and (layer.d_model, layer.max_len) == (6, 12)
        assert repr(layer).splitlines()[1].strip() == "d_model=6, max_len=12"


def test_learned_layer_output_is_x_plus_table():
    torch.manual_seed(0)
    layer = LearnedPositionalEncoding(d_model=6, max_len=12)
    x = _x((2, 7, 6))
    out = layer(x)
    assert out.shape == x.shape
    expected = x.clone()
    for b in range(2):
        for n in range(7):
            expected[b, n] += layer.table.detach()[n]
    torch.testing.assert_close(out, expected)


def test_learned_layer_accepts_odd_d_model_and_n_equal_to_max_len():
    layer = LearnedPositionalEncoding(d_model=7, max_len=5)
    assert layer(_x((2, 5, 7))).shape == (2, 5, 7)
    with pytest.raises(ValueError, match=r"x has sequence length 6, longer than max_len=5"):
        layer(_x((2, 6, 7)))


def test_learned_layer_gradient_reaches_rows_below_n_only():
    torch.manual_seed(0)
    layer = LearnedPositionalEncoding(d_model=4, max_len=10)
    x = _x((3, 6, 4)).requires_grad_()
    upstream = _x((3, 6, 4), seed=5)
    (layer(x) * upstream).sum().backward()
    torch.testing.assert_close(layer.table.grad[:6], upstream.sum(dim=0))
    assert (layer.table.grad[6:] == 0).all()
    torch.testing.assert_close(x.grad, upstream)


def test_learned_layer_init_std():
    torch.manual_seed(0)
    layer = LearnedPositionalEncoding(d_model=64, max_len=1000)  # 64,000 entries
    table = layer.table.detach()
    assert abs(table.mean().item()) < 0.001
    assert abs(table.std().item() - 0.02) < 0.001


def test_learned_layer_float64_and_dtype_follow_input():
    layer = LearnedPositionalEncoding(d_model=4, max_len=8).double()
    assert layer.table.dtype == torch.float64
    x = _x((2, 3, 4), dtype=torch.float64)
    torch.testing.assert_close(layer(x), x + layer.table.detach()[:3])
    half = LearnedPositionalEncoding(d_model=4, max_len=8)
    assert half(_x((2, 3, 4)).to(torch.bfloat16)).dtype == torch.bfloat16


def test_learned_layer_dropout_in_train_mode():
    torch.manual_seed(0)
    p = 0.25
    layer = LearnedPositionalEncoding(d_model=16, max_len=40, dropout=p).train()
    x = _x((4, 32, 16))
    out = layer(x)
    summed = x + layer.table.detach()[:32]
    assert (summed != 0).all()
    kept = out != 0
    assert 0 < kept.sum() < kept.numel()
    expected = torch.where(kept, summed / (1 - p), torch.zeros_like(summed))
    torch.testing.assert_close(out, expected)
    layer.eval()
    torch.testing.assert_close(layer(x), summed)


# Bad input for both layers --------------------------------------------------------------------


def _sinusoidal(**kw):
    return SinusoidalPositionalEncoding(**{"d_model": 8, "max_len": 16, **kw})


def _learned(**kw):
    return LearnedPositionalEncoding(**{"max_len": 16, "d_model": 8, **kw})


LAYERS = [_sinusoidal, _learned]


@pytest.mark.parametrize("make", LAYERS)
@pytest.mark.parametrize("name, value", [("d_model", 0), ("d_model", -2), ("max_len", 0), ("max_len", -1)])
def test_layers_reject_non_positive_sizes(make, name, value):
    with pytest.raises(ValueError, match=rf"{name} must be a positive int, got {value}"):
        make(**{name: value})


@pytest.mark.parametrize("make", LAYERS)
@pytest.mark.parametrize("name, value, shown", [
    ("d_model", 8.0, "float 8.0"),
    ("max_len", 16.0, "float 16.0"),
    ("d_model", True, "bool True"),
    ("max_len", True, "bool True"),
])
def test_layers_reject_non_int_sizes(make, name, value, shown):
    with pytest.raises(TypeError, match=rf"{name} must be a positive int, got {shown}"):
        make(**{name: value})


def test_sinusoidal_layer_rejects_odd_d_model():
    with pytest.raises(ValueError, match=r"d_model must be even .*got 7"):
        SinusoidalPositionalEncoding(d_model=7, max_len=16)


@pytest.mark.parametrize("make", LAYERS)
@pytest.mark.parametrize("p", [1.0, -0.1, 1.5])
def test_layers_reject_dropout_outside_unit_interval(make, p):
    with pytest.raises(ValueError, match=rf"dropout must be in \[0, 1\), got {p}"):
        make(dropout=p)


@pytest.mark.parametrize("make", LAYERS)
def test_layers_reject_bool_dropout(make):
    with pytest.raises(TypeError, match=r"dropout must be a float in \[0, 1\), got bool True"):
        make(dropout=True)


@pytest.mark.parametrize("make", LAYERS)
def test_layers_reject_wrong_last_dim(make):
    with pytest.raises(ValueError, match=r"x must have shape \(\.\.\., \.\.\., d_model=8\), got \(2, 3, 5\)"):
        make()(torch.zeros(2, 3, 5))


@pytest.mark.parametrize("make", LAYERS)
@pytest.mark.parametrize("shape", [(3, 8), (8,), (1, 2, 3, 8)])
def test_layers_reject_non_3d_input(make, shape):
    shown = str(tuple(shape)).replace("(", r"\(").replace(")", r"\)")
    with pytest.raises(ValueError, match=rf"x must have shape \(\.\.\., \.\.\., d_model=8\), got {shown}"):
        make()(torch.zeros(shape))


@pytest.mark.parametrize("make", LAYERS)
def test_layers_reject_non_tensor_input(make):
    with pytest.raises(TypeError, match=r"x must be a torch.Tensor, got list"):
        make()([[[0.0] * 8]])


@pytest.mark.parametrize("make", LAYERS)
def test_layers_reject_integer_input(make):
    with pytest.raises(TypeError, match=r"x must be a floating-point tensor, got dtype torch.int64"):
        make()(torch.zeros(2, 3, 8, dtype=torch.long))


@pytest.mark.parametrize("make", LAYERS)
def test_layers_reject_sequence_longer_than_max_len(make):
    with pytest.raises(ValueError, match=r"x has sequence length 17, longer than max_len=16"):
        make()(torch.zeros(1, 17, 8))


# --- sizes against memory (issue 47) ------------------------------------------------------------

@pytest.mark.parametrize("make", [lambda: SinusoidalPositionalEncoding(d_model=64, max_len=10**12),
                                  lambda: LearnedPositionalEncoding(d_model=64, max_len=10**12)])
def test_a_table_larger_than_the_machine_is_refused_in_one_line_naming_max_len(make):
    # 256 TB: more than any machine's memory, and refused before torch tries to allocate it
    with pytest.raises(ValueError, match=r"max_len=1,000,000,000,000 is too large: its \(max_len, d_model\) table "
                                         r"alone would take 238,418.6 GiB, and this machine has [\d,.]+ GiB"):
        make()


def test_a_transformer_with_a_huge_max_len_is_refused_as_the_command_refuses_it():
    with pytest.raises(ValueError, match="max_len=1,000,000,000,000 is too large"):
        Transformer(50, 50, d_model=16, num_heads=2, num_layers=1, d_ff=32, max_len=10**12)
