"""Tests for transformer/nn/attention.py (chapters/attention.md).

The references are torch.nn.functional.scaled_dot_product_attention (with the mask
inverted: it reads True as "may attend") and the formula softmax(Q K^T / sqrt(d_k)) V
written out below.
"""

import math

import pytest
import torch
import torch.nn.functional as F

import transformer
from transformer.nn.attention import causal_mask, check_attention_mask, padding_mask, scaled_dot_product_attention

PAD = 0


def randn(*shape, dtype=torch.float32, seed=0, requires_grad=False):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype)
    return x.requires_grad_(requires_grad)


def qkv(q_shape, k_shape, v_shape, dtype=torch.float32, requires_grad=False):
    return (
        randn(*q_shape, dtype=dtype, seed=1, requires_grad=requires_grad),
        randn(*k_shape, dtype=dtype, seed=2, requires_grad=requires_grad),
        randn(*v_shape, dtype=dtype, seed=3, requires_grad=requires_grad),
    )


def torch_sdpa(query, key, value, mask=None):
    """PyTorch's attention, with this package's mask convention (True = may not attend)."""
    return F.scaled_dot_product_attention(query, key, value, attn_mask=None if mask is None else ~mask)


def formula_weights(query, key, mask=None):
    """softmax(Q K^T / sqrt(d_k)) written out, masked entries set to -inf (no fully masked rows)."""
    scores = torch.matmul(query, key.transpose(-2, -1)) / math.sqrt(query.shape[-1])
    if mask is not None:
        scores = torch.where(mask, torch.tensor(float("-inf"), dtype=scores.dtype), scores)
    exp = torch.exp(scores - scores.amax(dim=-1, keepdim=True))
    return exp / exp.sum(dim=-1, keepdim=True)


def re_shape(shape):
    """A shape as a regular expression: (2, 4) -> \\(2, 4\\)."""
    return "\\(" + ", ".join(map(str, shape)) + "\\)"


def random_mask(shape, seed=0):
    """A random bool mask in which every row may attend to at least its first key."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(shape, generator=g) < 0.4
    mask[..., 0] = False
    return mask


TOKENS = torch.tensor([[5, 7, 2, 9, 4, 3], [8, 6, 3, PAD, PAD, PAD]])  # (B, N) = (2, 6)

# (query shape, key shape, value shape, mask or None)
CASES = {
    "3d": ((2, 4, 8), (2, 6, 8), (2, 6, 3), None),
    "3d-causal": ((2, 5, 8), (2, 5, 8), (2, 5, 3), causal_mask(5)),
    "3d-random-mask": ((2, 4, 8), (2, 6, 8), (2, 6, 5), random_mask((2, 4, 6))),
    "4d": ((2, 3, 4, 8), (2, 3, 6, 8), (2, 3, 6, 5), None),
    "4d-padding": ((2, 3, 4, 8), (2, 3, 6, 8), (2, 3, 6, 5), padding_mask(TOKENS, PAD)),
    "4d-causal-padding": (
        (2, 3, 6, 8), (2, 3, 6, 8), (2, 3, 6, 5), padding_mask(TOKENS, PAD) | causal_mask(6)
    ),
    "4d-random-mask": ((2, 3, 5, 4), (2, 3, 7, 4), (2, 3, 7, 6), random_mask((2, 1, 5, 7), seed=1)),
    "2d": ((4, 8), (6, 8), (6, 3), random_mask((4, 6), seed=2)),
    "broadcast-batch": ((2, 1, 4, 8), (1, 3, 6, 8), (2, 3, 6, 5), causal_mask(6)[:4]),
}


# ---------------------------------------------------------------- against the references


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_matches_torch_sdpa(case):
    q_shape, k_shape, v_shape, mask = case
    query, key, value = qkv(q_shape, k_shape, v_shape)
    output, weights = scaled_dot_product_attention(query, key, value, mask)
    torch.testing.assert_close(output, torch_sdpa(query, key, value, mask))


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_shapes(case):
    q_shape, k_shape, v_shape, mask = case
    query, key, value = qkv(q_shape, k_shape, v_shape)
    output, weights = scaled_dot_product_attention(query, key, value, mask)
    batch = torch.broadcast_shapes(q_shape[:-2], k_shape[:-2], v_shape[:-2])
    assert output.shape == (*batch, q_shape[-2], v_shape[-1])
    assert weights.shape[-2:] == (q_shape[-2], k_shape[-2])
    assert output.dtype == weights.dtype == query.dtype


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_weights_match_formula(case):
    q_shape, k_shape, v_shape, mask = case
    query, key, value = qkv(q_shape, k_shape, v_shape)
    output, weights = scaled_dot_product_attention(query, key, value, mask)
    expected = formula_weights(query, key, mask)
    torch.testing.assert_close(weights, expected)
    torch.testing.assert_close(output, torch.matmul(expected, value))
    torch.testing.assert_close(weights.sum(dim=-1), torch.ones(weights.shape[:-1]))
    if mask is not None:
        assert (weights[mask.expand_as(weights)] == 0).all()


@pytest.mark.parametrize("mask_name", ["none", "causal", "padding", "fully-masked-rows"])
def test_gradcheck_float64(mask_name):
    query, key, value = qkv((2, 2, 4, 3), (2, 2, 4, 3), (2, 2, 4, 2), torch.float64, requires_grad=True)
    mask = {
        "none": None,
        "causal": causal_mask(4),
        "padding": padding_mask(torch.tensor([[1, 2, 3, 4], [1, 2, PAD, PAD]]), PAD),
        "fully-masked-rows": (  # left padding + causal: rows 0 and 1 of sequence 1 see nothing
            padding_mask(torch.tensor([[1, 2, 3, 4], [PAD, PAD, 3, 4]]), PAD) | causal_mask(4)
        ),
    }[mask_name]
    assert torch.autograd.gradcheck(
        lambda q, k, v: scaled_dot_product_attention(q, k, v, mask), (query, key, value)
    )


@pytest.mark.parametrize("mask", [None, causal_mask(5), random_mask((2, 1, 5, 5), seed=3)])
def test_gradients_match_torch_sdpa(mask):
    ours = qkv((2, 3, 5, 4), (2, 3, 5, 4), (2, 3, 5, 6), torch.float64, requires_grad=True)
    theirs = qkv((2, 3, 5, 4), (2, 3, 5, 4), (2, 3, 5, 6), torch.float64, requires_grad=True)
    upstream = randn(2, 3, 5, 6, dtype=torch.float64, seed=9)
    (scaled_dot_product_attention(*ours, mask)[0] * upstream).sum().backward()
    (torch_sdpa(*theirs, mask) * upstream).sum().backward()
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a.grad, b.grad)


def test_package_reexports_the_api():
    assert transformer.scaled_dot_product_attention is scaled_dot_product_attention
    assert transformer.causal_mask is causal_mask
    assert transformer.padding_mask is padding_mask
    assert transformer.nn.check_attention_mask is check_attention_mask  # the rest from the subpackage


# ---------------------------------------------------------------- masks


def test_fully_masked_rows_give_zeros_and_finite_gradients():
    query, key, value = qkv((2, 2, 5, 4), (2, 2, 5, 4), (2, 2, 5, 3), requires_grad=True)
    tokens = torch.tensor([[PAD, PAD, 4, 7, 2], [3, 4, 5, 6, 7]])  # left padding
    mask = padding_mask(tokens, PAD) | causal_mask(5)  # rows 0 and 1 of sequence 0: nothing to attend to
    output, weights = scaled_dot_product_attention(query, key, value, mask)

    assert torch.equal(output[0, :, :2], torch.zeros(2, 2, 3))
    assert torch.equal(weights[0, :, :2], torch.zeros(2, 2, 5))
    assert output.isfinite().all() and weights.isfinite().all()
    torch.testing.assert_close(weights[0, :, 2:].sum(dim=-1), torch.ones(2, 3))
    torch.testing.assert_close(output, torch_sdpa(query, key, value, mask))

    (output * randn(*output.shape, seed=5)).sum().backward()
    for tensor in (query, key, value):
        assert tensor.grad.isfinite().all()
    assert torch.equal(query.grad[0, :, :2], torch.zeros(2, 2, 4))  # those queries took nothing


def test_every_row_masked():
    query, key, value = qkv((1, 3, 4), (1, 3, 4), (1, 3, 2), requires_grad=True)
    mask = torch.ones(3, 3, dtype=torch.bool)
    output, weights = scaled_dot_product_attention(query, key, value, mask)
    assert torch.equal(output, torch.zeros(1, 3, 2)) and torch.equal(weights, torch.zeros(1, 3, 3))
    output.sum().backward()
    assert all(torch.equal(t.grad, torch.zeros_like(t)) for t in (query, key, value))


def test_changing_a_masked_key_or_value_leaves_the_output_unchanged():
    query, key, value = qkv((2, 3, 6, 4), (2, 3, 6, 4), (2, 3, 6, 5))
    mask = padding_mask(TOKENS, PAD)
    output, _ = scaled_dot_product_attention(query, key, value, mask)
    key2, value2 = key.clone(), value.clone()
    key2[1, :, 3:] = 1000 * randn(3, 3, 4, seed=7)  # the padding keys of sequence 1
    value2[1, :, 3:] = 1000 * randn(3, 3, 5, seed=8)
    output2, _ = scaled_dot_product_attention(query, key2, value2, mask)
    torch.testing.assert_close(output2, output, rtol=0, atol=0)


def test_changing_a_future_token_leaves_earlier_outputs_unchanged():
    query, key, value = qkv((2, 6, 4), (2, 6, 4), (2, 6, 3))
    output, _ = scaled_dot_product_attention(query, key, value, causal_mask(6))
    query2, key2, value2 = query.clone(), key.clone(), value.clone()
    for t in (query2, key2, value2):
        t[:, 4:] = 50 * randn(2, 2, t.shape[-1], seed=11)  # change positions 4 and 5
    output2, _ = scaled_dot_product_attention(query2, key2, value2, causal_mask(6))
    torch.testing.assert_close(output2[:, :4], output[:, :4], rtol=0, atol=0)
    assert not torch.allclose(output2[:, 4:], output[:, 4:])


@pytest.mark.parametrize("size", [1, 2, 5, 9])
def test_causal_mask_definition(size):
    mask = causal_mask(size)
    assert mask.dtype == torch.bool and mask.shape == (size, size)
    for i in range(size):
        for j in range(size):
            assert mask[i, j].item() == (j > i)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8])
def test_padding_mask_definition(dtype):
    tokens = torch.tensor([[3, 1, 4, 1, 5], [9, 2, 6, 0, 0], [0, 0, 7, 1, 8]], dtype=dtype)
    mask = padding_mask(tokens, 0)
    assert mask.dtype == torch.bool and mask.shape == (3, 1, 1, 5)
    for b in range(3):
        for n in range(5):
            assert mask[b, 0, 0, n].item() == (tokens[b, n].item() == 0)
    assert torch.equal(padding_mask(tokens, 1)[0, 0, 0], torch.tensor([False, True, False, True, False]))


def test_masks_are_made_on_the_requested_device():
    # The meta device stands in for an accelerator: no tensor may silently land on the CPU.
    assert causal_mask(4, device="meta").device.type == "meta"
    tokens = torch.zeros(2, 5, dtype=torch.long, device="meta")
    assert padding_mask(tokens, PAD).device.type == "meta"
    query = torch.empty(2, 3, 5, 8, device="meta")
    mask = padding_mask(tokens, PAD) | causal_mask(5, device="meta")
    output, weights = scaled_dot_product_attention(query, query, query, mask, dropout_p=0.1)
    assert output.device.type == weights.device.type == "meta"
    assert output.shape == (2, 3, 5, 8) and weights.shape == (2, 3, 5, 5)


def test_check_attention_mask_passes_valid_masks_through():
    assert check_attention_mask(None, (2, 3, 4, 5)) is None
    for mask in [torch.zeros(5, dtype=torch.bool), causal_mask(4)[:, :1].expand(4, 5),
                 torch.zeros(2, 1, 1, 5, dtype=torch.bool), torch.zeros(2, 3, 4, 5, dtype=torch.bool)]:
        assert check_attention_mask(mask, (2, 3, 4, 5)) is mask


# ---------------------------------------------------------------- dropout


def test_dropout_zero_is_deterministic():
    query, key, value = qkv((2, 4, 8), (2, 6, 8), (2, 6, 3))
    first = scaled_dot_product_attention(query, key, value, dropout_p=0.0)
    second = scaled_dot_product_attention(query, key, value, dropout_p=0.0)
    plain = scaled_dot_product_attention(query, key, value)
    for a, b, c in zip(first, second, plain):
        assert torch.equal(a, b) and torch.equal(a, c)


def test_dropout_zeroes_weights_and_preserves_their_expectation():
    query, key, value = qkv((1, 4, 8), (1, 6, 8), (1, 6, 3))
    _, clean = scaled_dot_product_attention(query, key, value)
    torch.manual_seed(0)
    # 3000 copies of the same batch in one call: 3000 independent draws of the dropout mask
    _, draws = scaled_dot_product_attention(query.expand(3000, 4, 8), key, value, dropout_p=0.3)
    assert abs((draws == 0).float().mean().item() - 0.3) < 0.02  # about 30% dropped
    kept = draws != 0
    torch.testing.assert_close(draws[kept], (clean.expand_as(draws) / 0.7)[kept])  # inverted dropout
    average = draws.mean(dim=0, keepdim=True)  # (1, 4, 6)
    torch.testing.assert_close(average, clean, atol=0.03, rtol=0)  # expectation preserved


def test_dropout_output_uses_returned_weights_and_is_seeded():
    query, key, value = qkv((2, 3, 5, 4), (2, 3, 5, 4), (2, 3, 5, 6))
    mask = causal_mask(5)
    torch.manual_seed(123)
    output, weights = scaled_dot_product_attention(query, key, value, mask, dropout_p=0.5)
    torch.manual_seed(123)
    output_again, weights_again = scaled_dot_product_attention(query, key, value, mask, dropout_p=0.5)
    assert torch.equal(output, output_again) and torch.equal(weights, weights_again)
    torch.testing.assert_close(output, weights @ value)
    assert (weights == 0).any()
    assert (weights[mask.expand_as(weights)] == 0).all()  # masked entries stay zero


# ---------------------------------------------------------------- dtypes


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_with_masks_is_finite(dtype):
    query, key, value = qkv((2, 2, 5, 8), (2, 2, 5, 8), (2, 2, 5, 4))
    tokens = torch.tensor([[PAD, PAD, 4, 7, 2], [3, 4, 5, PAD, PAD]])
    mask = padding_mask(tokens, PAD) | causal_mask(5)
    output, weights = scaled_dot_product_attention(query.to(dtype), key.to(dtype), value.to(dtype), mask)
    assert output.dtype == weights.dtype == dtype
    assert output.isfinite().all() and weights.isfinite().all()
    assert (output[0, :, :2] == 0).all()
    expected, _ = scaled_dot_product_attention(query, key, value, mask)
    torch.testing.assert_close(output.float(), expected, atol=3e-2, rtol=3e-2)


def test_float64():
    query, key, value = qkv((2, 4, 8), (2, 6, 8), (2, 6, 3), torch.float64)
    output, weights = scaled_dot_product_attention(query, key, value)
    assert output.dtype == weights.dtype == torch.float64
    torch.testing.assert_close(output, torch_sdpa(query, key, value))


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize("name", ["query", "key", "value"])
def test_non_tensor_input(name):
    args = dict(zip(["query", "key", "value"], qkv((2, 4, 8), (2, 6, 8), (2, 6, 3))))
    args[name] = args[name].tolist()
    with pytest.raises(TypeError, match=f"{name} must be a torch.Tensor, got list"):
        scaled_dot_product_attention(**args)


def test_integer_input():
    query, key, value = qkv((2, 4, 8), (2, 6, 8), (2, 6, 3))
    with pytest.raises(TypeError, match="query must be a floating-point tensor, got dtype torch.int64"):
        scaled_dot_product_attention(query.long(), key, value)


def test_dtype_mismatch():
    query, key, value = qkv((2, 4, 8), (2, 6, 8), (2, 6, 3))
    message = "value must have the dtype of query, torch.float32, got torch.float64"
    with pytest.raises(TypeError, match=message):
        scaled_dot_product_attention(query, key, value.double())


def test_too_few_dimensions():
    with pytest.raises(ValueError, match=r"query must have shape \(\.\.\., length, features\), got \(8,\)"):
        scaled_dot_product_attention(torch.randn(8), torch.randn(6, 8), torch.randn(6, 3))


def test_query_key_feature_mismatch():
    message = r"key must have shape \(\.\.\., S, d_k=8\) .*\(2, 4, 8\), got \(2, 6, 7\)"
    with pytest.raises(ValueError, match=message):
        scaled_dot_product_attention(torch.randn(2, 4, 8), torch.randn(2, 6, 7), torch.randn(2, 6, 3))


def test_key_value_length_mismatch():
    message = r"value must have shape \(\.\.\., S=6, d_v\) .*\(2, 6, 8\), got \(2, 5, 3\)"
    with pytest.raises(ValueError, match=message):
        scaled_dot_product_attention(torch.randn(2, 4, 8), torch.randn(2, 6, 8), torch.randn(2, 5, 3))


@pytest.mark.parametrize(
    "shapes",
    [
        ((2, 4, 8), (3, 6, 8), (3, 6, 3)),  # query and key
        ((2, 4, 8), (2, 6, 8), (3, 6, 3)),  # value
        ((2, 3, 4, 8), (2, 2, 6, 8), (2, 2, 6, 3)),  # the head dimension
    ],
)
def test_batch_dimensions_that_do_not_broadcast(shapes):
    query, key, value = qkv(*shapes)
    with pytest.raises(ValueError, match=r"leading dimensions, got query \(.*\), key \(.*\), value \(.*\)"):
        scaled_dot_product_attention(query, key, value)


@pytest.mark.parametrize("p", [1.0, -0.1, 1.5])
def test_dropout_out_of_range(p):
    query, key, value = qkv((2, 4, 8), (2, 6, 8), (2, 6, 3))
    with pytest.raises(ValueError, match=rf"dropout_p must be in \[0, 1\), got {p}"):
        scaled_dot_product_attention(query, key, value, dropout_p=p)


def test_dropout_not_a_number():
    query, key, value = qkv((2, 4, 8), (2, 6, 8), (2, 6, 3))
    with pytest.raises(TypeError, match="dropout_p must be a float"):
        scaled_dot_product_attention(query, key, value, dropout_p="0.1")


@pytest.mark.parametrize(
    "mask_shape",
    [(4, 4), (6, 4), (3, 4, 6), (2, 1, 4, 6), (2, 4, 7)],  # (2, 1, 4, 6) would grow the 3-D scores
)
def test_mask_that_does_not_broadcast(mask_shape):
    query, key, value = qkv((2, 4, 8), (2, 6, 8), (2, 6, 3))
    mask = torch.zeros(mask_shape, dtype=torch.bool)
    pattern = rf"mask must broadcast .*\(2, 4, 6\), got shape {re_shape(mask_shape)}"
    with pytest.raises(ValueError, match=pattern):
        scaled_dot_product_attention(query, key, value, mask)
    with pytest.raises(ValueError, match=pattern):
        check_attention_mask(mask, (2, 4, 6))


@pytest.mark.parametrize(
    "mask",
    [
        torch.zeros(4, 6),
        torch.zeros(4, 6, dtype=torch.long),
        torch.full((4, 6), float("-inf")),
        [[False] * 6] * 4,
    ],
    ids=["float", "long", "additive", "list"],
)
def test_mask_that_is_not_boolean(mask):
    query, key, value = qkv((2, 4, 8), (2, 6, 8), (2, 6, 3))
    with pytest.raises(TypeError, match="mask must be a bool tensor"):
        scaled_dot_product_attention(query, key, value, mask)
    with pytest.raises(TypeError, match="mask must be a bool tensor"):
        check_attention_mask(mask, (2, 4, 6))


@pytest.mark.parametrize("size", [0, -3])
def test_causal_mask_non_positive_size(size):
    with pytest.raises(ValueError, match=f"size must be a positive int, got {size}"):
        causal_mask(size)


def test_causal_mask_non_int_size():
    with pytest.raises(TypeError, match="size must be a positive int"):
        causal_mask(4.0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bool])
def test_padding_mask_non_integer_tokens(dtype):
    with pytest.raises(TypeError, match=rf"tokens must hold integer token ids .*got dtype {dtype}"):
        padding_mask(TOKENS.to(dtype), PAD)


def test_padding_mask_other_bad_input():
    with pytest.raises(TypeError, match="tokens must be a torch.Tensor"):
        padding_mask([[1, 2, 0]], PAD)
    with pytest.raises(ValueError, match=r"tokens must have shape \(B, S\), got \(6,\)"):
        padding_mask(TOKENS[0], PAD)
    with pytest.raises(TypeError, match="pad_id must be an int"):
        padding_mask(TOKENS, 0.0)


def test_padding_mask_accepts_a_numpy_integer_pad_id():
    import numpy as np

    assert torch.equal(padding_mask(TOKENS, np.int64(PAD)), padding_mask(TOKENS, PAD))
