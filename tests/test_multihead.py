"""Tests for transformer/nn/multihead.py (chapters/multihead_attention.md)."""

import math
import re

import pytest
import torch
from torch import nn

from transformer.nn.attention import causal_mask, padding_mask
from transformer.nn.cache import KVCache
from transformer.nn.multihead import MultiHeadAttention

D_MODEL, NUM_HEADS = 8, 2


def make_mha(bias=True, seed=0, **kwargs):
    """A module in eval mode whose biases (if any) are non-zero, so that copying them is tested."""
    torch.manual_seed(seed)
    mha = MultiHeadAttention(D_MODEL, NUM_HEADS, bias=bias, **kwargs).eval()
    if bias:
        with torch.no_grad():
            for linear in (mha.w_q, mha.w_k, mha.w_v, mha.w_o):
                linear.bias.normal_()
    return mha


def to_torch(mha):
    """nn.MultiheadAttention with the weights of ``mha`` (in_proj stacks W_q, W_k, W_v)."""
    has_bias = mha.w_q.bias is not None
    ref = nn.MultiheadAttention(mha.d_model, mha.num_heads, bias=has_bias, batch_first=True)
    with torch.no_grad():
        ref.in_proj_weight.copy_(torch.cat([mha.w_q.weight, mha.w_k.weight, mha.w_v.weight]))
        ref.out_proj.weight.copy_(mha.w_o.weight)
        if has_bias:
            ref.in_proj_bias.copy_(torch.cat([mha.w_q.bias, mha.w_k.bias, mha.w_v.bias]))
            ref.out_proj.bias.copy_(mha.w_o.bias)
    return ref.eval()


def inputs(*shapes, seed=1, requires_grad=False):
    torch.manual_seed(seed)
    return [torch.randn(*shape, requires_grad=requires_grad) for shape in shapes]


def reference_loop(mha, query, key, value, mask=None):
    """Eq. (1) of the chapter, written out: a Python loop over heads, biases included."""
    d_k = mha.d_model // mha.num_heads
    q_all, k_all, v_all = mha.w_q(query), mha.w_k(key), mha.w_v(value)
    heads = []
    for i in range(mha.num_heads):
        block = slice(i * d_k, (i + 1) * d_k)
        scores = q_all[..., block] @ k_all[..., block].transpose(-2, -1) / d_k**0.5  # (B, L, S)
        if mask is not None:
            scores = scores.masked_fill(mask, float("-inf"))
        heads.append(torch.softmax(scores, dim=-1) @ v_all[..., block])  # (B, L, d_k)
    return mha.w_o(torch.cat(heads, dim=-1))


# --- shapes and the paper's equation -------------------------------------------------------


def test_output_shapes_self_and_cross():
    mha = make_mha()
    query, memory = inputs((3, 4, D_MODEL), (3, 7, D_MODEL))
    out = mha(query, memory, memory)
    assert isinstance(out, torch.Tensor)
    assert out.shape == (3, 4, D_MODEL)
    out, weights = mha(query, memory, memory, need_weights=True)
    assert out.shape == (3, 4, D_MODEL)
    assert weights.shape == (3, NUM_HEADS, 4, 7)
    torch.testing.assert_close(weights.sum(-1), torch.ones(3, NUM_HEADS, 4))


@pytest.mark.parametrize("need_weights", [True, False])
def test_matches_per_head_loop(need_weights):
    mha = make_mha()
    (x,) = inputs((2, 5, D_MODEL))
    mask = causal_mask(5)
    out = mha(x, x, x, mask=mask, need_weights=need_weights)
    out = out[0] if need_weights else out
    torch.testing.assert_close(out, reference_loop(mha, x, x, x, mask=mask))


def test_projections_and_init():
    mha = MultiHeadAttention(16, 4)
    bound = (6 / (16 + 16)) ** 0.5  # Xavier-uniform for a (16, 16) weight
    for linear in (mha.w_q, mha.w_k, mha.w_v, mha.w_o):
        assert isinstance(linear, nn.Linear)
        assert linear.weight.shape == (16, 16)
        assert linear.weight.abs().max() <= bound
        assert torch.count_nonzero(linear.bias) == 0
    no_bias = MultiHeadAttention(16, 4, bias=False)
    assert all(m.bias is None for m in (no_bias.w_q, no_bias.w_k, no_bias.w_v, no_bias.w_o))


def test_parameter_count_equals_one_full_width_head():
    def count(module):
        return sum(p.numel() for p in module.parameters())

    assert count(MultiHeadAttention(64, 8, bias=False)) == 4 * 64 * 64
    assert count(MultiHeadAttention(64, 8)) == count(MultiHeadAttention(64, 1))


# --- agreement with torch.nn.MultiheadAttention ---------------------------------------------


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("need_weights", [True, False])
def test_self_attention_causal_matches_torch(bias, need_weights):
    mha = make_mha(bias=bias)
    ref = to_torch(mha)
    (x,) = inputs((2, 5, D_MODEL))
    mask = causal_mask(5)
    ref_out, ref_weights = ref(x, x, x, attn_mask=mask, average_attn_weights=False)
    result = mha(x, x, x, mask=mask, need_weights=need_weights)
    if need_weights:
        out, weights = result
        torch.testing.assert_close(weights, ref_weights)
    else:
        out = result
    torch.testing.assert_close(out, ref_out)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("need_weights", [True, False])
def test_cross_attention_key_padding_matches_torch(bias, need_weights):
    mha = make_mha(bias=bias)
    ref = to_torch(mha)
    target, memory = inputs((2, 3, D_MODEL), (2, 6, D_MODEL))  # L = 3 != S = 6
    source = torch.tensor([[4, 5, 6, 0, 0, 0], [4, 5, 6, 7, 8, 0]])
    ref_out, ref_weights = ref(
        target, memory, memory, key_padding_mask=source == 0, average_attn_weights=False
    )
    result = mha(target, memory, memory, mask=padding_mask(source, 0), need_weights=need_weights)
    if need_weights:
        out, weights = result
        assert weights.shape == (2, NUM_HEADS, 3, 6)
        torch.testing.assert_close(weights, ref_weights)
    else:
        out = result
    torch.testing.assert_close(out, ref_out)


@pytest.mark.parametrize("need_weights", [True, False])
def test_gradients_match_torch(need_weights):
    mha = make_mha()
    ref = to_torch(mha)
    target, memory = inputs((2, 3, D_MODEL), (2, 6, D_MODEL), requires_grad=True)
    source = torch.tensor([[4, 5, 6, 0, 0, 0], [4, 5, 6, 7, 8, 0]])
    out = mha(target, memory, memory, mask=padding_mask(source, 0), need_weights=need_weights)
    out = out[0] if need_weights else out
    ref_out, _ = ref(target, memory, memory, key_padding_mask=source == 0, need_weights=False)
    grad_out = torch.randn_like(out)

    params = [mha.w_q.weight, mha.w_k.weight, mha.w_v.weight, mha.w_o.weight,
              mha.w_q.bias, mha.w_k.bias, mha.w_v.bias, mha.w_o.bias]
    grads = torch.autograd.grad(out, [target, memory] + params, grad_out)
    ref_params = [ref.in_proj_weight, ref.out_proj.weight, ref.in_proj_bias, ref.out_proj.bias]
    ref_grads = torch.autograd.grad(ref_out, [target, memory] + ref_params, grad_out)

    torch.testing.assert_close(grads[0], ref_grads[0])  # query input
    torch.testing.assert_close(grads[1], ref_grads[1])  # key and value input
    torch.testing.assert_close(torch.cat(grads[2:5]), ref_grads[2])  # in_proj_weight
    torch.testing.assert_close(grads[5], ref_grads[3])  # out_proj.weight
    torch.testing.assert_close(torch.cat(grads[6:9]), ref_grads[4])  # in_proj_bias
    torch.testing.assert_close(grads[9], ref_grads[5])  # out_proj.bias


# --- the fast path --------------------------------------------------------------------------


def _both_paths(mha, query, key, value, mask):
    explicit, _ = mha(query, key, value, mask=mask, need_weights=True)
    fused = mha(query, key, value, mask=mask, need_weights=False)
    return explicit, fused


@pytest.mark.parametrize("mask_kind", ["none", "causal", "padding", "both"])
def test_fast_path_equals_explicit_values_and_grads(mask_kind):
    mha = make_mha()
    (x,) = inputs((2, 5, D_MODEL), requires_grad=True)
    tokens = torch.tensor([[1, 2, 3, 4, 0], [1, 2, 0, 0, 0]])
    masks = {
        "none": None,
        "causal": causal_mask(5),
        "padding": padding_mask(tokens, 0),
        "both": causal_mask(5) | padding_mask(tokens, 0),
    }
    explicit, fused = _both_paths(mha, x, x, x, masks[mask_kind])
    torch.testing.assert_close(fused, explicit)
    grad_out = torch.randn_like(explicit)
    params = list(mha.parameters())
    grads_explicit = torch.autograd.grad(explicit, [x] + params, grad_out)
    grads_fused = torch.autograd.grad(fused, [x] + params, grad_out)
    for g_fused, g_explicit in zip(grads_fused, grads_explicit):
        torch.testing.assert_close(g_fused, g_explicit)


@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-7), (torch.float16, 5e-3), (torch.bfloat16, 4e-2)])
def test_other_dtypes_both_paths(dtype, tol):
    mha = make_mha()
    (x,) = inputs((2, 5, D_MODEL))
    mask = causal_mask(5)
    expected = reference_loop(mha.double(), x.double(), x.double(), x.double(), mask=mask)
    mha, x = mha.to(dtype), x.to(dtype)
    explicit, fused = _both_paths(mha, x, x, x, mask)
    assert explicit.dtype == fused.dtype == dtype
    for result in (explicit, fused):
        torch.testing.assert_close(result.double(), expected, atol=tol, rtol=tol)


def test_fully_masked_rows_give_zeros_in_both_paths():
    mha = make_mha(bias=False)  # without biases a zero head output gives a zero row out of W^O
    (x,) = inputs((2, 5, D_MODEL), requires_grad=True)
    tokens = torch.tensor([[1, 2, 3, 4, 5], [0, 0, 3, 4, 5]])  # left padding
    mask = causal_mask(5) | padding_mask(tokens, 0)  # batch 1, queries 0 and 1: nothing to see
    explicit, fused = _both_paths(mha, x, x, x, mask)
    out, weights = mha(x, x, x, mask=mask, need_weights=True)
    for result in (explicit, fused):
        assert torch.isfinite(result).all()
        assert (result[1, :2] == 0).all()
        assert result[1, 2:].abs().sum() > 0
        (grad,) = torch.autograd.grad(result.square().sum(), x)
        assert torch.isfinite(grad).all()
    assert (weights[1, :, :2] == 0).all()
    torch.testing.assert_close(fused, explicit)


def test_fully_masked_rows_with_bias_give_output_bias():
    mha = make_mha(bias=True)
    (x,) = inputs((1, 3, D_MODEL))
    mask = torch.tensor([[True, True, True], [False, True, True], [False, False, True]])
    explicit, fused = _both_paths(mha, x, x, x, mask)
    for result in (explicit, fused):
        torch.testing.assert_close(result[0, 0], mha.w_o.bias)  # zero heads, then W^O and its bias


# --- masks ----------------------------------------------------------------------------------


@pytest.mark.parametrize("need_weights", [True, False])
def test_changing_a_future_token_leaves_earlier_outputs_unchanged(need_weights):
    mha = make_mha()
    (x,) = inputs((2, 6, D_MODEL))
    changed = x.clone()
    changed[:, 4] = torch.randn(2, D_MODEL) * 10  # position 4 is the future of positions 0..3
    mask = causal_mask(6)
    before = mha(x, x, x, mask=mask, need_weights=need_weights)
    after = mha(changed, changed, changed, mask=mask, need_weights=need_weights)
    before, after = (before[0], after[0]) if need_weights else (before, after)
    torch.testing.assert_close(after[:, :4], before[:, :4])
    assert not torch.allclose(after[:, 4:], before[:, 4:])


@pytest.mark.parametrize("need_weights", [True, False])
def test_changing_a_padded_key_leaves_outputs_unchanged(need_weights):
    mha = make_mha()
    target, memory = inputs((2, 3, D_MODEL), (2, 6, D_MODEL))
    source = torch.tensor([[4, 5, 6, 0, 0, 0], [4, 5, 6, 7, 8, 0]])
    changed = memory.clone()
    changed[0, 3:] = torch.randn(3, D_MODEL) * 10  # padding of sequence 0
    changed[1, 5] = torch.randn(D_MODEL) * 10  # padding of sequence 1
    mask = padding_mask(source, 0)
    before = mha(target, memory, memory, mask=mask, need_weights=need_weights)
    after = mha(target, changed, changed, mask=mask, need_weights=need_weights)
    before, after = (before[0], after[0]) if need_weights else (before, after)
    torch.testing.assert_close(after, before)


def test_mask_broadcasting_shapes():
    mha = make_mha()
    (x,) = inputs((2, 4, D_MODEL))
    full = causal_mask(4).expand(2, NUM_HEADS, 4, 4)
    expected, _ = mha(x, x, x, mask=full, need_weights=True)
    for mask in (causal_mask(4), causal_mask(4)[None, None], causal_mask(4).expand(2, 1, 4, 4)):
        torch.testing.assert_close(mha(x, x, x, mask=mask), expected)
        torch.testing.assert_close(mha(x, x, x, mask=mask, need_weights=True)[0], expected)


def test_per_head_mask():
    mha = make_mha()
    (x,) = inputs((1, 4, D_MODEL))
    mask = torch.zeros(1, NUM_HEADS, 4, 4, dtype=torch.bool)
    mask[0, 1] = causal_mask(4)  # only head 1 is causal
    _, weights = mha(x, x, x, mask=mask, need_weights=True)
    assert (weights[0, 1][causal_mask(4)] == 0).all()
    assert (weights[0, 0][causal_mask(4)] > 0).all()
    torch.testing.assert_close(mha(x, x, x, mask=mask), mha(x, x, x, mask=mask, need_weights=True)[0])


# --- properties -----------------------------------------------------------------------------


@pytest.mark.parametrize("need_weights", [True, False])
def test_permutation_equivariance(need_weights):
    mha = make_mha()
    (x,) = inputs((2, 7, D_MODEL))
    perm = torch.randperm(7, generator=torch.Generator().manual_seed(3))
    out = mha(x, x, x, need_weights=need_weights)
    out_perm = mha(x[:, perm], x[:, perm], x[:, perm], need_weights=need_weights)
    if need_weights:
        (out, weights), (out_perm, weights_perm) = out, out_perm
        torch.testing.assert_close(weights_perm, weights[:, :, perm][:, :, :, perm])
    torch.testing.assert_close(out_perm, out[:, perm])


def test_weights_are_not_stored_on_the_module():
    mha = make_mha()
    (x,) = inputs((2, 4, D_MODEL))
    attributes = dict(vars(mha))
    buffers = dict(mha.named_buffers())
    state = set(mha.state_dict())
    mha(x, x, x, need_weights=True)
    mha(x, x, x)
    assert vars(mha).keys() == attributes.keys()
    assert all(vars(mha)[name] is value for name, value in attributes.items())
    assert dict(mha.named_buffers()) == buffers
    assert set(mha.state_dict()) == state


def test_dropout_only_in_training():
    torch.manual_seed(0)
    mha = MultiHeadAttention(D_MODEL, NUM_HEADS, dropout=0.5)
    assert mha.dropout == 0.5
    (x,) = inputs((2, 5, D_MODEL))

    mha.eval()
    reference = MultiHeadAttention(D_MODEL, NUM_HEADS)
    reference.load_state_dict(mha.state_dict())
    reference.eval()
    for need_weights in (True, False):
        out_eval = mha(x, x, x, need_weights=need_weights)
        out_ref = reference(x, x, x, need_weights=need_weights)
        if need_weights:
            torch.testing.assert_close(out_eval[1], out_ref[1])
            out_eval, out_ref = out_eval[0], out_ref[0]
        torch.testing.assert_close(out_eval, out_ref)

    mha.train()
    torch.manual_seed(1)
    _, weights = mha(x, x, x, need_weights=True)
    assert (weights == 0).any()  # dropped weights
    assert not torch.allclose(weights.sum(-1), torch.ones(2, NUM_HEADS, 5))  # rescaled by 1 / (1 - p)
    torch.manual_seed(2)
    first = mha(x, x, x)
    torch.manual_seed(3)
    second = mha(x, x, x)
    assert not torch.allclose(first, second)  # the fused path drops weights too
    assert not torch.allclose(first, reference(x, x, x))


# --- bad input ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(d_model=10, num_heads=4), ValueError, r"d_model must be divisible by num_heads.*d_model=10.*num_heads=4"),
        (dict(d_model=0, num_heads=1), ValueError, r"d_model must be a positive int, got 0"),
        (dict(d_model=8, num_heads=-2), ValueError, r"num_heads must be a positive int, got -2"),
        (dict(d_model=8.0, num_heads=2), TypeError, r"d_model must be a positive int"),
        (dict(d_model=8, num_heads=2, dropout=1.0), ValueError, r"dropout must be in \[0, 1\), got 1.0"),
        (dict(d_model=8, num_heads=2, dropout=-0.1), ValueError, r"dropout must be in \[0, 1\), got -0.1"),
    ],
)
def test_bad_constructor_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        MultiHeadAttention(**kwargs)


@pytest.mark.parametrize("name", ["query", "key", "value"])
def test_wrong_feature_width(name):
    mha = make_mha()
    args = dict(zip(["query", "key", "value"], inputs(*[(2, 5, D_MODEL)] * 3)))
    args[name] = torch.randn(2, 5, D_MODEL + 1)
    with pytest.raises(ValueError, match=rf"{name} must have shape \(.*d_model=8\), got \(2, 5, 9\)"):
        mha(**args)


def test_wrong_number_of_dimensions():
    mha = make_mha()
    with pytest.raises(ValueError, match=r"query must have shape .* got \(5, 8\)"):
        mha(torch.randn(5, D_MODEL), torch.randn(2, 5, D_MODEL), torch.randn(2, 5, D_MODEL))


def test_query_key_batch_mismatch():
    mha = make_mha()
    query, key = inputs((2, 4, D_MODEL), (3, 5, D_MODEL))
    with pytest.raises(ValueError, match=r"same batch size.*query \(2, 4, 8\).*key \(3, 5, 8\)"):
        mha(query, key, key)


@pytest.mark.parametrize("value_shape", [(2, 6, D_MODEL), (1, 5, D_MODEL)])
def test_key_value_mismatch(value_shape):
    mha = make_mha()
    query, key, value = inputs((2, 4, D_MODEL), (2, 5, D_MODEL), value_shape)
    with pytest.raises(ValueError, match=r"value must have .*\(2, 5\).*got value " + re.escape(str(value_shape))):
        mha(query, key, value)


@pytest.mark.parametrize("need_weights", [True, False])
@pytest.mark.parametrize("mask_shape", [(4, 5), (2, 3, 4, 4), (3, 1, 1, 4), (1, 2, 1, 4, 4)])
def test_mask_that_does_not_broadcast(mask_shape, need_weights):
    mha = make_mha()
    (x,) = inputs((2, 4, D_MODEL))
    mask = torch.zeros(mask_shape, dtype=torch.bool)
    with pytest.raises(ValueError, match="mask"):
        mha(x, x, x, mask=mask, need_weights=need_weights)


@pytest.mark.parametrize("need_weights", [True, False])
def test_non_boolean_mask(need_weights):
    mha = make_mha()
    (x,) = inputs((2, 4, D_MODEL))
    with pytest.raises(TypeError, match="mask"):
        mha(x, x, x, mask=causal_mask(4).float(), need_weights=need_weights)
    with pytest.raises(TypeError, match="mask"):
        mha(x, x, x, mask=causal_mask(4).long(), need_weights=need_weights)


def test_non_tensor_and_integer_inputs():
    mha = make_mha()
    (x,) = inputs((2, 4, D_MODEL))
    with pytest.raises(TypeError, match="key must be a torch.Tensor"):
        mha(x, [[0.0] * D_MODEL], x)
    with pytest.raises(TypeError, match="query must be a floating-point tensor"):
        mha(torch.zeros(2, 4, D_MODEL, dtype=torch.long), x, x)


def test_attend_is_the_step_a_subclass_replaces_and_sees_the_query_positions():
    seen = []

    class Recorded(MultiHeadAttention):
        def attend(self, q, k, v, mask, dropout_p, need_weights, query_start=0):
            seen.append((q.shape[2], k.shape[2], query_start))
            return super().attend(q, k, v, mask, dropout_p, need_weights, query_start)

    torch.manual_seed(0)
    mha = Recorded(d_model=8, num_heads=2).eval()
    x = torch.randn(2, 5, 8)
    full = mha(x, x, x, mask=causal_mask(5))
    cache = KVCache()
    steps = torch.cat([mha(x[:, t:t + 1], x[:, t:t + 1], x[:, t:t + 1], cache=cache) for t in range(5)], dim=1)
    torch.testing.assert_close(steps, full)
    assert seen == [(5, 5, 0)] + [(1, t + 1, t) for t in range(5)]  # query t is position t
    seen.clear()
    memory = torch.randn(2, 7, 8)
    static = KVCache(static=True)
    mha(x[:, :1], memory, memory, cache=static)
    mha(x[:, 1:2], memory, memory, cache=static)
    assert seen == [(1, 7, 0), (1, 7, 0)]  # cross-attention: no self-attention positions before


@pytest.mark.parametrize("name", ["bias", "need_weights"])
def test_switches_must_be_bools_issue_13(name):
    with pytest.raises(TypeError, match=f"{name} must be a bool, got str 'no'"):
        if name == "bias":
            MultiHeadAttention(8, 2, bias="no")
        else:
            x = torch.randn(1, 3, 8)
            MultiHeadAttention(8, 2)(x, x, x, need_weights="no")


# --- one arithmetic for nan (issue 47) ---------------------------------------------------------

@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("masked", [False, True])
def test_a_query_that_is_not_finite_gives_nan_on_both_paths(bad, masked):
    torch.manual_seed(0)
    attention = MultiHeadAttention(16, 2).eval()
    x = torch.randn(2, 4, 16)  # (B, L, d_model)
    query = x.clone()
    query[0, 1, 4] = bad
    mask = causal_mask(4) if masked else None
    fused = attention(query, x, x, mask)
    explicit, _ = attention(query, x, x, mask, need_weights=True)
    torch.testing.assert_close(fused, explicit, equal_nan=True)
    assert fused[0, 1].isnan().all()  # nan in, nan out: not torch's CPU kernel's zeros
    assert not fused[1].isnan().any() and not fused[0, [0, 2, 3]].isnan().any()
