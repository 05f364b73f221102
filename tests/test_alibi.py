"""Tests for transformer/nn/alibi.py (chapters/train_short_test_long.md): ALiBi's slopes and distance
bias worked out by hand, attention against the formula, the cache, and what the bias depends on."""

import pytest
import torch

from transformer.nn.alibi import ALiBiMultiHeadAttention, alibi_slopes
from transformer.nn.attention import causal_mask
from transformer.nn.cache import KVCache
from transformer.nn.decoder_only import DecoderOnlyLM
from transformer.nn.encoder import LayerOptions

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def test_slopes_are_the_papers_geometric_sequences():
    assert alibi_slopes(8).tolist() == [1 / 2, 1 / 4, 1 / 8, 1 / 16, 1 / 32, 1 / 64, 1 / 128, 1 / 256]
    assert alibi_slopes(1).tolist() == [1 / 256]
    assert alibi_slopes(2).tolist() == [1 / 16, 1 / 256]
    torch.testing.assert_close(alibi_slopes(16), torch.tensor([2 ** (-0.5 * i) for i in range(1, 17)]))
    for h in (2, 4, 8, 16, 32):  # start 2^(-8/h), ratio 2^(-8/h), last 2^-8
        slopes = alibi_slopes(h).double()
        torch.testing.assert_close(slopes[1:] / slopes[:-1], torch.full((h - 1,), 2 ** (-8 / h), dtype=torch.double))
        assert slopes[-1].item() == 2 ** -8
    # not a power of 2: the 4 of 4 heads, then every other one of 8 heads (the paper's code)
    assert alibi_slopes(6).tolist() == [1 / 4, 1 / 16, 1 / 64, 1 / 256, 1 / 2, 1 / 8]
    assert alibi_slopes(12).shape == (12,)


@pytest.mark.parametrize("bad, error", [(0, ValueError), (-2, ValueError), (2.0, TypeError)])
def test_slopes_refuse_a_bad_number_of_heads(bad, error):
    with pytest.raises(error, match="num_heads"):
        alibi_slopes(bad)


def test_distance_bias_by_hand():
    layer = ALiBiMultiHeadAttention(d_model=8, num_heads=2)  # slopes 1/16, 1/256
    expected = -torch.tensor([[1, 0, 1, 2], [2, 1, 0, 1]]).float()  # |i - j| for queries at 1, 2; keys 0..3
    torch.testing.assert_close(layer.distance_bias(2, 4, query_start=1), torch.stack([expected / 16, expected / 256]))
    assert "slopes" not in layer.state_dict()  # fixed, not saved: nothing about positions is learned


def test_attend_is_the_formula():
    torch.manual_seed(0)
    layer = ALiBiMultiHeadAttention(d_model=8, num_heads=2)
    q, k, v = torch.randn(2, 2, 5, 4), torch.randn(2, 2, 5, 4), torch.randn(2, 2, 5, 4)  # (B, H, S, d_k)
    mask = causal_mask(5)
    i, j = torch.arange(5)[:, None], torch.arange(5)
    bias = torch.stack([(j - i) / 16, (j - i) / 256])  # (H, S, S): m (j - i) where j <= i
    weights = (q @ k.transpose(-2, -1) / 2 + bias).masked_fill(mask, float("-inf")).softmax(-1)
    heads, got = layer.attend(q, k, v, mask, 0.0, need_weights=True)
    torch.testing.assert_close(got, weights)
    torch.testing.assert_close(heads, weights @ v)
    fast, none = layer.attend(q, k, v, mask, 0.0, need_weights=False)
    assert none is None
    torch.testing.assert_close(fast, heads)


def test_a_query_with_nothing_to_attend_to_gives_zeros():
    layer = ALiBiMultiHeadAttention(d_model=8, num_heads=2)
    q = k = v = torch.randn(1, 2, 3, 4)
    mask = torch.tensor([[True, True, True], [False, True, True], [False, False, True]])
    heads, weights = layer.attend(q, k, v, mask, 0.0, need_weights=True)
    assert torch.isfinite(heads).all() and (heads[:, :, 0] == 0).all() and (weights[:, :, 0] == 0).all()


def test_scores_depend_on_distance_only():
    """Shifting every position by the same amount (query_start and cached keys) changes nothing."""
    torch.manual_seed(1)
    layer = ALiBiMultiHeadAttention(d_model=8, num_heads=2).eval()
    x = torch.randn(1, 6, 8)  # (B, S, d_model)
    cache = KVCache()
    layer(x[:, :2], x[:, :2], x[:, :2], mask=causal_mask(2), cache=cache)  # two positions before
    shifted = layer(x[:, 2:], x[:, 2:], x[:, 2:], mask=torch.ones(4, 6, dtype=torch.bool).triu(3), cache=cache)
    full = layer(x, x, x, mask=causal_mask(6))
    torch.testing.assert_close(shifted, full[:, 2:])


def test_language_model_with_alibi_caches_and_runs_past_max_len():
    torch.manual_seed(0)
    model = DecoderOnlyLM(13, d_model=16, num_heads=4, d_ff=32, num_layers=2, max_len=8, dropout=0.0,
                          position=None, options=LayerOptions(norm_first=True, self_attention=ALiBiMultiHeadAttention)).eval()
    tokens = torch.randint(0, 13, (2, 20), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        cache = model.new_cache()
        stepwise = torch.cat([model(tokens[:, t:t + 1], cache=cache) for t in range(20)], dim=1)
        torch.testing.assert_close(stepwise, model(tokens), rtol=1e-5, atol=1e-5)
    assert sum(p.numel() for p in model.parameters()) == sum(
        p.numel() for p in DecoderOnlyLM(13, d_model=16, num_heads=4, d_ff=32, num_layers=2, max_len=8,
                                         position=None).parameters())


def test_alibi_model_learns():
    """A few steps on a repeating sequence: the loss falls (positions come only from the bias)."""
    torch.manual_seed(0)
    model = DecoderOnlyLM(5, d_model=16, num_heads=4, d_ff=32, num_layers=1, max_len=16, dropout=0.0,
                          position=None, options=LayerOptions(norm_first=True, self_attention=ALiBiMultiHeadAttention))
    data = torch.arange(5).repeat(4)[None]  # (1, 20): 0 1 2 3 4 0 1 ...
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(60):
        logits = model(data[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), data[0, 1:])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.1 * losses[0]
