"""Tests for transformer.checks: the argument checks shared by the package."""

import re

import numpy as np
import pytest
import torch

from transformer.checks import (check_bool, check_fraction, check_features, check_non_negative_int,
    check_positive_int, check_tensor, check_token_tensor)


# check_positive_int -----------------------------------------------------------------------------


@pytest.mark.parametrize("value", [1, 2, 512, 10**12])
def test_check_positive_int_accepts_and_returns(value):
    assert check_positive_int("d_model", value) is value


@pytest.mark.parametrize("value", [np.int64(8), np.int32(3), np.uint8(2)])
def test_check_positive_int_accepts_numpy_integers_as_int(value):
    out = check_positive_int("d_model", value)
    assert type(out) is int and out == int(value)


def test_check_positive_int_rejects_non_positive_numpy_integer():
    with pytest.raises(ValueError, match="d_model must be a positive int, got 0"):
        check_positive_int("d_model", np.int64(0))



@pytest.mark.parametrize("value", [0, 3, np.int64(0), np.uint8(2)])
def test_check_non_negative_int_accepts_zero_and_integers_as_int(value):
    out = check_non_negative_int("start", value)
    assert type(out) is int and out == int(value)


@pytest.mark.parametrize("value, error, message", [
    (-1, ValueError, r"radius must be a non-negative int, got -1$"),
    (True, TypeError, "radius must be a non-negative int, got bool True"),
    (2.0, TypeError, "radius must be a non-negative int, got float 2.0"),
])
def test_check_non_negative_int_rejects_by_name(value, error, message):
    with pytest.raises(error, match=message):
        check_non_negative_int("radius", value)

def test_check_fraction_accepts_numpy_float():
    out = check_fraction("dropout", np.float32(0.25))
    assert type(out) is float and out == 0.25


@pytest.mark.parametrize("value", [True, False])
def test_check_positive_int_rejects_bool(value):
    with pytest.raises(TypeError, match=rf"d_model must be a positive int, got bool {value}"):
        check_positive_int("d_model", value)


@pytest.mark.parametrize("value", [8.0, 2.5])
def test_check_positive_int_rejects_float(value):
    with pytest.raises(TypeError, match=rf"max_len must be a positive int, got float {value}"):
        check_positive_int("max_len", value)


@pytest.mark.parametrize("value", ["8", None, torch.tensor(8)])
def test_check_positive_int_rejects_other_types(value):
    with pytest.raises(TypeError, match=rf"vocab_size must be a positive int, got {type(value).__name__}"):
        check_positive_int("vocab_size", value)


@pytest.mark.parametrize("value", [0, -1, -100])
def test_check_positive_int_rejects_non_positive(value):
    with pytest.raises(ValueError, match=rf"num_heads must be a positive int, got {value}$"):
        check_positive_int("num_heads", value)


# check_fraction --------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [0.0, 0.1, 0.5, 0.999])
def test_check_fraction_accepts_and_returns(value):
    out = check_fraction("dropout", value)
    assert type(out) is float
    assert out == value


def test_check_fraction_accepts_int_zero_as_float():
    out = check_fraction("dropout", 0)
    assert type(out) is float and out == 0.0


@pytest.mark.parametrize("value", [1.0, 1, 1.5, -0.1, -1.0, float("nan"), float("inf")])
def test_check_fraction_rejects_outside_unit_interval(value):
    with pytest.raises(ValueError, match=rf"dropout must be in \[0, 1\), got {value}"):
        check_fraction("dropout", value)


@pytest.mark.parametrize("value", [True, False])
def test_check_fraction_rejects_bool(value):
    with pytest.raises(TypeError, match=rf"attn_dropout must be a float in \[0, 1\), got bool {value}"):
        check_fraction("attn_dropout", value)


@pytest.mark.parametrize("value", ["0.1", None, torch.tensor(0.1)])
def test_check_fraction_rejects_non_numbers(value):
    with pytest.raises(TypeError, match=rf"dropout must be a float in \[0, 1\), got {type(value).__name__}"):
        check_fraction("dropout", value)


# check_tensor ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [torch.zeros(2, 3), torch.tensor(1), torch.arange(4), torch.zeros(0), torch.ones(2, dtype=torch.bool)],
)
def test_check_tensor_accepts_and_returns(value):
    assert check_tensor("x", value) is value


@pytest.mark.parametrize("value, type_name", [([1.0, 2.0], "list"), (3.0, "float"), (None, "NoneType")])
def test_check_tensor_rejects_non_tensor(value, type_name):
    with pytest.raises(TypeError, match=rf"mask must be a torch.Tensor, got {type_name}$"):
        check_tensor("mask", value)


def test_check_tensor_rejects_numpy_array():
    with pytest.raises(TypeError, match="x must be a torch.Tensor, got ndarray"):
        check_tensor("x", np.zeros((2, 3)))


# check_features -------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_check_features_accepts_float_dtypes_and_returns(dtype):
    x = torch.zeros(2, 3, 8, dtype=dtype)
    assert check_features("x", x, 8) is x


def test_check_features_other_ndim():
    x2 = torch.zeros(5, 4)
    x4 = torch.zeros(2, 3, 5, 4)
    assert check_features("q", x2, 4, ndim=2) is x2
    assert check_features("q", x4, 4, ndim=4) is x4
    with pytest.raises(ValueError, match=r"q must have shape \(\.\.\., d_model=4\), got \(2, 3, 5, 4\)"):
        check_features("q", x4, 4, ndim=2)


def test_check_features_accepts_empty_batch_and_sequence():
    x = torch.zeros(0, 0, 8)
    assert check_features("x", x, 8) is x


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8, torch.bool])
def test_check_features_rejects_non_float_tensor(dtype):
    x = torch.zeros(2, 3, 8, dtype=dtype)
    with pytest.raises(TypeError, match=rf"x must be a floating-point tensor, got dtype {dtype}"):
        check_features("x", x, 8)


def test_check_features_rejects_non_tensor():
    with pytest.raises(TypeError, match="x must be a torch.Tensor, got list"):
        check_features("x", [[[0.0] * 8]], 8)


@pytest.mark.parametrize("shape", [(3, 8), (8,), (1, 2, 3, 8)])
def test_check_features_rejects_wrong_ndim(shape):
    pattern = re.escape(f"x must have shape (..., ..., d_model=8), got {tuple(shape)}")
    with pytest.raises(ValueError, match=pattern):
        check_features("x", torch.zeros(shape), 8)


def test_check_features_rejects_wrong_last_dim():
    with pytest.raises(ValueError, match=r"memory must have shape \(\.\.\., \.\.\., d_model=16\), got \(2, 3, 15\)"):
        check_features("memory", torch.zeros(2, 3, 15), 16)


# check_token_tensor / check_bool ------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8])
def test_check_token_tensor_accepts_integer_tensors(dtype):
    tokens = torch.tensor([[1, 2]], dtype=dtype)
    assert check_token_tensor("src", tokens) is tokens


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bool, torch.complex64])
def test_check_token_tensor_rejects_other_dtypes(dtype):
    with pytest.raises(TypeError, match=rf"src must hold integer token ids .*got dtype {dtype}"):
        check_token_tensor("src", torch.zeros(1, 2, dtype=dtype))


def test_check_token_tensor_rejects_non_tensors():
    with pytest.raises(TypeError, match="tgt must be a torch.Tensor of token ids, got list"):
        check_token_tensor("tgt", [[1, 2]])


@pytest.mark.parametrize("value", [True, False])
def test_check_bool_accepts_and_returns(value):
    assert check_bool("norm_first", value) is value


@pytest.mark.parametrize("value, type_name", [(1, "int"), ("yes", "str"), (None, "NoneType")])
def test_check_bool_rejects_other_types(value, type_name):
    with pytest.raises(TypeError, match=rf"norm_first must be a bool, got {type_name}"):
        check_bool("norm_first", value)


def test_check_length_checks_a_plain_int_as_check_positive_int_does():
    from transformer.checks import check_length

    assert check_length("size", 3) == 3
    with pytest.raises(ValueError, match="size must be a positive int, got 0"):
        check_length("size", 0)
    with pytest.raises(TypeError, match="size must be a positive int, got bool True"):
        check_length("size", True)
    # a captured length (torch.compile's SymInt, torch.jit.trace's tensor): tests/test_graph_capture.py
