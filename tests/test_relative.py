"""Tests for transformer/nn/relative.py (chapters/positions_compared.md)."""

import functools
import math

import pytest
import torch
from torch import nn

from transformer.nn.attention import causal_mask, padding_mask
from transformer.nn.cache import DecoderCache, KVCache
from transformer.nn.decoder import Decoder
from transformer.nn.encoder import LayerOptions
from transformer.nn.multihead import MultiHeadAttention
from transformer.nn.positional import SinusoidalPositionalEncoding
from transformer.nn.relative import RelativeMultiHeadAttention, RotaryMultiHeadAttention, relative_positions, rotary

D_MODEL, NUM_HEADS, D_K = 8, 2, 4


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def make_relative(max_distance=2, seed=0, dtype=torch.float32, **kwargs):
    torch.manual_seed(seed)
    layer = RelativeMultiHeadAttention(D_MODEL, NUM_HEADS, max_distance=max_distance, **kwargs)
    with torch.no_grad():  # non-zero biases, so that the projections' biases are exercised
        for linear in (layer.w_q, layer.w_k, layer.w_v, layer.w_o):
            linear.bias.normal_()
    return layer.to(dtype).eval()


def make_rotary(seed=0, dtype=torch.float32, **kwargs):
    torch.manual_seed(seed)
    layer = RotaryMultiHeadAttention(D_MODEL, NUM_HEADS, **kwargs)
    with torch.no_grad():
        for linear in (layer.w_q, layer.w_k, layer.w_v, layer.w_o):
            linear.bias.normal_()
    return layer.to(dtype).eval()


LAYERS = {"relative": make_relative, "rotary": make_rotary}


def heads_inputs(B=2, L=5, S=5, seed=1, dtype=torch.float32, requires_grad=False):
    torch.manual_seed(seed)
    return [torch.randn(B, NUM_HEADS, n, D_K, dtype=dtype, requires_grad=requires_grad) for n in (L, S, S)]


def left_padded_mask():
    """Causal mask | padding of a batch whose second row starts with two padding tokens: (2, 1, 5, 5)."""
    tokens = torch.tensor([[1, 2, 3, 4, 5], [0, 0, 3, 4, 5]])
    return causal_mask(5) | padding_mask(tokens, pad_id=0)


# --- references written from the equations ---------------------------------------------------


def shaw_reference(q, k, v, rel_k, rel_v, max_distance, mask=None, query_start=0):
    """Shaw et al.: e_ij = q_i (k_j + a^K_ij)^T / sqrt(d_k), z_i = sum_j alpha_ij (v_j + a^V_ij),
    a_ij = w_{clip(j - i, k)}; one (b, h, i, j) at a time. Returns (heads, weights); empty rows zero."""
    B, H, L, d_k = q.shape
    S = k.shape[2]
    mask = torch.zeros(B, H, L, S, dtype=torch.bool) if mask is None else torch.broadcast_to(mask, (B, H, L, S))
    heads = [[[torch.zeros(v.shape[-1], dtype=q.dtype) for _ in range(L)] for _ in range(H)] for _ in range(B)]
    weights = [[[torch.zeros(S, dtype=q.dtype) for _ in range(L)] for _ in range(H)] for _ in range(B)]
    for b in range(B):
        for h in range(H):
            for i in range(L):
                allowed = [j for j in range(S) if not bool(mask[b, h, i, j])]
                if not allowed:
                    continue
                distance = {j: max(-max_distance, min(max_distance, j - (query_start + i))) for j in allowed}
                e = torch.stack([(q[b, h, i] * (k[b, h, j] + rel_k[distance[j] + max_distance])).sum()
                                 for j in allowed]) / math.sqrt(d_k)
                alpha = torch.exp(e - e.max()) / torch.exp(e - e.max()).sum()
                heads[b][h][i] = sum(a * (v[b, h, j] + rel_v[distance[j] + max_distance])
                                     for a, j in zip(alpha, allowed))
                row = [torch.zeros((), dtype=q.dtype)] * S
                for a, j in zip(alpha, allowed):
                    row[j] = a
                weights[b][h][i] = torch.stack(row)
    stack = lambda nested: torch.stack([torch.stack([torch.stack(r) for r in hh]) for hh in nested])  # noqa: E731
    return stack(heads), stack(weights)


def rotate_by_formula(x, position, base=10000.0):
    """RoFormer's rotation of one vector x (d,) at ``position``, pair by pair, with Python's math."""
    d = x.shape[-1]
    out = []
    for i in range(d // 2):
        angle = position * base ** (-2 * i / d)
        c, s = math.cos(angle), math.sin(angle)
        out += [x[2 * i] * c - x[2 * i + 1] * s, x[2 * i] * s + x[2 * i + 1] * c]
    return torch.stack(out)


def rope_reference(q, k, v, mask=None, query_start=0, base=10000.0):
    """softmax(f(q_i, query_start + i) . f(k_j, j) / sqrt(d_k)) v_j, one (b, h, i) at a time."""
    B, H, L, d_k = q.shape
    S = k.shape[2]
    mask = torch.zeros(B, H, L, S, dtype=torch.bool) if mask is None else torch.broadcast_to(mask, (B, H, L, S))
    heads = torch.zeros(B, H, L, v.shape[-1], dtype=q.dtype)
    weights = torch.zeros(B, H, L, S, dtype=q.dtype)
    for b in range(B):
        for h in range(H):
            keys = [rotate_by_formula(k[b, h, j], j, base) for j in range(S)]
            for i in range(L):
                allowed = [j for j in range(S) if not bool(mask[b, h, i, j])]
                if not allowed:
                    continue
                query = rotate_by_formula(q[b, h, i], query_start + i, base)
                e = torch.stack([query @ keys[j] for j in allowed]) / math.sqrt(d_k)
                alpha = torch.softmax(e, dim=0)
                heads[b, h, i] = sum(a * v[b, h, j] for a, j in zip(alpha, allowed))
                weights[b, h, i, allowed] = alpha
    return heads, weights


# --- relative_positions ----------------------------------------------------------------------


@pytest.mark.parametrize("L, S, query_start, max_distance", [(4, 4, 0, 1), (3, 7, 4, 2), (6, 9, 3, 16), (1, 5, 0, 3)])
def test_relative_positions_matches_formula(L, S, query_start, max_distance):
    index = relative_positions(L, S, query_start=query_start, max_distance=max_distance)
    expected = torch.tensor([[min(max_distance, max(-max_distance, j - (query_start + i))) + max_distance
                              for j in range(S)] for i in range(L)])
    assert index.dtype == torch.long and index.shape == (L, S)
    assert torch.equal(index, expected)
    assert 0 <= index.min() and index.max() <= 2 * max_distance


def test_relative_positions_on_device_and_diagonal():
    index = relative_positions(5, 5, max_distance=3, device="cpu")
    assert index.device.type == "cpu"
    assert (index.diagonal() == 3).all()  # distance 0 is the middle row


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(max_distance=0), ValueError, "max_distance must be a positive int, got 0"),
    (dict(max_distance=2.5), TypeError, "max_distance must be a positive int, got float"),
    (dict(max_distance=True), TypeError, "max_distance must be a positive int, got bool"),
    (dict(query_start=-1), ValueError, "query_start must be a non-negative int, got -1"),
    (dict(query_start=1.0), TypeError, "query_start must be a non-negative int"),
])
def test_relative_positions_bad_input(kwargs, error, match):
    with pytest.raises(error, match=match):
        relative_positions(3, 3, **kwargs)
    with pytest.raises(ValueError, match="query_len must be a positive int, got 0"):
        relative_positions(0, 3)
    with pytest.raises(ValueError, match="key_len must be a positive int, got 0"):
        relative_positions(3, 0)


# --- RelativeMultiHeadAttention ------------------------------------------------------------


def test_relative_parameters_shared_by_heads():
    layer = make_relative(max_distance=3)
    assert layer.rel_k.weight.shape == layer.rel_v.weight.shape == (2 * 3 + 1, D_K)
    assert isinstance(layer.rel_k, nn.Embedding) and isinstance(layer.rel_v, nn.Embedding)
    names = {name for name, _ in layer.named_parameters()}
    assert {"rel_k.weight", "rel_v.weight"} <= names
    plain = MultiHeadAttention(D_MODEL, NUM_HEADS)
    extra = sum(p.numel() for p in layer.parameters()) - sum(p.numel() for p in plain.parameters())
    assert extra == 2 * (2 * 3 + 1) * D_K  # one table of each per layer, not per head
    assert "max_distance=3" in repr(layer)


@pytest.mark.parametrize("query_start", [0, 3])
@pytest.mark.parametrize("masked", [False, True])
def test_relative_attend_matches_shaw_equations(query_start, masked):
    layer = make_relative(max_distance=2)
    q, k, v = heads_inputs(L=5, S=5 + query_start)
    mask = None
    if masked:  # causal in absolute positions: query_start + i sees keys 0 .. query_start + i
        mask = torch.ones(5, 5 + query_start, dtype=torch.bool).triu(query_start + 1)
        mask = mask | torch.tensor([False, True] + [False] * (3 + query_start))  # and hide key 1
    heads, weights = layer.attend(q, k, v, mask, 0.0, True, query_start)
    ref_heads, ref_weights = shaw_reference(q, k, v, layer.rel_k.weight, layer.rel_v.weight, 2, mask, query_start)
    torch.testing.assert_close(heads, ref_heads)
    torch.testing.assert_close(weights, ref_weights)
    heads_only, none = layer.attend(q, k, v, mask, 0.0, False, query_start)
    assert none is None
    torch.testing.assert_close(heads_only, ref_heads)


def test_relative_module_matches_shaw_equations_with_projections():
    layer = make_relative(max_distance=1)
    torch.manual_seed(3)
    x = torch.randn(2, 5, D_MODEL)
    mask = left_padded_mask()

    def split(t):
        return t.reshape(2, 5, NUM_HEADS, D_K).transpose(1, 2)  # (B, H, N, d_k)

    ref, ref_weights = shaw_reference(split(layer.w_q(x)), split(layer.w_k(x)), split(layer.w_v(x)),
                                      layer.rel_k.weight, layer.rel_v.weight, 1, mask)
    ref = layer.w_o(ref.transpose(1, 2).reshape(2, 5, D_MODEL))
    out, weights = layer(x, x, x, mask=mask, need_weights=True)
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(weights, ref_weights)
    torch.testing.assert_close(layer(x, x, x, mask=mask), ref)


def test_relative_gradients_match_reference():
    layer = make_relative(max_distance=2)
    q, k, v = heads_inputs(requires_grad=True)
    mask = left_padded_mask()
    tables = (layer.rel_k.weight, layer.rel_v.weight)
    heads, _ = layer.attend(q, k, v, mask, 0.0, False)
    ref, _ = shaw_reference(q, k, v, *tables, 2, mask)
    weight = torch.randn_like(ref)  # a random linear function of the output
    grads = torch.autograd.grad((heads * weight).sum(), (q, k, v, *tables))
    ref_grads = torch.autograd.grad((ref * weight).sum(), (q, k, v, *tables))
    for grad, ref_grad in zip(grads, ref_grads):
        assert torch.isfinite(grad).all()
        torch.testing.assert_close(grad, ref_grad)


def test_relative_gradcheck_float64():
    layer = make_relative(max_distance=1, dtype=torch.float64)
    q, k, v = heads_inputs(B=1, L=3, S=3, dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[True, True, True], [False, False, True], [False, False, False]])  # row 0 empty
    assert torch.autograd.gradcheck(lambda q, k, v: layer.attend(q, k, v, mask, 0.0, True), (q, k, v))
    x = torch.randn(1, 3, D_MODEL, dtype=torch.float64)
    tables = tuple(t.detach().clone().requires_grad_() for t in (layer.rel_k.weight, layer.rel_v.weight))

    def through_tables(rel_k, rel_v):
        params = {"rel_k.weight": rel_k, "rel_v.weight": rel_v}
        return torch.func.functional_call(layer, params, (x, x, x), {"mask": mask})

    assert torch.autograd.gradcheck(through_tables, tables)


# --- rotary ---------------------------------------------------------------------------------


@pytest.mark.parametrize("start", [0, 7])
def test_rotary_matches_formula(start):
    torch.manual_seed(0)
    x = torch.randn(2, 5, 6, dtype=torch.float64)
    out = rotary(x, start=start, base=100.0)
    expected = torch.stack([torch.stack([rotate_by_formula(x[b, n], start + n, 100.0) for n in range(5)])
                            for b in range(2)])
    torch.testing.assert_close(out, expected)
    assert out.shape == x.shape and out.dtype == x.dtype


def test_rotary_equals_complex_multiplication():
    torch.manual_seed(0)
    x = torch.randn(3, 2, 9, 8)  # (B, H, N, d)
    position = torch.arange(4, 13, dtype=torch.float32)
    theta = 10000.0 ** (-torch.arange(0, 8, 2, dtype=torch.float32) / 8)
    z = torch.view_as_complex(x.reshape(3, 2, 9, 4, 2).contiguous())
    rotated = z * torch.polar(torch.ones(9, 4), position[:, None] * theta)
    torch.testing.assert_close(rotary(x, start=4), torch.view_as_real(rotated).reshape(3, 2, 9, 8))


def test_rotary_preserves_norms_and_start_is_a_shift():
    torch.manual_seed(0)
    x = torch.randn(2, 6, 8)
    torch.testing.assert_close(rotary(x, start=12345).norm(dim=-1), x.norm(dim=-1))
    longer = torch.cat([torch.zeros(2, 3, 8), x], dim=1)  # x at positions 3 .. 8
    torch.testing.assert_close(rotary(x, start=3), rotary(longer)[:, 3:])


def test_rotary_dot_product_depends_only_on_distance():
    torch.manual_seed(0)
    q, k = torch.randn(2, 1, 16, dtype=torch.float64)

    def score(m, n):
        return (rotary(q, start=m) * rotary(k, start=n)).sum().item()

    for m, n in [(0, 0), (3, 1), (2, 9), (40, 5)]:
        for t in (1, 17, 300):
            assert score(m, n) == pytest.approx(score(m + t, n + t), abs=1e-9)
    assert score(0, 1) != pytest.approx(score(0, 2), abs=1e-3)  # but it does depend on the distance


@pytest.mark.parametrize("query_start", [0, 2])
def test_rotary_attend_matches_reference_on_both_paths(query_start):
    layer = make_rotary()
    q, k, v = heads_inputs(L=4, S=4 + query_start)
    mask = torch.ones(4, 4 + query_start, dtype=torch.bool).triu(query_start + 1)
    mask = mask | torch.tensor([True] + [False] * (3 + query_start))  # key 0 hidden: query 0 of start 0 empty
    ref_heads, ref_weights = rope_reference(q, k, v, mask, query_start)
    heads, weights = layer.attend(q, k, v, mask, 0.0, True, query_start)
    fused, none = layer.attend(q, k, v, mask, 0.0, False, query_start)
    assert none is None
    torch.testing.assert_close(heads, ref_heads)
    torch.testing.assert_close(weights, ref_weights)
    torch.testing.assert_close(fused, ref_heads)


def test_rotary_fused_and_explicit_gradients_agree():
    layer = make_rotary()
    q, k, v = heads_inputs(requires_grad=True)
    mask = left_padded_mask()
    explicit, _ = layer.attend(q, k, v, mask, 0.0, True)
    fused, _ = layer.attend(q, k, v, mask, 0.0, False)
    for g_fused, g_explicit in zip(torch.autograd.grad(fused.square().sum(), (q, k, v)),
                                   torch.autograd.grad(explicit.square().sum(), (q, k, v))):
        assert torch.isfinite(g_fused).all()
        torch.testing.assert_close(g_fused, g_explicit)


def test_rotary_gradcheck_float64():
    layer = make_rotary(dtype=torch.float64)
    q, k, v = heads_inputs(B=1, L=3, S=3, dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[True, True, True], [False, False, True], [False, False, False]])
    assert torch.autograd.gradcheck(lambda q, k, v: layer.attend(q, k, v, mask, 0.0, True), (q, k, v))
    assert torch.autograd.gradcheck(lambda q, k, v: rotary(q, start=2) + rotary(k) * v, (q, k, v))


# --- behaviour shared by both layers --------------------------------------------------------


@pytest.mark.parametrize("name", LAYERS)
@pytest.mark.parametrize("need_weights", [True, False])
def test_empty_rows_give_zeros_and_finite_gradients(name, need_weights):
    layer = LAYERS[name]()
    torch.manual_seed(2)
    x = torch.randn(2, 5, D_MODEL, requires_grad=True)
    out = layer(x, x, x, mask=left_padded_mask(), need_weights=need_weights)
    out = out[0] if need_weights else out
    heads_zero = layer.w_o.bias.expand(2, D_MODEL)  # zero heads -> only W^O's bias is left
    torch.testing.assert_close(out[1, :2], heads_zero)
    out.square().sum().backward()
    assert torch.isfinite(x.grad).all()
    for p in layer.parameters():
        assert p.grad is None or torch.isfinite(p.grad).all()


@pytest.mark.parametrize("name", LAYERS)
def test_masked_keys_and_future_tokens_do_not_matter(name):
    layer = LAYERS[name]()
    torch.manual_seed(2)
    x = torch.randn(2, 5, D_MODEL)
    mask = left_padded_mask()
    out = layer(x, x, x, mask=mask)
    changed = x.clone()
    changed[1, :2] = torch.randn(2, D_MODEL)  # the padding of row 1
    changed[:, 4] = torch.randn(2, D_MODEL)  # the last token, in the future of every other
    out_changed = layer(changed, changed, changed, mask=mask)
    torch.testing.assert_close(out_changed[0, :4], out[0, :4])
    torch.testing.assert_close(out_changed[1, 2:4], out[1, 2:4])


@pytest.mark.parametrize("name", LAYERS)
@pytest.mark.parametrize("pieces", [[5], [3, 2], [1, 1, 1, 1, 1], [2, 3]])
def test_cache_gives_the_full_pass(name, pieces):
    layer = LAYERS[name]()
    torch.manual_seed(4)
    x = torch.randn(2, 5, D_MODEL)
    full = layer(x, x, x, mask=causal_mask(5))
    cache, outputs, start = KVCache(), [], 0
    for size in pieces:
        chunk = x[:, start:start + size]
        mask = torch.ones(size, start + size, dtype=torch.bool).triu(start + 1)  # query start + i
        outputs.append(layer(chunk, chunk, chunk, mask=mask, cache=cache))
        start += size
    assert cache.length == 5
    torch.testing.assert_close(torch.cat(outputs, dim=1), full)


def shifted_by_padding(layer, x, t, encoding=None):
    """Self-attention over x placed at positions t.., with t hidden positions in front."""
    B, N, d = x.shape
    torch.manual_seed(9)
    padded = torch.cat([torch.randn(B, t, d), x], dim=1)
    if encoding is not None:
        padded = encoding(padded)
    mask = causal_mask(t + N) | (torch.arange(t + N) < t)
    return layer(padded, padded, padded, mask=mask)[:, t:]


@pytest.mark.parametrize("name", LAYERS)
@pytest.mark.parametrize("t", [1, 5, 40])
def test_translation_equivariance(name, t):
    layer = LAYERS[name]()
    torch.manual_seed(5)
    x = torch.randn(2, 6, D_MODEL)
    with torch.no_grad():
        torch.testing.assert_close(shifted_by_padding(layer, x, t), shifted_by_padding(layer, x, 0))
        # the same shift through a cache: t hidden positions cached first, so query_start = t
        cache = KVCache()
        filler = torch.randn(2, t, D_MODEL)
        layer(filler, filler, filler, cache=cache)
        mask = (torch.arange(t + 6) < t) | torch.ones(6, t + 6, dtype=torch.bool).triu(t + 1)
        torch.testing.assert_close(layer(x, x, x, mask=mask, cache=cache), layer(x, x, x, mask=causal_mask(6)))


def test_absolute_encoding_is_not_translation_equivariant():
    torch.manual_seed(0)
    layer = MultiHeadAttention(D_MODEL, NUM_HEADS).eval()
    encoding = SinusoidalPositionalEncoding(D_MODEL, max_len=64)
    x = torch.randn(2, 6, D_MODEL)
    with torch.no_grad():
        difference = (shifted_by_padding(layer, x, 5, encoding) - shifted_by_padding(layer, x, 0, encoding)).abs()
    assert difference.max() > 1e-2


@pytest.mark.parametrize("attention", [functools.partial(RelativeMultiHeadAttention, max_distance=3),
                                       RotaryMultiHeadAttention])
def test_inside_a_causal_decoder_stack(attention):
    torch.manual_seed(0)
    decoder = Decoder(num_layers=2, d_model=D_MODEL, num_heads=NUM_HEADS, d_ff=16, dropout=0.0,
                      cross_attention=False, options=LayerOptions(norm_first=True, self_attention=attention)).eval()
    assert all(isinstance(layer.self_attn, (RelativeMultiHeadAttention, RotaryMultiHeadAttention))
               for layer in decoder.layers)
    x = torch.randn(2, 6, D_MODEL)
    full = decoder(x)
    changed = x.clone()
    changed[:, 4:] = torch.randn(2, 2, D_MODEL)
    torch.testing.assert_close(decoder(changed)[:, :4], full[:, :4])  # causal
    cache = DecoderCache(2)
    steps = [decoder(x[:, t:t + 1], cache=cache) for t in range(6)]  # one position per call
    torch.testing.assert_close(torch.cat(steps, dim=1), full)
    # left padding changes nothing for the real tokens
    tokens = torch.tensor([[0, 0, 1, 1, 1, 1]])
    padded = torch.cat([torch.randn(1, 2, D_MODEL), x[:1, :4]], dim=1)
    torch.testing.assert_close(decoder(padded, tgt_mask=padding_mask(tokens, 0))[:, 2:], full[:1, :4])


def copy_two_back_accuracy(attention, steps=100, V=8, d=16, N=12):
    """Train embedding -> one causal attention layer -> linear to output x_{t-2} at position t;
    return the accuracy on fresh sequences. The task needs relative position."""
    torch.manual_seed(0)
    model = nn.ModuleDict({"embed": nn.Embedding(V, d), "attn": attention(d, 2), "out": nn.Linear(d, V)})
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    mask = causal_mask(N)

    def predict(tokens):
        h = model["embed"](tokens)  # (B, N, d)
        return model["out"](model["attn"](h, h, h, mask=mask))  # (B, N, V)

    for _ in range(steps):
        tokens = torch.randint(V, (16, N))
        loss = nn.functional.cross_entropy(predict(tokens)[:, 2:].reshape(-1, V), tokens[:, :-2].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    tokens = torch.randint(V, (64, N))
    with torch.no_grad():
        return (predict(tokens)[:, 2:].argmax(-1) == tokens[:, :-2]).float().mean().item()


@pytest.mark.parametrize("name", LAYERS)
def test_learns_to_copy_the_token_two_back(name):
    attention = {"relative": functools.partial(RelativeMultiHeadAttention, max_distance=4),
                 "rotary": RotaryMultiHeadAttention}[name]
    assert copy_two_back_accuracy(attention) > 0.9


def test_plain_attention_cannot_copy_the_token_two_back():
    """Without positions the same model stays far from it: the test above measures the positions."""
    assert copy_two_back_accuracy(MultiHeadAttention) < 0.6


@pytest.mark.parametrize("name", LAYERS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_other_dtypes(name, dtype):
    reference = LAYERS[name]()
    layer = LAYERS[name](dtype=dtype)
    torch.manual_seed(6)
    x = torch.randn(2, 5, D_MODEL)
    mask = left_padded_mask()
    expected = reference(x, x, x, mask=mask)
    for need_weights in (True, False):
        out = layer(x.to(dtype), x.to(dtype), x.to(dtype), mask=mask, need_weights=need_weights)
        out = out[0] if need_weights else out
        assert out.dtype == dtype and torch.isfinite(out).all()
        tolerance = 1e-5 if dtype == torch.float64 else 5e-2
        torch.testing.assert_close(out.float(), expected, atol=tolerance, rtol=tolerance)


def test_relative_dropout_acts_in_training_only():
    layer = make_relative(dropout=0.5)
    torch.manual_seed(7)
    x = torch.randn(2, 5, D_MODEL)
    eval_out = layer(x, x, x)
    torch.testing.assert_close(layer(x, x, x), eval_out)
    layer.train()
    _, weights = layer(x, x, x, need_weights=True)
    assert (weights == 0).any()  # some weights dropped
    assert not torch.allclose(layer(x, x, x), eval_out)


def test_causal_relative_layer_uses_only_past_distances():
    """Under a causal mask, j - i <= 0: rows k+1 .. 2k of the tables get no gradient."""
    layer = make_relative(max_distance=3)
    torch.manual_seed(8)
    x = torch.randn(2, 7, D_MODEL)
    layer(x, x, x, mask=causal_mask(7)).square().sum().backward()
    for table in (layer.rel_k, layer.rel_v):
        assert (table.weight.grad[4:] == 0).all()
        assert (table.weight.grad[:4].abs().sum(-1) > 0).all()


# --- bad input --------------------------------------------------------------------------------


def test_bad_input_errors():
    with pytest.raises(ValueError, match="max_distance must be a positive int, got 0"):
        RelativeMultiHeadAttention(D_MODEL, NUM_HEADS, max_distance=0)
    with pytest.raises(TypeError, match="max_distance must be a positive int, got float"):
        RelativeMultiHeadAttention(D_MODEL, NUM_HEADS, max_distance=2.0)
    with pytest.raises(ValueError, match=r"d_k = d_model // num_heads must be even.*d_k=3"):
        RotaryMultiHeadAttention(12, 4)
    with pytest.raises(ValueError, match="base must be a number greater than 1, got 1"):
        RotaryMultiHeadAttention(D_MODEL, NUM_HEADS, base=1)
    with pytest.raises(TypeError, match="base must be a number greater than 1, got str"):
        RotaryMultiHeadAttention(D_MODEL, NUM_HEADS, base="10000")
    with pytest.raises(ValueError, match=r"with d even.*shape \(2, 3, 5\)"):
        rotary(torch.randn(2, 3, 5))
    with pytest.raises(ValueError, match="x must be a float tensor"):
        rotary(torch.ones(2, 3, 4, dtype=torch.long))
    with pytest.raises(ValueError, match=r"shape \(4,\)"):
        rotary(torch.randn(4))
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        rotary([[1.0, 2.0]])
    with pytest.raises(ValueError, match="start must be a non-negative int, got -1"):
        rotary(torch.randn(2, 4), start=-1)
    with pytest.raises(ValueError, match="base must be a number greater than 1"):
        rotary(torch.randn(2, 4), base=0.5)
    layer = make_relative()
    x = torch.randn(2, 5, D_MODEL)
    with pytest.raises(TypeError, match="mask must be a bool tensor"):
        layer(x, x, x, mask=torch.zeros(5, 5))
    with pytest.raises(ValueError, match=r"query must have shape \(\.\.\., \.\.\., d_model=8\)"):
        make_rotary()(torch.randn(2, 5, 6), x, x)
