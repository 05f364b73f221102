"""benchmarks/table3.py: each variant's option does what it says, and a recorded row reproduces."""

import json

import pytest
import torch

from benchmarks.table3 import (BASE, RESULTS, VARIANTS, UnscaledMultiHeadAttention, build_model, machine,
                               narrow_keys, run_path, variant_config)
from transformer.nn.attention import causal_mask
from transformer.nn.multihead import MultiHeadAttention
from transformer.nn.positional import LearnedPositionalEncoding, SinusoidalPositionalEncoding
from transformer.tasks.numbers import source_vocab, target_vocab


def heads_by_formula(attention, x, mask=None, scale=1.0):
    """Concat(softmax(scale * Q_i K_i^T) V_i) W^O, written out head by head from the module's weights."""
    q, k, v = attention.w_q(x), attention.w_k(x), attention.w_v(x)  # (B, T, H d_k), ..., (B, T, H d_v)
    H = attention.num_heads
    d_k, d_v = q.shape[-1] // H, v.shape[-1] // H
    outputs = []
    for i in range(H):
        scores = scale * q[..., i * d_k:(i + 1) * d_k] @ k[..., i * d_k:(i + 1) * d_k].transpose(-2, -1)  # (B, T, T)
        if mask is not None:
            scores = scores.masked_fill(mask, float("-inf"))
        outputs.append(scores.softmax(dim=-1) @ v[..., i * d_v:(i + 1) * d_v])  # (B, T, d_v)
    return attention.w_o(torch.cat(outputs, dim=-1))  # (B, T, H d_v) -> (B, T, d_model)


@pytest.mark.parametrize("need_weights", [False, True])
@pytest.mark.parametrize("masked", [False, True])
def test_unscaled_attention_is_softmax_of_q_k_transposed_times_v(need_weights, masked):
    torch.manual_seed(0)
    attention = UnscaledMultiHeadAttention(d_model=12, num_heads=3).eval()  # d_k = 4
    x = torch.randn(2, 5, 12)
    mask = causal_mask(5) if masked else None
    out = attention(x, x, x, mask=mask, need_weights=need_weights)
    out = out[0] if need_weights else out
    torch.testing.assert_close(out, heads_by_formula(attention, x, mask))
    scaled = MultiHeadAttention(d_model=12, num_heads=3).eval()
    scaled.load_state_dict(attention.state_dict())
    torch.testing.assert_close(scaled(x, x, x, mask=mask), heads_by_formula(attention, x, mask, scale=4 ** -0.5))
    assert not torch.allclose(out, scaled(x, x, x, mask=mask), atol=1e-3)  # the scale matters


def test_narrow_keys_makes_queries_and_keys_d_k_wide_and_keeps_the_values():
    torch.manual_seed(0)
    attention = MultiHeadAttention(d_model=16, num_heads=4).eval()
    before = sum(p.numel() for p in attention.parameters())
    narrow_keys(attention, d_k=2)
    assert attention.w_q.weight.shape == attention.w_k.weight.shape == (4 * 2, 16)
    assert attention.w_v.weight.shape == (16, 16) and attention.d_k == 2
    assert before - sum(p.numel() for p in attention.parameters()) == 2 * (16 * 8 + 8)  # W^Q, W^K and biases
    x = torch.randn(2, 5, 16)
    _, weights = attention(x, x, x, need_weights=True)
    torch.testing.assert_close(attention(x, x, x), heads_by_formula(attention, x, scale=2 ** -0.5))
    assert weights.shape == (2, 4, 5, 5)


def test_each_variant_changes_one_thing():
    configs = {name: variant_config(name, seed=0) for name in VARIANTS}
    base, _ = configs["base"]
    assert (base.steps, base.warmup) == (BASE["steps"], BASE["warmup"]) and base.label_smoothing == 0.1
    assert base.dropout == 0.0 and base.num_heads == 4 and base.d_model == 64  # chapter 14's model
    changed = {name: {k for k, v in vars(config).items() if v != getattr(base, k)} | set(options)
               for name, (config, options) in configs.items()}
    assert changed == {"base": set(), "h=1": {"num_heads"}, "h=16": {"num_heads"}, "d_k=8": {"d_k"}, "d_k=4": {"d_k"},
                       "no scaling": {"scaled"}, "no smoothing": {"label_smoothing"}, "P_drop=0.1": {"dropout"},
                       "learned positions": {"positions"}}


def count(model):
    return sum(p.numel() for p in model.parameters())


def test_heads_at_equal_cost_have_the_base_parameter_count_and_the_others_what_they_change():
    src, tgt = source_vocab(), target_vocab()
    models = {}
    for name in VARIANTS:
        config, options = variant_config(name, seed=0)
        torch.manual_seed(0)
        models[name] = build_model(config, src, tgt, **options)
    base = count(models["base"])
    assert count(models["h=1"]) == count(models["h=16"]) == count(models["no scaling"]) == base
    attentions = 3 * 2  # per layer: the encoder's self-attention, the decoder's two; two layers
    assert base - count(models["d_k=4"]) == attentions * 2 * (64 * (64 - 16) + (64 - 16))
    assert count(models["learned positions"]) - base == 16 * 64  # max_len x d_model
    assert isinstance(models["learned positions"].positional_encoding, LearnedPositionalEncoding)
    assert isinstance(models["base"].positional_encoding, SinusoidalPositionalEncoding)
    layer = models["no scaling"].decoder.layers[1]
    assert type(layer.self_attn) is type(layer.cross_attn) is UnscaledMultiHeadAttention
    assert type(models["base"].decoder.layers[1].cross_attn) is MultiHeadAttention
    with pytest.raises(ValueError, match="positions must be"):
        build_model(variant_config("base", 0)[0], src, tgt, positions="rotary")


@pytest.mark.slow
def test_a_recorded_row_reproduces():
    """One head, seed 0, on torch's plain kernels, trained again in a child process. On the machine that
    recorded it (same CPU, same torch) the row comes back exactly; elsewhere within what rounding moved
    the recorded runs: the base's two paths, same seed, differ by up to 7 points of exact match and 4%
    of perplexity. A wrong variant or run is further away (the variants differ by 15 points and more)."""
    record = json.loads(RESULTS.read_text())
    recorded = next(row for row in record["rows"]
                    if (row["variant"], row["seed"], row["path"]) == ("h=1", 0, "default"))
    (row,) = run_path("default", ["h=1"], [0])
    assert row["capability"] == "DEFAULT" and row["parameters"] == recorded["parameters"]
    same = {k: record["machine"][k] for k in ("cpu", "torch")} == {k: machine()[k] for k in ("cpu", "torch")}
    tolerance = dict(exact_match=1e-9, token_accuracy=1e-6, test_perplexity=1e-5) if same else \
        dict(exact_match=0.08, token_accuracy=0.015, test_perplexity=0.05 * recorded["test_perplexity"])
    for metric, allowed in tolerance.items():
        assert abs(row[metric] - recorded[metric]) <= allowed, (metric, row[metric], recorded[metric])
