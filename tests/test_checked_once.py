"""Arguments are checked once, at the public boundary (issue 43): a stack checks its input and masks
with its first layer's ``check_inputs`` and calls every layer with ``checked=True``, so the number of
checks of one call does not grow with the number of layers N. The calls are counted by wrapping every
binding of the check functions in the package's modules."""

import sys
from collections import Counter

import pytest
import torch

import transformer.checks
import transformer.nn.attention
from transformer import DecoderOnlyLM, Transformer, padding_mask
from transformer.generation.decoding import DecoderState
from transformer.nn.attention import causal_mask
from transformer.nn.decoder import Decoder, DecoderLayer
from transformer.nn.encoder import Encoder, EncoderLayer
from transformer.nn.multihead import MultiHeadAttention

#: The checks of features, dtypes and masks, the ones a layer used to repeat.
CHECKS = {name: getattr(transformer.checks, name) for name in
          ("check_features", "check_dtype", "check_tensor", "check_token_batch")}
CHECKS["check_attention_mask"] = transformer.nn.attention.check_attention_mask


@pytest.fixture
def counted(monkeypatch):
    """A Counter of the calls to every function of ``CHECKS``, wherever a module of the package bound it."""
    calls: Counter = Counter()

    def counting(name, check):
        def wrapper(*args, **kwargs):
            calls[name] += 1
            return check(*args, **kwargs)
        return wrapper

    for module_name, module in list(sys.modules.items()):
        if module_name.split(".")[0] != "transformer" or module is None:
            continue
        for name, check in CHECKS.items():
            if getattr(module, name, None) is check:
                monkeypatch.setattr(module, name, counting(name, check))
    return calls


def translator(num_layers: int) -> Transformer:
    torch.manual_seed(0)
    return Transformer(13, 11, d_model=16, num_heads=2, num_layers=num_layers, d_ff=32, pad_id=0).eval()


def batch():
    src = torch.tensor([[3, 4, 5, 6, 7], [8, 9, 10, 0, 0]])  # (B, S), the second row padded
    tgt = torch.tensor([[1, 4, 5, 6], [1, 7, 8, 0]])  # (B, T)
    return src, tgt, padding_mask(src, 0), padding_mask(tgt, 0)


def forward_checks(counted, num_layers: int) -> Counter:
    model = translator(num_layers)
    src, tgt, src_mask, tgt_mask = batch()
    counted.clear()
    with torch.no_grad():
        model(src, tgt, src_mask, tgt_mask)
    return Counter(counted)


def test_one_forward_checks_each_mask_once_whatever_the_depth(counted):
    shallow, deep = forward_checks(counted, 1), forward_checks(counted, 4)
    assert shallow == deep  # nothing is checked per layer
    # src_mask once in encode (B, H, S, S) and once in decode (B, H, T, S), tgt_mask once: no mask again
    assert deep["check_attention_mask"] == 3
    assert deep["check_token_batch"] == 2  # src and tgt
    # encode: the positional encoding's input, the stack's x; decode: the same two for the target,
    # and the memory twice (decode's own check, for its batch-size message, then the stack's)
    assert deep["check_features"] == 6 and deep["check_dtype"] == 3  # x, then x and memory


def step_checks(counted, num_layers: int) -> Counter:
    """The checks of one cached decoding step, after the first."""
    model = translator(num_layers)
    src, tgt, src_mask, _ = batch()
    with torch.no_grad():
        state = DecoderState(model, model.encode(src, src_mask), src_mask, max_len=8)
        state.next_logits(tgt[:, :1])
        counted.clear()
        state.next_logits(tgt[:, :2])  # feeds the one new token, after the cached one
    assert state.cache is not None and state.cache.length == 2
    return Counter(counted)


def test_one_cached_decoding_step_checks_the_source_mask_once_whatever_the_depth(counted):
    shallow, deep = step_checks(counted, 1), step_checks(counted, 6)
    assert shallow == deep
    assert deep["check_attention_mask"] == 1  # the source mask; 2N + 1 times before issue 43


@pytest.mark.parametrize("build, inputs", [
    (lambda n: Encoder(n, 8, 2, 16), lambda: (torch.randn(2, 5, 8), torch.zeros(2, 1, 1, 5, dtype=torch.bool))),
    (lambda n: Decoder(n, 8, 2, 16), lambda: (torch.randn(2, 4, 8), torch.randn(2, 5, 8), causal_mask(4),
                                              torch.zeros(2, 1, 1, 5, dtype=torch.bool))),
])
def test_a_stack_called_directly_checks_once_whatever_the_depth(counted, build, inputs):
    found = []
    for num_layers in (1, 3):
        stack, args = build(num_layers), inputs()
        counted.clear()
        stack(*args)
        found.append(Counter(counted))
    assert found[0] == found[1] and found[1]["check_attention_mask"] == len(args) - 1 - isinstance(stack, Decoder)


def test_a_decoder_only_model_checks_once_whatever_the_depth(counted):
    found = []
    for num_layers in (1, 3):
        torch.manual_seed(0)
        model, tokens = DecoderOnlyLM(11, d_model=8, num_heads=2, d_ff=16, num_layers=num_layers).eval(), torch.tensor([[1, 2, 3]])
        cache = model.new_cache()
        model(tokens, cache=cache)
        counted.clear()
        model(torch.tensor([[4]]), cache=cache)
        found.append(Counter(counted))
    assert found[0] == found[1] and found[1]["check_features"] == 1


def test_forward_hooks_on_inner_modules_still_fire():
    model = translator(3)
    src, tgt, src_mask, tgt_mask = batch()
    seen = []
    hooks = [module.register_forward_hook(lambda m, args, out: seen.append(type(m).__name__))
             for layer in (*model.encoder.layers, *model.decoder.layers)
             for module in (layer.self_attn, layer.feed_forward, layer.norm1)]
    try:
        with torch.no_grad():
            model(src, tgt, src_mask, tgt_mask)
    finally:
        for hook in hooks:
            hook.remove()
    assert Counter(seen) == {"MultiHeadAttention": 6, "PositionwiseFeedForward": 6, "LayerNorm": 6}


def test_a_layer_or_an_attention_called_directly_still_checks_its_arguments():
    x = torch.randn(2, 5, 8)
    bad_mask = torch.zeros(2, 1, 1, 6, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"mask must broadcast .*\(2, 2, 5, 5\), got shape \(2, 1, 1, 6\)"):
        EncoderLayer(8, 2, 16)(x, mask=bad_mask)
    with pytest.raises(ValueError, match=r"tgt_mask: mask must broadcast"):
        DecoderLayer(8, 2, 16)(x, torch.randn(2, 6, 8), tgt_mask=bad_mask)
    with pytest.raises(TypeError, match="mask must be a bool tensor"):
        MultiHeadAttention(8, 2)(x, x, x, mask=causal_mask(5).float())
    with pytest.raises(TypeError, match="x must have the dtype of the module's parameters"):
        EncoderLayer(8, 2, 16)(x.double())


def test_the_model_names_its_cache_and_no_class_registers_itself():
    from transformer.nn.cache import DecoderCache
    from transformer.nn.decoder import GenerationCache

    assert not hasattr(GenerationCache, "default")
    model = translator(2)
    cache = model.new_cache(capacity=5)
    assert type(cache) is DecoderCache and len(cache.layers) == 2 and cache.length == 0
    src, _, src_mask, _ = batch()
    assert isinstance(DecoderState(model, model.encode(src, src_mask), src_mask).cache, DecoderCache)
    assert DecoderState(model, model.encode(src, src_mask), src_mask, use_cache=False).cache is None


def test_attention_maps_read_through_hooks_still_find_every_layer():
    from transformer.book.reading import ATTENTION_KINDS, attention_maps

    model = translator(2)
    src, tgt, src_mask, tgt_mask = batch()
    maps = attention_maps(model, src, tgt, src_mask, tgt_mask)  # replays each hooked call, checked=True kept
    assert sorted(maps) == sorted((kind, i) for kind in ATTENTION_KINDS for i in range(2))
    assert maps["cross-attention", 1].shape == (2, 2, 4, 5)  # (B, H, T, S)
    assert (maps["cross-attention", 1][1, :, :, 3:] == 0).all()  # the source's padding gets no weight
