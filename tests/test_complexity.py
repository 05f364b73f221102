"""Tests for transformer/book/complexity.py (chapters/complexity.md)."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from transformer.book.complexity import (autograd_depth, band_mask, banded_attention, convolution_macs, loglog_slope,
    recurrent_macs, restricted_attention_macs, saved_tensor_bytes, self_attention_macs)

SIZES = [(1, 1), (5, 8), (16, 4), (33, 12)]  # (n, d)


def flops(fn):
    """Floating-point operations of fn(), as torch's FLOP counter counts them (2 per multiply-add)."""
    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


def reference_band(size, radius):
    """The band written out entry by entry: True (may not attend) where |i - j| > radius."""
    return torch.tensor([[abs(i - j) > radius for j in range(size)] for i in range(size)])


def dense_band_attention(q, k, v, radius):
    """torch's attention with the band mask (its bool mask is True where a query MAY attend)."""
    n = q.shape[-2]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=~reference_band(n, radius))


# --- multiply-add counts against torch's FLOP counter ---------------------------------------------


@pytest.mark.parametrize("n, d", SIZES)
def test_self_attention_macs_match_flop_counter(n, d):
    torch.manual_seed(0)
    B = 3
    x = torch.randn(B, n, d)

    def attention():  # softmax(X X^T / sqrt(d)) X, written out
        weights = torch.softmax(x @ x.transpose(1, 2) / math.sqrt(d), dim=-1)  # (B, n, n)
        return weights @ x  # (B, n, d)

    assert flops(attention) == 2 * B * self_attention_macs(n, d)


@pytest.mark.parametrize("n, d", [(5, 8), (16, 4), (33, 12)])
def test_self_attention_macs_with_projections_match_torch_multihead(n, d):
    torch.manual_seed(0)
    B = 2
    mha = nn.MultiheadAttention(d, num_heads=2 if d % 2 == 0 else 1, batch_first=True)
    x = torch.randn(B, n, d)
    counted = flops(lambda: mha(x, x, x, need_weights=True))  # explicit path: in/out projections, bmm
    assert counted == 2 * B * self_attention_macs(n, d, projections=True)
    assert self_attention_macs(n, d, projections=True) - self_attention_macs(n, d) == 4 * n * d * d


@pytest.mark.parametrize("n, d", SIZES)
def test_recurrent_macs_match_torch_rnn(n, d):
    torch.manual_seed(0)
    B = 2
    rnn = nn.RNN(d, d, batch_first=True)
    x = torch.randn(B, n, d)
    assert flops(lambda: rnn(x)) == 2 * B * recurrent_macs(n, d)


@pytest.mark.parametrize("k", [1, 3, 5])
@pytest.mark.parametrize("n, d", SIZES)
def test_convolution_macs_match_torch_conv1d(n, d, k):
    torch.manual_seed(0)
    B = 2
    conv = nn.Conv1d(d, d, k, padding=k // 2)  # same length out
    x = torch.randn(B, d, n)
    assert conv(x).shape == (B, d, n)
    assert flops(lambda: conv(x)) == 2 * B * convolution_macs(n, d, k)


@pytest.mark.parametrize("n, d, r", [(8, 4, 1), (16, 8, 3), (20, 6, 5)])
def test_restricted_attention_macs_match_attention_over_r_keys(n, d, r):
    torch.manual_seed(0)
    q, k, v = torch.randn(3, n, d).unbind(0)
    index = torch.randint(0, n, (n, r))  # any r keys per query

    def restricted():
        keys, values = k[index], v[index]  # (n, r, d)
        scores = (q.unsqueeze(1) @ keys.transpose(1, 2)).squeeze(1)  # (n, 1, d) @ (n, d, r) -> (n, r)
        weights = torch.softmax(scores / math.sqrt(d), dim=-1)
        return (weights.unsqueeze(1) @ values).squeeze(1)  # (n, 1, r) @ (n, r, d) -> (n, d)

    assert flops(restricted) == 2 * restricted_attention_macs(n, d, r)


def test_counts_grow_as_table_1_says():
    n, d = 64, 32
    assert self_attention_macs(2 * n, d) == 4 * self_attention_macs(n, d)
    assert self_attention_macs(n, 2 * d) == 2 * self_attention_macs(n, d)
    assert recurrent_macs(2 * n, d) == 2 * recurrent_macs(n, d)
    assert recurrent_macs(n, 2 * d) == 4 * recurrent_macs(n, d)
    assert convolution_macs(n, d, 6) == 2 * convolution_macs(n, d, 3)
    assert restricted_attention_macs(2 * n, d, 9) == 2 * restricted_attention_macs(n, d, 9)
    # the crossover: self-attention is cheaper than a recurrent layer exactly when n < d
    assert self_attention_macs(d - 1, d) < recurrent_macs(d - 1, d)
    assert self_attention_macs(d, d) == recurrent_macs(d, d)
    assert self_attention_macs(d + 1, d) > recurrent_macs(d + 1, d)


def test_counts_accept_numpy_style_integers_and_return_ints():
    class Integral(int):
        pass

    assert self_attention_macs(Integral(4), 2) == 64 and type(self_attention_macs(4, 2)) is int


@pytest.mark.parametrize("fn, args, name", [
    (self_attention_macs, (0, 8), "n"),
    (self_attention_macs, (8, -1), "d"),
    (recurrent_macs, (0, 8), "n"),
    (convolution_macs, (8, 8, 0), "k"),
    (restricted_attention_macs, (8, 8, 0), "r"),
])
def test_counts_refuse_non_positive_sizes(fn, args, name):
    with pytest.raises(ValueError, match=f"{name} must be a positive int"):
        fn(*args)


def test_counts_refuse_non_integers():
    with pytest.raises(TypeError, match="n must be a positive int, got float"):
        self_attention_macs(8.0, 4)
    with pytest.raises(TypeError, match="d must be a positive int, got bool"):
        recurrent_macs(8, True)
    with pytest.raises(TypeError, match="projections must be a bool, got str"):
        self_attention_macs(8, 4, projections="yes")


# --- band mask --------------------------------------------------------------------------------------


@pytest.mark.parametrize("size, radius", [(1, 0), (5, 0), (6, 1), (7, 3), (4, 10)])
def test_band_mask_matches_the_definition(size, radius):
    mask = band_mask(size, radius)
    assert mask.dtype == torch.bool and mask.shape == (size, size)
    assert torch.equal(mask, reference_band(size, radius))


def test_band_mask_extremes_and_counts():
    assert torch.equal(band_mask(5, 0), ~torch.eye(5, dtype=torch.bool))  # only itself
    assert not band_mask(5, 4).any()  # radius n - 1: nothing masked
    allowed = (~band_mask(9, 2)).sum(dim=-1)
    assert allowed.tolist() == [3, 4, 5, 5, 5, 5, 5, 4, 3]  # r = 2 * radius + 1 away from the ends


def test_band_mask_device():
    assert band_mask(3, 1, device="cpu").device.type == "cpu"
    assert band_mask(3, 1, device=torch.device("meta")).device.type == "meta"


def test_band_mask_bad_arguments():
    with pytest.raises(ValueError, match="size must be a positive int, got 0"):
        band_mask(0, 1)
    with pytest.raises(ValueError, match="radius must be a non-negative int, got -1"):
        band_mask(4, -1)
    with pytest.raises(TypeError, match="radius must be a non-negative int, got float"):
        band_mask(4, 1.5)
    with pytest.raises(TypeError, match="radius must be a non-negative int, got bool"):
        band_mask(4, True)


# --- banded attention -------------------------------------------------------------------------------


@pytest.mark.parametrize("n, radius", [(1, 0), (7, 0), (12, 1), (12, 3), (13, 4), (37, 5), (10, 9), (6, 50)])
def test_banded_attention_matches_dense_band_attention(n, radius):
    torch.manual_seed(0)
    q, k = torch.randn(2, 2, 3, n, 8, dtype=torch.float64, requires_grad=True).unbind(0)
    v = torch.randn(2, 3, n, 5, dtype=torch.float64, requires_grad=True)  # d_v != d_k
    out = banded_attention(q, k, v, radius)
    expected = dense_band_attention(q, k, v, radius)
    assert out.shape == (2, 3, n, 5)
    torch.testing.assert_close(out, expected)
    probe = torch.randn_like(out)
    grads = torch.autograd.grad((out * probe).sum(), (q, k, v))
    expected_grads = torch.autograd.grad((expected * probe).sum(), (q, k, v))
    for g, g_expected in zip(grads, expected_grads):
        assert torch.isfinite(g).all()
        torch.testing.assert_close(g, g_expected)


@pytest.mark.parametrize("shape", [(9, 4), (2, 9, 4), (2, 3, 9, 4), (2, 1, 3, 9, 4)])
def test_banded_attention_any_leading_dimensions(shape):
    torch.manual_seed(0)
    q, k, v = (torch.randn(shape) for _ in range(3))
    out = banded_attention(q, k, v, radius=2)
    assert out.shape == shape
    torch.testing.assert_close(out, dense_band_attention(q, k, v, 2), atol=1e-5, rtol=1e-5)


def test_banded_attention_radius_zero_returns_the_values():
    q, k, v = torch.randn(3, 2, 6, 4).unbind(0)
    torch.testing.assert_close(banded_attention(q, k, v, 0), v)


def test_keys_outside_the_band_do_not_change_the_output():
    torch.manual_seed(0)
    n, radius, t = 20, 3, 10
    q, k, v = torch.randn(3, 1, n, 8).unbind(0)
    out = banded_attention(q, k, v, radius)
    far = [j for j in range(n) if abs(j - t) > radius]
    k2, v2 = k.clone(), v.clone()
    k2[:, far], v2[:, far] = 100 * torch.randn(len(far), 8), 100 * torch.randn(len(far), 8)
    torch.testing.assert_close(banded_attention(q, k2, v2, radius)[:, t], out[:, t])
    near = t + radius  # a key just inside the band does change it
    k2[:, near] += 5
    assert not torch.allclose(banded_attention(q, k2, v2, radius)[:, t], out[:, t])


def test_banded_attention_work_and_memory_grow_linearly():
    d, radius = 8, 4
    counts, saved = [], []
    for n in (64, 128, 256):
        x = torch.randn(1, n, d, requires_grad=True)
        counts.append(flops(lambda: banded_attention(x, x, x, radius)))
        saved.append(saved_tensor_bytes(lambda: banded_attention(x, x, x, radius)))
    assert counts[1] == 2 * counts[0] and counts[2] == 2 * counts[1]
    assert saved[2] / saved[1] == pytest.approx(2, rel=0.05)
    dense = flops(lambda: dense_band_attention(x, x, x, radius))
    assert counts[2] < dense / 4  # at n = 256 the band is a small part of the n x n scores


def test_banded_attention_low_precision_runs():
    q, k, v = torch.randn(3, 1, 10, 8).unbind(0)
    out = banded_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), 2)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), dense_band_attention(q, k, v, 2), atol=0.05, rtol=0.05)


def test_banded_attention_bad_input():
    q = torch.randn(2, 6, 4)
    with pytest.raises(ValueError, match="query and key must have the same shape"):
        banded_attention(q, torch.randn(2, 7, 4), torch.randn(2, 7, 4), 1)
    with pytest.raises(ValueError, match="value"):
        banded_attention(q, q, torch.randn(2, 5, 4), 1)
    with pytest.raises(ValueError, match="floating-point"):
        banded_attention(q.long(), q.long(), q.long(), 1)
    with pytest.raises(ValueError, match=r"query must be a floating-point tensor \(\.\.\., n, d\)"):
        banded_attention(torch.randn(4), torch.randn(4), torch.randn(4), 1)
    with pytest.raises(TypeError, match="key must be a torch.Tensor"):
        banded_attention(q, [1, 2], q, 1)
    with pytest.raises(ValueError, match="radius must be a non-negative int, got -2"):
        banded_attention(q, q, q, -2)


# --- saved_tensor_bytes -----------------------------------------------------------------------------


def test_saved_bytes_of_simple_operations():
    x = torch.randn(100, requires_grad=True)
    assert saved_tensor_bytes(lambda: x.exp()) == 100 * 4  # exp keeps its output
    assert saved_tensor_bytes(lambda: x * x) == 100 * 4  # both inputs are one storage
    y = torch.randn(100, requires_grad=True)
    assert saved_tensor_bytes(lambda: x * y) == 2 * 100 * 4  # two storages
    assert saved_tensor_bytes(lambda: x * y.detach()) == 100 * 4  # only what x's gradient needs
    assert saved_tensor_bytes(lambda: x.double().exp()) == 100 * 8
    assert saved_tensor_bytes(lambda: x + 1) == 0  # addition needs nothing for backward
    with torch.no_grad():
        assert saved_tensor_bytes(lambda: x.exp()) == 0


def test_saved_bytes_ignore_parameters():
    linear = nn.Linear(10, 6)
    x = torch.randn(4, 10, requires_grad=True)
    with_weights = saved_tensor_bytes(lambda: linear(x))
    without = saved_tensor_bytes(lambda: linear(x), ignore=linear.parameters())
    assert without == x.numel() * 4
    assert with_weights == without + linear.weight.numel() * 4


def test_saved_bytes_see_the_attention_weights():
    torch.manual_seed(0)
    B, H, n, d = 1, 2, 64, 8
    q = torch.randn(B, H, n, d, requires_grad=True)

    def explicit():
        return torch.softmax(q @ q.transpose(-1, -2), dim=-1) @ q

    weights_bytes = B * H * n * n * 4
    assert saved_tensor_bytes(explicit) >= weights_bytes
    assert saved_tensor_bytes(lambda: F.scaled_dot_product_attention(q, q, q)) < weights_bytes


def test_saved_bytes_bad_arguments():
    with pytest.raises(TypeError, match="fn must be callable"):
        saved_tensor_bytes(3)
    with pytest.raises(TypeError, match="ignore must be a torch.Tensor"):
        saved_tensor_bytes(lambda: None, ignore=[1.0])


# --- autograd_depth ---------------------------------------------------------------------------------


def test_depth_of_leaves_and_untracked_tensors():
    x = torch.randn(3, requires_grad=True)
    assert autograd_depth(x) == 0
    assert autograd_depth(torch.randn(3)) == 0
    with torch.no_grad():
        assert autograd_depth(x.exp()) == 0


@pytest.mark.parametrize("length", [1, 2, 10])
def test_depth_of_a_chain(length):
    y = torch.randn(3, requires_grad=True)
    for _ in range(length):
        y = y.sin()
    assert autograd_depth(y) == length


def test_depth_is_the_longest_path():
    x = torch.randn(3, requires_grad=True)
    long, short = x, x
    for _ in range(5):
        long = long.exp()
    short = short.cos()
    assert autograd_depth(long + short) == 6  # 5 exps, then the add
    assert autograd_depth(long * 2 + x) == 7


def test_depth_of_a_recurrence_grows_by_its_steps_per_position():
    torch.manual_seed(0)
    d = 4
    w = torch.randn(d, d, requires_grad=True)
    for n in (1, 5, 20):
        x = torch.randn(n, d, requires_grad=True)
        h = torch.zeros(1, d)  # (1, d): h @ w is one mm
        for t in range(n):
            h = torch.tanh(h @ w + x[t])  # three dependent operations per step: mm, add, tanh
        assert autograd_depth(h) == 3 * n


def test_depth_of_a_very_long_chain_does_not_recurse():
    y = torch.randn(2, requires_grad=True)
    for _ in range(5000):
        y = y * 1.0001
    assert autograd_depth(y) == 5000


def test_depth_bad_argument():
    with pytest.raises(TypeError, match="output must be a torch.Tensor, got list"):
        autograd_depth([1, 2])


# --- loglog_slope -----------------------------------------------------------------------------------


@pytest.mark.parametrize("power", [2.0, 1.0, 0.5, -1.0, 0.0])
def test_slope_of_exact_power_laws(power):
    sizes = [3, 10, 30, 100, 1000]
    values = [7.5 * s**power for s in sizes]
    assert loglog_slope(sizes, values) == pytest.approx(power, abs=1e-12)


def test_slope_is_least_squares_through_noisy_points():
    sizes = [1, 2, 4]
    values = [1.0, 4.0, 8.0]  # log2: 0, 2, 3 -> least-squares slope 1.5 against log2 sizes 0, 1, 2
    assert loglog_slope(sizes, values) == pytest.approx(1.5)
    assert loglog_slope(iter(sizes), (v for v in values)) == pytest.approx(1.5)  # any iterables


def test_slope_bad_arguments():
    with pytest.raises(ValueError, match="two or more sizes"):
        loglog_slope([1], [1])
    with pytest.raises(ValueError, match="two or more sizes and as many values, got 3 and 2"):
        loglog_slope([1, 2, 3], [1, 2])
    with pytest.raises(ValueError, match="must be positive"):
        loglog_slope([1, 2], [1, 0])
    with pytest.raises(ValueError, match="must not all be equal"):
        loglog_slope([2, 2], [1, 3])
