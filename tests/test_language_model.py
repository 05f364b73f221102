"""Tests of transformer.tasks.language_model: the character vocabulary, the decoder-only model, training
windows, the held-out loss, training, and sampling with temperature and top-k through the cache."""

import functools
import math

import pytest
import torch
import torch.nn.functional as F

from transformer.tasks.language_model import CharVocab, evaluate_language_model, loss_by_position, random_windows
from transformer import DecoderCache, DecoderLayer, DecoderOnlyLM, LayerOptions, MultiHeadAttention, sample, train_language_model
from transformer.nn.cache import KVCache
from transformer.paths import data_file
from transformer.generation.sampling import top_k_filter

V = 11
POSITIONS = ["learned", "sinusoidal", None]


def small(position="learned", **kwargs) -> DecoderOnlyLM:
    options = dict(vocab_size=V, d_model=16, num_heads=4, d_ff=32, num_layers=2, max_len=24, dropout=0.0,
                   position=position)
    options.update(kwargs)
    torch.manual_seed(0)
    return DecoderOnlyLM(**options).eval()


@pytest.fixture
def tokens():
    return torch.randint(0, V, (3, 10), generator=torch.Generator().manual_seed(1))


# CharVocab and data_file


def test_char_vocab_round_trip():
    text = "To be, or not to be:\nthat is the question."
    vocab = CharVocab(text)
    assert vocab.itos == sorted(set(text)) and len(vocab) == len(set(text))
    ids = vocab.encode(text)
    assert ids.dtype == torch.long and ids.shape == (len(text),)
    assert vocab.decode(ids) == text
    assert vocab.decode(ids.tolist()) == text  # a list of ints works too
    assert all(vocab.itos[i] == c for i, c in zip(ids.tolist(), text))
    assert vocab.encode("").shape == (0,)


def test_char_vocab_errors():
    vocab = CharVocab("abc")
    with pytest.raises(ValueError, match="not in the vocabulary: 'dz'"):
        vocab.encode("cabdz")
    with pytest.raises(TypeError, match="text must be a str, got list"):
        vocab.encode(["a"])
    with pytest.raises(TypeError, match="text must be a str, got bytes"):
        CharVocab(b"abc")
    with pytest.raises(ValueError, match="text must hold at least one character"):
        CharVocab("")
    with pytest.raises(ValueError, match=r"ids must lie in \[0, vocab_size=3\), got ids from 0 to 3"):
        vocab.decode(torch.tensor([0, 3]))
    with pytest.raises(ValueError, match=r"ids must have shape \(S,\)"):
        vocab.decode(torch.zeros(2, 2, dtype=torch.long))
    with pytest.raises(TypeError, match="ids must hold integer token ids"):
        vocab.decode(torch.zeros(2))


def test_data_file_finds_the_text():
    path = data_file("shakespeare.txt")
    assert path.name == "shakespeare.txt" and path.parent.name == "data" and (path.parent.parent / "_toc.yml").is_file()
    text = path.read_text(encoding="utf-8")
    assert text.isascii() and text.startswith("First Citizen:\n") and text.endswith("\n")
    assert 100_000 <= len(text) <= 200_000
    with pytest.raises(FileNotFoundError, match="no data file 'missing.txt'"):
        data_file("missing.txt")


def test_data_file_outside_the_book(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match="no book"):
        data_file("shakespeare.txt")


# The model


@pytest.mark.parametrize("position", POSITIONS)
def test_shapes_and_tying(position, tokens):
    model = small(position)
    assert model(tokens).shape == (3, 10, V)
    assert model.output.weight is model.embed.weight  # the same Parameter
    assert model.position == position and model.max_len == 24 and model.vocab_size == V
    assert (model.positional_encoding is None) == (position is None)
    assert all(isinstance(layer, DecoderLayer) and layer.cross_attn is None for layer in model.decoder.layers)
    assert sum(p is model.embed.weight for p in model.parameters()) == 1  # counted once


def test_tied_output_is_the_embedding_transposed(tokens):
    model = small()
    hidden = model.decoder(model.dropout(model.positional_encoding(model.embed(tokens))))  # (B, T, d_model)
    torch.testing.assert_close(model(tokens), hidden @ model.embed.weight.T + model.output.bias)
    with torch.no_grad():
        model.embed.weight[3] += 1.0
    assert torch.equal(model.output.weight[3], model.embed.weight[3])  # changes together


@pytest.mark.parametrize("position", POSITIONS)
def test_causal(position, tokens):
    model = small(position)
    changed = tokens.clone()
    changed[:, 6] = (changed[:, 6] + 1) % V
    with torch.no_grad():
        before, after = model(tokens), model(changed)
    assert torch.equal(before[:, :6], after[:, :6])  # earlier positions: exactly unchanged
    assert not torch.allclose(before[:, 6:], after[:, 6:])


@pytest.mark.parametrize("position", POSITIONS)
@pytest.mark.parametrize("first", [1, 4])
def test_cached_incremental_logits_equal_the_full_pass(position, first, tokens):
    model = small(position)
    with torch.no_grad():
        full = model(tokens)  # (B, T, V)
        cache = model.new_cache()
        steps = [model(tokens[:, :first], cache=cache)]  # a prompt, then one token at a time
        steps += [model(tokens[:, t:t + 1], cache=cache) for t in range(first, tokens.shape[1])]
    assert isinstance(cache, DecoderCache) and cache.length == tokens.shape[1]
    torch.testing.assert_close(torch.cat(steps, dim=1), full)


@pytest.mark.parametrize("position", POSITIONS)
def test_last_gives_the_last_positions_logits_only(position, tokens):
    model = small(position).eval()
    with torch.no_grad():
        full = model(tokens)  # (B, T, V)
        last = model(tokens, last=True)  # (B, 1, V)
        cache = model.new_cache()
        prompt = model(tokens[:, :4], cache=cache, last=True)  # the prompt's pass of generation
    assert last.shape == (3, 1, V) and prompt.shape == (3, 1, V)
    torch.testing.assert_close(last, full[:, -1:])
    torch.testing.assert_close(prompt, full[:, 3:4])
    with pytest.raises(TypeError, match="last must be a bool"):
        model(tokens, last="yes")


def test_max_len_for_absolute_positions(tokens):
    for position in ("learned", "sinusoidal"):
        model = small(position, max_len=8)
        with pytest.raises(ValueError, match=r"tokens reach position 9, past the .* positions 0\.\.7 \(max_len=8\)"):
            model(tokens)
        cache = model.new_cache()
        model(tokens[:, :8], cache=cache)
        with pytest.raises(ValueError, match="max_len=8"):
            model(tokens[:, 8:9], cache=cache)  # position 8 through the cache
    long = torch.randint(0, V, (1, 40))
    assert small(None, max_len=8)(long).shape == (1, 40, V)  # no table, no limit


def test_self_attention_and_norm_choices(tokens):
    model = small(options=LayerOptions(self_attention=functools.partial(MultiHeadAttention, bias=False)))
    assert all(layer.self_attn.w_q.bias is None for layer in model.decoder.layers)
    assert model.decoder.norm is None  # post-LN: no final norm
    assert model(tokens).shape == (3, 10, V)
    assert small().decoder.norm is not None  # pre-LN (the default) ends with a LayerNorm


def test_gradients_reach_every_parameter(tokens):
    model = small(dropout=0.1).train()
    F.cross_entropy(model(tokens).flatten(0, 1), tokens.flatten()).backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, name


def test_model_errors(tokens):
    model = small()
    with pytest.raises(ValueError, match="position must be one of"):
        DecoderOnlyLM(V, position="rotary")
    with pytest.raises(ValueError, match="max_len must be a positive int"):
        DecoderOnlyLM(V, max_len=0)
    with pytest.raises(ValueError, match="vocab_size must be a positive int"):
        DecoderOnlyLM(0)
    with pytest.raises(ValueError, match=r"dropout must be in \[0, 1\)"):
        DecoderOnlyLM(V, dropout=1.0)
    with pytest.raises(ValueError, match="divisible"):
        DecoderOnlyLM(V, d_model=10, num_heads=4)
    with pytest.raises(ValueError, match=r"tokens must have shape \(B, S\)"):
        model(tokens[0])
    with pytest.raises(TypeError, match="tokens must hold integer token ids"):
        model(tokens.float())
    with pytest.raises(ValueError, match=r"tokens must lie in \[0, vocab_size=11\)"):
        model(tokens + V)
    with pytest.raises(ValueError, match="tokens must hold at least one position"):
        model(tokens[:, :0])
    with pytest.raises(TypeError, match="cache must be a DecoderCache or None, got KVCache"):
        model(tokens, cache=KVCache())


# Training windows and the held-out loss


def test_random_windows_are_shifted_slices():
    data = torch.arange(100)  # position i holds i, so a window is a run of consecutive numbers
    inputs, targets = random_windows(data, 5, 12, torch.Generator().manual_seed(0))
    assert inputs.shape == targets.shape == (5, 12) and inputs.dtype == data.dtype
    torch.testing.assert_close(inputs, inputs[:, :1] + torch.arange(12))  # consecutive
    torch.testing.assert_close(targets, inputs + 1)  # shifted by one
    assert inputs.min() >= 0 and targets.max() <= 99


def test_random_windows_reach_both_ends_and_are_deterministic():
    data = torch.arange(20)
    inputs, _ = random_windows(data, 2000, 5, torch.Generator().manual_seed(0))
    assert set(inputs[:, 0].tolist()) == set(range(15))  # every start 0 .. N - T - 1
    a = random_windows(data, 4, 5, torch.Generator().manual_seed(7))
    b = random_windows(data, 4, 5, torch.Generator().manual_seed(7))
    c = random_windows(data, 4, 5, torch.Generator().manual_seed(8))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[0], c[0])


def test_random_windows_errors():
    data = torch.arange(10)
    with pytest.raises(ValueError, match=r"data must have shape \(S,\) with S > seq_len=10, got \(10,\)"):
        random_windows(data, 2, 10)
    with pytest.raises(ValueError, match="data must have shape"):
        random_windows(data.view(2, 5), 2, 3)
    with pytest.raises(TypeError, match="data must hold integer token ids"):
        random_windows(data.float(), 2, 3)
    with pytest.raises(ValueError, match="batch_size must be a positive int"):
        random_windows(data, 0, 3)
    with pytest.raises(TypeError, match="seq_len must be a positive int"):
        random_windows(data, 2, 3.0)


def test_loss_by_position_against_the_formula():
    model = small().train()  # the mode must come back
    data = torch.randint(0, V, (53,), generator=torch.Generator().manual_seed(2))
    by_position = loss_by_position(model, data, seq_len=8, batch_size=3)  # 6 windows, in batches of 3
    assert by_position.shape == (8,) and model.training
    model.eval()
    with torch.no_grad():
        expected = torch.stack([
            F.cross_entropy(model(data[w * 8:w * 8 + 8].view(1, -1))[0], data[w * 8 + 1:w * 8 + 9], reduction="none")
            for w in range(6)]).mean(dim=0)  # (T,)
    torch.testing.assert_close(by_position, expected)
    torch.testing.assert_close(evaluate_language_model(model, data, 8), expected.mean().item())
    two = loss_by_position(model, data, seq_len=8, max_windows=2)
    torch.testing.assert_close(two, loss_by_position(model, data[:17], seq_len=8))
    with pytest.raises(ValueError, match="data must have shape"):
        loss_by_position(model, data[:8], seq_len=8)
    with pytest.raises(ValueError, match="max_windows must be a positive int"):
        loss_by_position(model, data, seq_len=8, max_windows=0)


# Training


def tiny_text_data():
    vocab = CharVocab("to be or not to be ")
    return vocab, vocab.encode("to be or not to be " * 20)


def tiny_run(seed=0, **kwargs):
    vocab, data = tiny_text_data()
    torch.manual_seed(0)
    model = DecoderOnlyLM(len(vocab), d_model=16, num_heads=2, d_ff=32, num_layers=1, max_len=16, dropout=0.1)
    options = dict(steps=120, batch_size=8, seq_len=16, lr=1e-2, warmup=10, seed=seed, progress=False)
    options.update(kwargs)
    return model, train_language_model(model, data, **options)


def test_training_learns_a_repetitive_text():
    vocab, data = tiny_text_data()
    model, history = tiny_run(valid_data=data[:100], eval_every=50)
    assert history["step"] == list(range(1, 121)) and len(history["loss"]) == len(history["lr"]) == 120
    start, end = sum(history["loss"][:5]) / 5, sum(history["loss"][-5:]) / 5
    assert start > 0.8 * math.log(len(vocab)) and end < 0.25 * start
    assert history["valid_step"] == [50, 100, 120] and history["valid_loss"][-1] < 0.25 * math.log(len(vocab))
    assert not model.training  # left in eval mode
    assert max(history["lr"]) == pytest.approx(1e-2) and history["lr"][-1] < 2e-3  # warm-up, then decay


@pytest.mark.slow  # trains twice
def test_training_is_deterministic_and_leaves_global_state_alone():
    threads, state = torch.get_num_threads(), torch.get_rng_state()
    first, a = tiny_run(seed=3)
    assert torch.get_num_threads() == threads and torch.equal(torch.get_rng_state(), state)
    second, b = tiny_run(seed=3)
    _, c = tiny_run(seed=4)
    assert a["loss"] == b["loss"] and a["loss"] != c["loss"]
    for p, q in zip(first.parameters(), second.parameters()):
        assert torch.equal(p, q)


def test_training_errors():
    _, data = tiny_text_data()
    model = small()
    for kwargs, error, match in [
        (dict(steps=0), ValueError, "steps must be a positive int"),
        (dict(warmup=0), ValueError, "warmup must be a positive int"),
        (dict(lr=0.0), ValueError, "lr must be a number > 0, got 0.0"),
        (dict(lr="fast"), TypeError, "lr must be a number > 0, got str"),
        (dict(clip=-1.0), ValueError, "clip must be a number > 0"),
        (dict(seq_len=1000), ValueError, "data must have shape"),
        (dict(batch_size=0), ValueError, "batch_size must be a positive int"),
        (dict(eval_every=0), ValueError, "eval_every must be a positive int"),
    ]:
        options = dict(steps=2, batch_size=2, seq_len=8, progress=False)
        options.update(kwargs)
        with pytest.raises(error, match=match):
            train_language_model(model, data % V, **options)


# Sampling


def test_top_k_filter_against_torch_topk():
    logits = torch.randn(4, 3, 9, generator=torch.Generator().manual_seed(0))
    for k in range(1, 9):
        best = logits.topk(k, dim=-1)
        reference = torch.full_like(logits, float("-inf")).scatter(-1, best.indices, best.values)
        assert torch.equal(top_k_filter(logits, k), reference)
    assert torch.equal(top_k_filter(logits, 9), logits) and torch.equal(top_k_filter(logits, 50), logits)
    assert torch.equal(top_k_filter(logits, None), logits)
    tied = torch.tensor([[1.0, 3.0, 3.0, 0.0]])
    assert torch.equal(top_k_filter(tied, 1), torch.tensor([[-math.inf, 3.0, 3.0, -math.inf]]))  # ties kept
    filtered = top_k_filter(logits, 2)
    assert not torch.equal(filtered, logits) and torch.isfinite(logits).all()  # the input is not changed


def test_top_k_filter_errors():
    with pytest.raises(ValueError, match="top_k must be a positive int, got 0"):
        top_k_filter(torch.randn(5), 0)
    with pytest.raises(TypeError, match="top_k must be a positive int, got float"):
        top_k_filter(torch.randn(5), 2.0)
    with pytest.raises(TypeError, match="logits must be a torch.Tensor, got list"):
        top_k_filter([1.0, 2.0], 1)


@pytest.mark.parametrize("position", POSITIONS)
def test_sample_shapes_prompt_and_cache(position):
    model = small(position)
    prompt = torch.randint(0, V, (2, 4), generator=torch.Generator().manual_seed(3))
    with_cache = sample(model, prompt, 12, temperature=1.3, top_k=6, generator=torch.Generator().manual_seed(5))
    without = sample(model, prompt, 12, temperature=1.3, top_k=6, use_cache=False,
                     generator=torch.Generator().manual_seed(5))
    assert with_cache.shape == (2, 16) and with_cache.dtype == torch.long
    assert torch.equal(with_cache[:, :4], prompt)
    assert torch.equal(with_cache, without)
    one = sample(model, prompt[0], 5, generator=torch.Generator().manual_seed(0))
    assert one.shape == (1, 9) and torch.equal(one[0, :4], prompt[0])


def test_top_k_one_is_greedy():
    model = small()
    prompt = torch.randint(0, V, (3, 2), generator=torch.Generator().manual_seed(4))
    expected = prompt
    with torch.no_grad():
        for _ in range(10):  # greedy decoding, written out: the full pass, argmax of the last position
            expected = torch.cat([expected, model(expected)[:, -1].argmax(dim=-1, keepdim=True)], dim=1)
    for use_cache in (True, False):
        got = sample(model, prompt, 10, top_k=1, temperature=0.7, use_cache=use_cache,
                     generator=torch.Generator().manual_seed(9))
        assert torch.equal(got, expected)


def test_sampled_tokens_lie_in_the_top_k():
    model = small()
    prompt = torch.randint(0, V, (8, 3), generator=torch.Generator().manual_seed(6))
    out = sample(model, prompt, 6, temperature=2.0, top_k=3, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits = model(out[:, :-1])[:, 2:]  # (B, 6, V): the scores each new token was drawn from
    allowed = logits.topk(3, dim=-1).indices  # (B, 6, 3)
    assert (allowed == out[:, 3:, None]).any(dim=-1).all()


def test_temperature_changes_the_draws_as_the_formula_says():
    model = small()
    prompt = torch.tensor([[1, 2, 3]])
    with torch.no_grad():
        z = model(prompt)[0, -1]  # (V,)
    for tau in (0.5, 2.0):
        draws = sample(model, prompt.expand(4000, -1), 1, temperature=tau, generator=torch.Generator().manual_seed(0))
        frequencies = torch.bincount(draws[:, -1], minlength=V).double() / 4000
        expected = torch.exp(z.double() / tau) / torch.exp(z.double() / tau).sum()  # the formula, written out
        assert (frequencies - expected).abs().max() < 0.03


def test_sample_keeps_the_mode_and_allows_long_output_without_positions():
    model = small(None, max_len=4).train()
    out = sample(model, torch.tensor([0, 1]), 30, generator=torch.Generator().manual_seed(0))
    assert out.shape == (1, 32) and model.training


def test_sample_errors():
    model = small(max_len=8)
    prompt = torch.tensor([1, 2, 3])
    for kwargs, error, match in [
        (dict(temperature=0), ValueError, "temperature must be a number > 0, got 0"),
        (dict(temperature=-1.0), ValueError, "temperature must be a number > 0"),
        (dict(temperature="hot"), TypeError, "temperature must be a number > 0, got str"),
        (dict(top_k=0), ValueError, "top_k must be a positive int"),
        (dict(max_new_tokens=0), ValueError, "max_new_tokens must be a positive int"),
        (dict(max_new_tokens=7), ValueError, r"max_new_tokens=7 after a prompt of 3 needs 9 positions, .*max_len=8"),
    ]:
        options = dict(max_new_tokens=2)
        options.update(kwargs)
        with pytest.raises(error, match=match):
            sample(model, prompt, **options)
    assert sample(model, prompt, 6).shape == (1, 9)  # 8 positions read: just fits
    with pytest.raises(ValueError, match=r"prompt must lie in \[0, vocab_size=11\)"):
        sample(model, torch.tensor([V]), 2)
    with pytest.raises(TypeError, match="prompt must hold integer token ids"):
        sample(model, prompt.float(), 2)
    with pytest.raises(ValueError, match=r"prompt must have shape \(P,\) or \(B, P\)"):
        sample(model, prompt.view(1, 1, 3), 2)
    with pytest.raises(ValueError, match=r"prompt must have shape \(P,\) or \(B, P\) with P >= 1"):
        sample(model, prompt[:0], 2)
