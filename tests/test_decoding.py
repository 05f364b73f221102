"""Tests of transformer.generation.decoding (greedy decoding, beam search) and of the key/value cache it uses
(KVCache in transformer.nn.multihead, DecoderLayerCache and DecoderCache in transformer.nn.decoder, the
``cache`` argument of Transformer.decode)."""

import functools
import itertools

import pytest
import torch

from transformer import (DecoderCache, DecoderLayer, LayerOptions, MultiHeadAttention, Transformer, beam_search, causal_mask,
    greedy_decode, padding_mask)
from transformer.nn.cache import DecoderLayerCache, KVCache
from factories import PAD, SRC_VOCAB, TGT_VOCAB, small_transformer

BOS, EOS = 1, 2

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

# The shared small Transformer with dropout, so that a decoding left in training mode would show.
small = functools.partial(small_transformer, dropout=0.1)


@pytest.fixture
def src():
    g = torch.Generator().manual_seed(1)
    src = torch.randint(3, SRC_VOCAB, (3, 6), generator=g)
    src[1, 4:] = PAD
    return src


def reference_greedy(model, src, src_mask, steps):
    """Greedy decoding written out: the full forward pass on the growing prefix, argmax of the last."""
    tokens = torch.full((src.shape[0], 1), BOS)
    with torch.no_grad():
        for _ in range(steps):
            logits = model(src, tokens, src_mask)  # (B, t, V)
            tokens = torch.cat([tokens, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    return tokens


def first_end(row, eos):
    """Index of the first ``eos`` after the start token in ``row``, or None."""
    ends = (row[1:] == eos).nonzero()
    return int(ends[0]) + 1 if len(ends) else None


# ---------------------------------------------------------------------------------------------
# Greedy decoding


def test_greedy_equals_the_argmax_of_the_full_forward_pass(src):
    model = small()
    src_mask = padding_mask(src, PAD)
    for use_cache in (True, False):
        tokens = greedy_decode(model, src, max_len=8, bos_id=BOS, src_mask=src_mask, use_cache=use_cache)
        assert tokens.shape == (3, 8) and tokens.dtype == torch.long
        assert (tokens[:, 0] == BOS).all()
        torch.testing.assert_close(tokens, reference_greedy(model, src, src_mask, 7))


def test_max_len_one_returns_only_the_start_token(src):
    for decode in (greedy_decode, lambda *a, **k: beam_search(*a, eos_id=EOS, **k)):
        assert torch.equal(decode(small(), src, max_len=1, bos_id=BOS), torch.full((3, 1), BOS))


def test_rows_get_padding_after_eos_and_generation_stops_when_all_rows_ended(src):
    model = small()
    free = greedy_decode(model, src, max_len=12, bos_id=BOS)  # no end token: always 12
    assert free.shape == (3, 12)
    eos = int(free[0, 3])  # pretend a token that row 0 produces is the end token
    tokens = greedy_decode(model, src, max_len=12, bos_id=BOS, eos_id=eos)
    stops = [first_end(row, eos) for row in free]
    assert stops[0] is not None
    expected_len = max(stops) + 1 if all(s is not None for s in stops) else 12
    assert tokens.shape == (3, expected_len)
    for row, full, stop in zip(tokens, free, stops):
        stop = expected_len - 1 if stop is None else stop
        assert torch.equal(row[: stop + 1], full[: stop + 1])
        assert (row[stop + 1:] == PAD).all()


def test_generation_stops_early_when_every_row_has_ended(src):
    model = small()
    with torch.no_grad():  # make EOS the most likely token everywhere: every row ends at step 1
        model.output.bias[EOS] = 100.0
    for decode in (greedy_decode, beam_search):  # the beams' live hypotheses cannot catch up
        tokens = decode(model, src, max_len=10, bos_id=BOS, eos_id=EOS)
        assert torch.equal(tokens, torch.tensor([[BOS, EOS]] * 3))


def test_pad_id_is_what_ended_rows_hold(src):
    model = small()
    free = greedy_decode(model, src, max_len=12, bos_id=BOS)
    eos = int(free[0, 2])
    tokens = greedy_decode(model, src, max_len=12, bos_id=BOS, eos_id=eos, pad_id=7)
    stop = first_end(free[0], eos)
    assert (tokens[0, stop + 1:] == 7).all()


def test_mode_is_restored_and_dropout_is_off_during_decoding(src):
    model = small().train()
    a = greedy_decode(model, src, max_len=8, bos_id=BOS)
    b = beam_search(model, src, max_len=8, bos_id=BOS, eos_id=EOS, beam_size=1)
    assert model.training
    assert torch.equal(a, greedy_decode(model, src, max_len=8, bos_id=BOS))
    assert torch.equal(a, greedy_decode(model.eval(), src, max_len=8, bos_id=BOS))
    assert torch.equal(b, beam_search(model, src, max_len=8, bos_id=BOS, eos_id=EOS, beam_size=1))


def test_mode_is_restored_after_an_error(src):
    model = small().train()
    with pytest.raises(ValueError, match="mask must broadcast"):  # raised inside, by the encoder
        greedy_decode(model, src, max_len=5, bos_id=BOS, src_mask=torch.zeros(3, 1, 1, 2, dtype=torch.bool))
    assert model.training


def test_no_gradients_are_recorded(src):
    tokens = greedy_decode(small(), src, max_len=5, bos_id=BOS)
    assert not tokens.requires_grad


# ---------------------------------------------------------------------------------------------
# The key/value cache


@pytest.mark.parametrize("norm_first", [False, True])
def test_incremental_logits_equal_the_full_forward_pass_at_every_step(src, norm_first):
    model = small(options=LayerOptions(norm_first=norm_first), num_layers=3)
    src_mask = padding_mask(src, PAD)
    tgt = torch.randint(1, TGT_VOCAB, (3, 9), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        full = model(src, tgt, src_mask)  # (B, T, V)
        memory = model.encode(src, src_mask)
        cache = DecoderCache(3)
        steps = [model.output(model.decode(tgt[:, t:t + 1], memory, src_mask, cache=cache))
                 for t in range(tgt.shape[1])]
    for t, step in enumerate(steps):
        torch.testing.assert_close(step[:, 0], full[:, t])
    assert cache.length == tgt.shape[1]


@pytest.mark.parametrize("norm_first", [False, True])
def test_cache_filled_in_chunks_equals_the_full_forward_pass(src, norm_first):
    model = small(options=LayerOptions(norm_first=norm_first))
    src_mask = padding_mask(src, PAD)
    tgt = torch.randint(1, TGT_VOCAB, (3, 9), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        full = model.decode(tgt, model.encode(src, src_mask), src_mask)
        memory = model.encode(src, src_mask)
        cache = DecoderCache(2)
        chunks = [model.decode(tgt[:, a:b], memory, src_mask, cache=cache) for a, b in [(0, 4), (4, 5), (5, 9)]]
    torch.testing.assert_close(torch.cat(chunks, dim=1), full)


def test_cache_with_a_target_padding_mask_equals_the_full_pass(src):
    model = small()
    tgt = torch.tensor([[BOS, 4, 5, 6, 7], [BOS, 4, PAD, PAD, PAD], [BOS, 8, 9, PAD, PAD]])
    tgt_mask = padding_mask(tgt, PAD)  # (B, 1, 1, T)
    with torch.no_grad():
        memory = model.encode(src)
        full = model.decode(tgt, memory, tgt_mask=tgt_mask)
        cache = DecoderCache(2)
        steps = [model.decode(tgt[:, t:t + 1], memory, tgt_mask=tgt_mask[..., :t + 1], cache=cache)
                 for t in range(5)]
    real = tgt != PAD  # padded query rows are not used; compare the real positions
    torch.testing.assert_close(torch.cat(steps, dim=1)[real], full[real])


@pytest.mark.parametrize("norm_first", [False, True])
def test_use_cache_true_and_false_give_identical_tokens(src, norm_first):
    model = small(options=LayerOptions(norm_first=norm_first))
    src_mask = padding_mask(src, PAD)
    free = greedy_decode(model, src, 15, BOS, src_mask=src_mask)
    for eos in (None, int(free[0, 4])):
        cached = greedy_decode(model, src, 15, BOS, eos, src_mask, use_cache=True)
        assert torch.equal(cached, greedy_decode(model, src, 15, BOS, eos, src_mask, use_cache=False))
        beams = beam_search(model, src, 15, BOS, int(free[1, 3]), beam_size=3, src_mask=src_mask)
        assert torch.equal(beams, beam_search(model, src, 15, BOS, int(free[1, 3]), beam_size=3,
                                              src_mask=src_mask, use_cache=False))


def test_the_cache_works_in_float64(src):
    model = small().double()
    for use_cache in (True, False):
        tokens = greedy_decode(model, src, 8, BOS, use_cache=use_cache)
        assert torch.equal(tokens, reference_greedy(model, src, None, 7))


def test_source_padding_is_masked_with_the_cache(src):
    model = small()
    src_mask = padding_mask(src, PAD)
    other = src.clone()
    other[1, 4:] = torch.tensor([5, 9])  # different tokens where the padding was
    a = greedy_decode(model, src, 10, BOS, src_mask=src_mask)
    b = greedy_decode(model, other, 10, BOS, src_mask=src_mask)
    assert torch.equal(a, b)
    with torch.no_grad():
        memory, other_memory = model.encode(src, src_mask), model.encode(other, src_mask)
        c1, c2 = DecoderCache(2), DecoderCache(2)
        for t in range(4):
            h1 = model.decode(a[:, t:t + 1], memory, src_mask, cache=c1)
            h2 = model.decode(a[:, t:t + 1], other_memory, src_mask, cache=c2)
            torch.testing.assert_close(h1, h2)


def test_a_new_token_processes_one_position_per_layer(src):
    model = small()
    seen = []
    hooks = [layer.feed_forward.register_forward_hook(lambda m, a, out: seen.append(out.shape[1]))
             for layer in model.decoder.layers]
    greedy_decode(model, src, max_len=21, bos_id=BOS, use_cache=True)
    assert seen == [1] * (20 * 2)
    seen.clear()
    greedy_decode(model, src, max_len=21, bos_id=BOS, use_cache=False)
    assert sum(seen) == 2 * sum(range(1, 21))
    for hook in hooks:
        hook.remove()


def test_kv_cache_self_attention_in_pieces_equals_one_call():
    torch.manual_seed(0)
    mha = MultiHeadAttention(d_model=8, num_heads=2).eval()
    x = torch.randn(2, 7, 8)
    cache = KVCache()
    assert cache.length == 0 and cache.key is None
    pieces, start = [], 0
    for size in (3, 1, 3):
        mask = torch.ones(size, start + size, dtype=torch.bool).triu(start + 1)  # shifted causal mask
        piece = x[:, start:start + size]
        pieces.append(mha(piece, piece, piece, mask=mask, cache=cache))
        start += size
        assert cache.length == start and cache.key.shape == (2, 2, start, 4) and cache.value.shape == (2, 2, start, 4)
    torch.testing.assert_close(torch.cat(pieces, dim=1), mha(x, x, x, mask=causal_mask(7)))


def test_kv_cache_keys_are_the_projections_of_the_inputs():
    torch.manual_seed(0)
    mha = MultiHeadAttention(d_model=8, num_heads=2)
    x = torch.randn(2, 3, 8)
    cache = KVCache()
    mha(x, x, x, cache=cache)
    expected_k = (x @ mha.w_k.weight.T + mha.w_k.bias).view(2, 3, 2, 4).transpose(1, 2)
    expected_v = (x @ mha.w_v.weight.T + mha.w_v.bias).view(2, 3, 2, 4).transpose(1, 2)
    torch.testing.assert_close(cache.key, expected_k)
    torch.testing.assert_close(cache.value, expected_v)


def test_static_cache_projects_the_memory_once_and_reuses_it():
    torch.manual_seed(0)
    mha = MultiHeadAttention(d_model=8, num_heads=2).eval()
    x, memory = torch.randn(2, 4, 8), torch.randn(2, 5, 8)
    mask = torch.tensor([False, False, False, True, True]).view(1, 1, 1, 5)
    calls = []
    hooks = [mha.w_k.register_forward_hook(lambda m, a, o: calls.append("k")),
             mha.w_v.register_forward_hook(lambda m, a, o: calls.append("v"))]
    cache = KVCache(static=True)
    steps = [mha(x[:, t:t + 1], memory, memory, mask=mask, cache=cache) for t in range(4)]
    for hook in hooks:
        hook.remove()
    assert calls == ["k", "v"] and cache.length == 5
    torch.testing.assert_close(torch.cat(steps, dim=1), mha(x, memory, memory, mask=mask))


def test_cached_attention_weights_are_the_last_row_of_the_full_weights():
    torch.manual_seed(0)
    mha = MultiHeadAttention(d_model=8, num_heads=2).eval()
    x = torch.randn(1, 5, 8)
    _, full = mha(x, x, x, mask=causal_mask(5), need_weights=True)
    cache = KVCache()
    mha(x[:, :4], x[:, :4], x[:, :4], mask=causal_mask(4), cache=cache)
    _, last = mha(x[:, 4:], x[:, 4:], x[:, 4:], need_weights=True, cache=cache)
    assert last.shape == (1, 2, 1, 5)
    torch.testing.assert_close(last, full[:, :, 4:])


def test_reorder_selects_batch_rows():
    cache = KVCache()
    cache.reorder(torch.tensor([0]))  # an empty cache: nothing to do
    key, value = torch.randn(3, 2, 4, 5), torch.randn(3, 2, 4, 5)
    cache.update(key, value)
    cache.reorder(torch.tensor([2, 2, 0]))
    torch.testing.assert_close(cache.key, key[[2, 2, 0]])
    torch.testing.assert_close(cache.value, value[[2, 2, 0]])
    decoder_cache = DecoderCache(2)
    for layer in decoder_cache.layers:
        layer.self_attn.update(key, value)
        layer.cross_attn.update(value, key)
    decoder_cache.reorder(torch.tensor([1, 0, 0]))
    for layer in decoder_cache.layers:
        torch.testing.assert_close(layer.self_attn.key, key[[1, 0, 0]])
        torch.testing.assert_close(layer.cross_attn.value, key[[1, 0, 0]])


def test_decoder_cache_structure():
    cache = DecoderCache(3)
    assert len(cache.layers) == 3 and cache.length == 0
    assert all(isinstance(layer, DecoderLayerCache) for layer in cache.layers)
    assert all(not layer.self_attn.static and layer.cross_attn.static for layer in cache.layers)
    with pytest.raises(ValueError, match="num_layers must be a positive int"):
        DecoderCache(0)


def test_cache_errors_name_what_is_wrong():
    torch.manual_seed(0)
    mha = MultiHeadAttention(d_model=8, num_heads=2)
    x = torch.randn(2, 3, 8)
    cache = KVCache()
    mha(x, x, x, cache=cache)
    with pytest.raises(ValueError, match="cache holds a batch of 2, got a batch of 3"):
        y = torch.randn(3, 1, 8)
        mha(y, y, y, cache=cache)
    static = KVCache(static=True)
    mha(x, x, x, cache=static)
    with pytest.raises(ValueError, match="cache holds a batch of 2, got a batch of 3"):
        mha(torch.randn(3, 1, 8), torch.randn(3, 3, 8), torch.randn(3, 3, 8), cache=static)
    with pytest.raises(ValueError, match="mask must broadcast"):
        short = torch.zeros(1, 2, dtype=torch.bool)  # 2 keys, but the cache makes them 4
        mha(x[:, :1], x[:, :1], x[:, :1], mask=short, cache=cache)
    with pytest.raises(TypeError, match="cache must be an AttentionCache or None, got dict"):
        mha(x, x, x, cache={})

    model = small()
    memory = model.encode(torch.full((2, 4), 3))
    with pytest.raises(TypeError, match="cache must be a StackCache or None, got list"):
        model.decode(torch.full((2, 1), BOS), memory, cache=[])
    with pytest.raises(ValueError, match="cache must have one LayerCache per layer, 2, got 3"):
        model.decode(torch.full((2, 1), BOS), memory, cache=DecoderCache(3))
    layer = DecoderLayer(d_model=16, num_heads=4, d_ff=32)
    with pytest.raises(TypeError, match="cache must be a LayerCache or None, got KVCache"):
        layer(torch.randn(2, 1, 16), memory, cache=KVCache())
    cache = DecoderCache(2)
    model.decode(torch.full((2, 3), BOS), memory, cache=cache)
    message = r"tgt_mask: mask must broadcast to the attention scores \(\.\.\., L, S\) = \(2, 4, 1, 4\)"
    with pytest.raises(ValueError, match=message):  # 3 cached positions + 1 new: 4 keys, not 2
        model.decode(torch.full((2, 1), BOS), memory, tgt_mask=torch.zeros(2, 1, 1, 2, dtype=torch.bool),
                     cache=cache)


def test_cache_refuses_positions_beyond_max_len():
    model = small(max_len=6)
    memory = model.encode(torch.full((1, 3), 3))
    cache = DecoderCache(2)
    model.decode(torch.full((1, 5), BOS), memory, cache=cache)
    model.decode(torch.full((1, 1), BOS), memory, cache=cache)  # position 5: the last one
    with pytest.raises(ValueError, match="positions up to 7 exceed max_len=6"):
        model.decode(torch.full((1, 1), BOS), memory, cache=cache)


# ---------------------------------------------------------------------------------------------
# Beam search


TGT_V_TINY = 4


def all_sequences(model, src, src_mask, steps):
    """Every generated sequence of at most ``steps`` tokens (cut after its first EOS), with log P(Y | x)."""
    found = {}
    for seq in itertools.product(range(TGT_V_TINY), repeat=steps):
        seq = list(seq)
        if EOS in seq:
            seq = seq[: seq.index(EOS) + 1]
        tgt = torch.tensor([[BOS, *seq]])
        with torch.no_grad():
            log_probs = model(src, tgt[:, :-1], src_mask).log_softmax(-1)[0]  # (|Y|, V)
        found[tuple(seq)] = sum(float(log_probs[t, token]) for t, token in enumerate(seq))
    return found


@pytest.mark.parametrize("seed", [0, 1, 2, 14])
def test_a_beam_that_holds_every_hypothesis_finds_the_best_sequence(seed):
    torch.manual_seed(seed)
    model = Transformer(SRC_VOCAB, TGT_V_TINY, d_model=16, num_heads=2, num_layers=2, d_ff=32, pad_id=PAD).eval()
    src = torch.tensor([[4, 8, 6, 5, PAD]])
    src_mask = padding_mask(src, PAD)
    steps = 3
    sequences = all_sequences(model, src, src_mask, steps)
    for alpha in (0.0, 0.6, 2.0):
        # GNMT: s(Y) = log P(Y | x) / lp(Y), lp(Y) = ((5 + |Y|) / 6) ** alpha
        expected = max(sequences, key=lambda seq: sequences[seq] / ((5 + len(seq)) / 6) ** alpha)
        found = beam_search(model, src, steps + 1, BOS, EOS, beam_size=TGT_V_TINY ** steps,
                            length_penalty=alpha, src_mask=src_mask)
        assert tuple(found[0, 1:len(expected) + 1].tolist()) == expected
        assert (found[0, len(expected) + 1:] == PAD).all()


def reference_beam_search(model, src, src_mask, k, alpha, max_len):
    """Beam search written out for one source, with lists and the full forward pass, to max_len.

    Hypotheses are (tokens, log P, |Y|, finished). A finished one is extended by PAD only, at no
    cost; all candidates are ranked by s(Y) = log P / ((5 + |Y|) / 6) ** alpha and the best k kept.
    """
    def s(hyp):
        return hyp[1] / ((5 + hyp[2]) / 6) ** alpha

    beams = [([BOS], 0.0, 0, False)]
    for _ in range(max_len - 1):
        candidates = []
        for tokens, log_p, length, done in beams:
            if done:
                candidates.append((tokens + [PAD], log_p, length, True))
                continue
            with torch.no_grad():
                log_probs = model(src, torch.tensor([tokens]), src_mask)[0, -1].log_softmax(-1)
            candidates += [(tokens + [v], log_p + float(log_probs[v]), length + 1, v == EOS)
                           for v in range(len(log_probs))]
        beams = sorted(candidates, key=s, reverse=True)[:k]
    return max(beams, key=s)[0]


@pytest.mark.parametrize("seed", [3, 5])  # seeds for which k and alpha change the result
def test_beam_search_equals_a_written_out_beam_search(seed):
    torch.manual_seed(seed)
    model = Transformer(SRC_VOCAB, TGT_VOCAB, d_model=16, num_heads=2, num_layers=2, d_ff=32, pad_id=PAD).eval()
    with torch.no_grad():
        model.output.bias[EOS] = 0.5  # so that hypotheses end at different lengths
    src = torch.tensor([[4, 8, 6, 5, 9, 10], [7, 3, 3, PAD, PAD, PAD]])
    src_mask = padding_mask(src, PAD)
    for k in (2, 3):
        for alpha in (0.0, 0.6, 1.5):
            found = beam_search(model, src, 7, BOS, EOS, beam_size=k, length_penalty=alpha, src_mask=src_mask)
            for i in range(2):
                expected = reference_beam_search(model, src[i:i + 1], src_mask[i:i + 1], k, alpha, 7)
                assert found[i].tolist() == expected[: found.shape[1]]
                assert all(token == PAD for token in expected[found.shape[1]:])


@pytest.mark.parametrize("norm_first", [False, True])
def test_beam_size_one_equals_greedy(src, norm_first):
    model = small(options=LayerOptions(norm_first=norm_first))
    src_mask = padding_mask(src, PAD)
    free = greedy_decode(model, src, 15, BOS, src_mask=src_mask)
    for eos in (int(free[0, 3]), int(free[2, 5]), EOS):
        for alpha in (0.0, 0.6):
            greedy = greedy_decode(model, src, 15, BOS, eos, src_mask)
            beams = beam_search(model, src, 15, BOS, eos, beam_size=1, length_penalty=alpha, src_mask=src_mask)
            assert torch.equal(beams, greedy)


def test_beam_search_output_format(src):
    model = small()
    free = greedy_decode(model, src, 12, BOS)
    eos = int(free[0, 3])
    tokens = beam_search(model, src, 12, BOS, eos, beam_size=4, src_mask=padding_mask(src, PAD))
    assert tokens.dtype == torch.long and tokens.shape[0] == 3 and tokens.shape[1] <= 12
    assert (tokens[:, 0] == BOS).all()
    for row in tokens:
        stop = first_end(row, eos)
        if stop is not None:
            assert (row[stop + 1:] == PAD).all()


def test_beam_search_rows_are_independent(src):
    model = small()
    src_mask = padding_mask(src, PAD)
    free = greedy_decode(model, src, 12, BOS)
    eos = int(free[0, 3])
    together = beam_search(model, src, 12, BOS, eos, beam_size=3, src_mask=src_mask)
    for i in range(3):
        alone = beam_search(model, src[i:i + 1], 12, BOS, eos, beam_size=3, src_mask=src_mask[i:i + 1])
        width = alone.shape[1]
        assert torch.equal(together[i, :width], alone[0])
        assert (together[i, width:] == PAD).all()


# ---------------------------------------------------------------------------------------------
# The paper's limit: input length + extra_len

def test_extra_len_stops_each_row_at_its_source_length_plus_extra(src):
    model = small()
    src_mask = padding_mask(src, PAD)  # row 1 has 4 real tokens, rows 0 and 2 have 6
    tokens = greedy_decode(model, src, 12, BOS, src_mask=src_mask, extra_len=2)  # no end token
    reference = reference_greedy(model, src, src_mask, 8)  # (3, 9): 8 tokens after <bos>, unlimited
    assert tokens.shape == (3, 9)
    assert torch.equal(tokens[[0, 2]], reference[[0, 2]])  # 6 + 2 = 8 generated: the whole width
    assert torch.equal(tokens[1, :7], reference[1, :7]) and (tokens[1, 7:] == PAD).all()  # 4 + 2 = 6


def test_extra_len_within_max_len_and_without_a_mask(src):
    model = small()
    capped = greedy_decode(model, src, 5, BOS, extra_len=50)  # 6 + 50 tokens allowed, max_len 5 wins
    assert torch.equal(capped, greedy_decode(model, src, 5, BOS))
    unmasked = greedy_decode(model, src, 20, BOS, extra_len=0)  # no mask: every source counts S = 6
    assert unmasked.shape == (3, 7)
    assert torch.equal(unmasked, reference_greedy(model, src, None, 6))


def test_an_end_token_still_ends_a_row_before_its_limit(src):
    model = small()
    src_mask = padding_mask(src, PAD)
    free = greedy_decode(model, src, 12, BOS, src_mask=src_mask)
    eos = int(free[2, 2])  # row 2 ends at position 2
    tokens = greedy_decode(model, src, 12, BOS, eos, src_mask=src_mask, extra_len=3)
    assert first_end(tokens[2], eos) <= 2 and (tokens[2, first_end(tokens[2], eos) + 1:] == PAD).all()
    assert (tokens[1, 1 + 4 + 3:] == PAD).all()  # row 1: at most 4 + 3 tokens after <bos>


@pytest.mark.parametrize("beam_size", [1, 3])
def test_beam_search_keeps_each_rows_limit(src, beam_size):
    model = small()
    src_mask = padding_mask(src, PAD)
    free = greedy_decode(model, src, 15, BOS, src_mask=src_mask)
    eos = int(free[0, 3])
    beams = beam_search(model, src, 15, BOS, eos, beam_size=beam_size, src_mask=src_mask, extra_len=1)
    for row, limit in zip(beams, (7, 5, 7)):  # source lengths 6, 4, 6, plus 1
        stop = first_end(row, eos)
        generated = (stop if stop is not None else int((row != PAD).sum()) - 1)
        assert generated <= limit and (row[1 + limit:] == PAD).all()
    if beam_size == 1:  # a beam of one is greedy decoding, the limit included
        assert torch.equal(beams, greedy_decode(model, src, 15, BOS, eos, src_mask, extra_len=1))


@pytest.mark.parametrize("extra_len", [-1, 1.5, True, "50"])
def test_bad_extra_len_is_refused(src, extra_len):
    with pytest.raises(ValueError, match="extra_len must be None or an int >= 0"):
        greedy_decode(small(), src, 5, BOS, extra_len=extra_len)
    with pytest.raises(ValueError, match="extra_len must be None or an int >= 0"):
        beam_search(small(), src, 5, BOS, EOS, extra_len=extra_len)


def test_beam_search_accepts_a_broadcast_mask_or_none(src):
    model = small()
    full = src.clone()
    full[1, 4:] = 5
    free = greedy_decode(model, full, 12, BOS)
    eos = int(free[0, 3])
    a = beam_search(model, full, 12, BOS, eos, beam_size=3)
    b = beam_search(model, full, 12, BOS, eos, beam_size=3, src_mask=torch.zeros(1, 1, 1, 6, dtype=torch.bool))
    assert torch.equal(a, b)


# ---------------------------------------------------------------------------------------------
# Bad input


def test_max_len_beyond_the_positional_table_is_refused(src):
    for decode in (greedy_decode, lambda *a, **k: beam_search(*a, eos_id=EOS, **k)):
        with pytest.raises(ValueError, match="max_len must be at most the model's max_len=20, got 21"):
            decode(small(max_len=20), src, max_len=21, bos_id=BOS)
        assert decode(small(max_len=20), src, max_len=20, bos_id=BOS).shape[1] <= 20


@pytest.mark.parametrize("max_len", [0, -3])
def test_max_len_below_one_is_refused(src, max_len):
    with pytest.raises(ValueError, match="max_len must be a positive int"):
        greedy_decode(small(), src, max_len=max_len, bos_id=BOS)
    with pytest.raises(ValueError, match="max_len must be a positive int"):
        beam_search(small(), src, max_len=max_len, bos_id=BOS, eos_id=EOS)


def test_max_len_must_be_an_int(src):
    with pytest.raises(TypeError, match="max_len must be a positive int"):
        greedy_decode(small(), src, max_len=5.0, bos_id=BOS)


@pytest.mark.parametrize("name", ["bos_id", "eos_id", "pad_id"])
@pytest.mark.parametrize("value", [-1, TGT_VOCAB])
def test_token_ids_outside_the_target_vocabulary_are_refused(src, name, value):
    kwargs = dict(bos_id=BOS, eos_id=EOS)
    kwargs[name] = value
    message = rf"{name} must be a token id in the target vocabulary \[0, {TGT_VOCAB}\), got {value}"
    with pytest.raises(ValueError, match=message):
        greedy_decode(small(), src, max_len=5, **kwargs)
    with pytest.raises(ValueError, match=message):
        beam_search(small(), src, max_len=5, **kwargs)


def test_non_int_token_id_is_refused(src):
    with pytest.raises(TypeError, match="bos_id must be an int token id"):
        greedy_decode(small(), src, max_len=5, bos_id=1.0)
    with pytest.raises(TypeError, match="eos_id must be an int token id"):
        beam_search(small(), src, max_len=5, bos_id=BOS, eos_id=None)


@pytest.mark.parametrize("beam_size, error", [(0, ValueError), (-2, ValueError), (2.0, TypeError)])
def test_beam_size_below_one_is_refused(src, beam_size, error):
    with pytest.raises(error, match="beam_size must be a positive int"):
        beam_search(small(), src, max_len=5, bos_id=BOS, eos_id=EOS, beam_size=beam_size)


@pytest.mark.parametrize("alpha, error", [(-0.1, ValueError), (float("nan"), ValueError), ("0.6", TypeError)])
def test_bad_length_penalty_is_refused(src, alpha, error):
    with pytest.raises(error, match="length_penalty must be a number >= 0"):
        beam_search(small(), src, max_len=5, bos_id=BOS, eos_id=EOS, length_penalty=alpha)


@pytest.mark.parametrize("bad, error, message", [
    (torch.ones(3, 6), TypeError, "src must hold integer token ids"),
    (torch.ones(6, dtype=torch.long), ValueError, r"src must have shape \(B, S\)"),
    (torch.ones(1, 3, 6, dtype=torch.long), ValueError, r"src must have shape \(B, S\)"),
    ([[3, 4]], TypeError, "src must be a torch.Tensor"),
    (torch.full((2, 3), SRC_VOCAB), ValueError, r"src must lie in \[0, vocab_size=13\)"),
])
def test_src_must_be_a_batch_of_source_ids(bad, error, message):
    with pytest.raises(error, match=message):
        greedy_decode(small(), bad, max_len=5, bos_id=BOS)
    with pytest.raises(error, match=message):
        beam_search(small(), bad, max_len=5, bos_id=BOS, eos_id=EOS)


def test_generation_misuse_gets_clear_errors_issue_13():
    from transformer import DecoderOnlyLM, Transformer, beam_search, greedy_decode, sample

    torch.manual_seed(0)
    model = Transformer(7, 7, d_model=8, num_heads=2, num_layers=1, d_ff=16, dropout=0.0, max_len=10)
    lm = DecoderOnlyLM(7, d_model=8, num_heads=2, d_ff=16, num_layers=1, max_len=10, dropout=0.0)
    with pytest.raises(ValueError, match=r"src must hold at least one sequence, got shape \(0, 3\)"):
        beam_search(model, torch.zeros(0, 3, dtype=torch.long), 5, bos_id=1, eos_id=2)
    with pytest.raises(ValueError, match=r"src must hold at least one sequence"):
        greedy_decode(model, torch.zeros(0, 3, dtype=torch.long), 5, bos_id=1)
    with pytest.raises(TypeError, match="model must be an encoder-decoder model .* got DecoderOnlyLM; "
                                        "a decoder-only model generates with sample"):
        greedy_decode(lm, torch.ones(1, 3, dtype=torch.long), 5, bos_id=1)
    with pytest.raises(TypeError, match="model must be a DecoderOnlyLM, got Transformer; an encoder-decoder"):
        sample(model, torch.ones(1, 3, dtype=torch.long), 2)
    ids = torch.tensor([[3, 4, 5]])
    torch.testing.assert_close(greedy_decode(model, ids.to(torch.uint8), 5, bos_id=1),
                               greedy_decode(model, ids, 5, bos_id=1))


def test_generated_ids_drop_bos_and_cut_at_the_first_eos():
    from transformer.generation.decoding import generated_ids

    tokens = torch.tensor([[1, 5, 6, 2, 7, 2],    # <bos> 5 6 <eos> ...: what follows <eos> is not said
                           [1, 2, 9, 9, 9, 9],    # ends at once: nothing
                           [1, 8, 8, 8, 8, 8]])   # never ends: every generated id
    assert generated_ids(tokens, eos_id=2) == [[5, 6], [], [8, 8, 8, 8, 8]]
    # a row cut at its own limit is filled with <pad> (0) after it: pad_id drops the filler only
    cut = torch.tensor([[1, 0, 5, 0, 0], [1, 5, 6, 2, 0], [1, 5, 6, 7, 8]])
    assert generated_ids(cut, eos_id=2) == [[0, 5, 0, 0], [5, 6], [5, 6, 7, 8]]
    assert generated_ids(cut, eos_id=2, pad_id=0) == [[0, 5], [5, 6], [5, 6, 7, 8]]


def test_preallocated_cache_writes_in_place_and_equals_appending():
    torch.manual_seed(0)
    key, value = torch.randn(2, 2, 5, 4), torch.randn(2, 2, 5, 4)
    cache = KVCache(capacity=8)
    cache.update(key[:, :, :2], value[:, :, :2])
    buffer = cache._key
    for t in range(2, 5):
        cache.update(key[:, :, t:t + 1], value[:, :, t:t + 1])
    assert cache._key is buffer and buffer.shape == (2, 2, 8, 4)  # allocated once, written in place
    assert torch.equal(cache.key, key) and torch.equal(cache.value, value)  # the reference: torch.cat
    grown = KVCache()  # no capacity: grows by doubling, same contents
    for t in range(5):
        grown.update(key[:, :, t:t + 1], value[:, :, t:t + 1])
    assert torch.equal(grown.key, key) and grown.length == 5


def test_beam_search_shares_cross_attention_keys_by_source(src):
    model = small()
    src_mask = padding_mask(src, PAD)
    calls = []
    hook = model.decoder.layers[0].cross_attn.w_k.register_forward_hook(
        lambda module, args, output: calls.append(args[0].shape[0]))
    with_cache = beam_search(model, src, 10, BOS, EOS, beam_size=3, src_mask=src_mask)
    hook.remove()
    assert calls == [src.shape[0]]  # projected once, for the B sources, not B * k rows
    assert torch.equal(with_cache, beam_search(model, src, 10, BOS, EOS, beam_size=3, src_mask=src_mask,
                                               use_cache=False))


@pytest.mark.parametrize("shape, k", [((5, 3001), 4), ((2, 3, 4096), 4), ((7, 58101), 4), ((4, 1000), 3),
                                      ((3, 300), 4), ((6, 40), 5)])
def test_top_k_equals_topk(shape, k):
    """Beam search's top-k (block maxima first, issue 35) gives what ``topk`` gives: the same values,
    best first, and the same indices (no equal values here), also where the last block is short and
    where a short axis takes ``topk`` itself."""
    from transformer.generation.topk import block_top_k

    x = torch.randn(shape, generator=torch.Generator().manual_seed(0)) * 4
    x[..., -1] = x.amax(dim=-1) + 1  # the best value in the short last block
    values, indices = block_top_k(x, k)
    expected = x.topk(k, dim=-1)
    assert torch.equal(values, expected.values) and torch.equal(indices, expected.indices)


def test_new_scoring_equals_the_old_formula():
    """Issue 35: beam search normalises the logits in place and ranks with ``block_top_k``; its tokens equal
    those of the old formula, a ``log_softmax`` written out and ``topk`` over it, on a vocabulary long
    enough for the block search (the other tests' vocabularies take ``topk`` itself)."""
    from transformer.generation import decoding

    model = small_transformer(tgt_vocab_size=3000, seed=2)
    src = torch.randint(3, SRC_VOCAB, (3, 6), generator=torch.Generator().manual_seed(4))
    src[1, 4:] = PAD
    logits = torch.randn(6, 3000, generator=torch.Generator().manual_seed(5)) * 3
    values, indices = decoding.block_top_k(torch.log_softmax(logits.clone(), -1, out=logits.clone()), 4)
    old = logits.log_softmax(-1).topk(4, dim=-1)
    assert torch.equal(values, old.values) and torch.equal(indices, old.indices)
    found = beam_search(model, src, 12, BOS, EOS, beam_size=4, src_mask=padding_mask(src, PAD))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(decoding, "block_top_k", lambda x, k: x.topk(k, dim=-1))  # the old formula
        patch.setattr(torch, "log_softmax", lambda x, dim, out=None: x.log_softmax(dim))
        expected = beam_search(model, src, 12, BOS, EOS, beam_size=4, src_mask=padding_mask(src, PAD))
    assert torch.equal(found, expected)


def test_reorder_through_spare_buffers_equals_indexing():
    """KVCache.reorder gathers into a spare pair of buffers that trade places (issue 35): many reorders,
    writes in between, growth past the capacity and a smaller batch all equal plain indexing."""
    cache, g = KVCache(capacity=4), torch.Generator().manual_seed(0)
    keys = values = None
    for step in range(7):
        key, value = torch.randn(6, 2, 1, 3, generator=g), torch.randn(6, 2, 1, 3, generator=g)
        cache.update(key, value)  # the 5th write grows the buffers past the capacity
        keys = key if keys is None else torch.cat([keys, key], dim=2)
        values = value if values is None else torch.cat([values, value], dim=2)
        index = torch.randint(0, 6, (6,), generator=g)
        cache.reorder(index)
        keys, values = keys[index], values[index]
        assert torch.equal(cache.key, keys) and torch.equal(cache.value, values)
    cache.reorder(torch.tensor([4, 1]))  # rows leave: a batch of 2
    cache.update(torch.zeros(2, 2, 1, 3), torch.ones(2, 2, 1, 3))
    cache.reorder(torch.tensor([1, 1]))
    assert torch.equal(cache.key[:, :, :-1], keys[[4, 1]][[1, 1]]) and torch.equal(cache.value[:, :, -1:], torch.ones(2, 2, 1, 3))
