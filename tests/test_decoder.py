"""Tests for transformer/nn/decoder.py (chapters/decoder.md)."""

import pytest
import torch
from torch import nn

from transformer.interop.torch_nn import torch_names
from transformer.nn.attention import causal_mask, padding_mask
from transformer.nn.decoder import Decoder, DecoderLayer
from transformer.nn.encoder import LayerOptions
from transformer.nn.feedforward import PositionwiseFeedForward
from transformer.nn.multihead import MultiHeadAttention
from transformer.nn.residual import LayerNorm
from factories import D_FF, D_MODEL, NUM_HEADS, random_module
from torch_reference import assert_same_values_and_grads, torch_counterpart

B, T, S = 2, 5, 6


def batch(seed=1, requires_grad=False):
    """Target x (B, T, d), memory (B, S, d), and right-padded target and source tokens (pad id 0)."""
    torch.manual_seed(seed)
    x = torch.randn(B, T, D_MODEL, requires_grad=requires_grad)
    memory = torch.randn(B, S, D_MODEL, requires_grad=requires_grad)
    tgt = torch.tensor([[9, 10, 11, 12, 13], [9, 10, 11, 0, 0]])
    src = torch.tensor([[3, 4, 5, 6, 7, 8], [3, 4, 5, 6, 0, 0]])
    return x, memory, tgt, src


# --- structure --------------------------------------------------------------------------------


def test_layer_submodules():
    layer = DecoderLayer(D_MODEL, NUM_HEADS, D_FF, dropout=0.2, options=LayerOptions(norm_first=True))
    for attn in (layer.self_attn, layer.cross_attn):
        assert isinstance(attn, MultiHeadAttention)
        assert attn.num_heads == NUM_HEADS and attn.dropout == 0.0  # the paper's dropout only
    assert layer.self_attn is not layer.cross_attn
    assert isinstance(layer.feed_forward, PositionwiseFeedForward)
    assert layer.feed_forward.w_1.weight.shape == (D_FF, D_MODEL)
    assert layer.feed_forward.dropout.p == 0.0
    for norm in (layer.norm1, layer.norm2, layer.norm3):
        assert isinstance(norm, LayerNorm)
    for dropout in (layer.dropout1, layer.dropout2, layer.dropout3):
        assert isinstance(dropout, nn.Dropout) and dropout.p == 0.2
    assert len({id(d) for d in (layer.dropout1, layer.dropout2, layer.dropout3)}) == 3
    assert layer.norm_first is True and DecoderLayer(D_MODEL, NUM_HEADS, D_FF).norm_first is False


# --- shapes -----------------------------------------------------------------------------------


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("lengths", [(1, 1), (5, 6), (7, 3)])
def test_shapes(norm_first, lengths):
    t, s = lengths
    x, memory = torch.randn(3, t, D_MODEL), torch.randn(3, s, D_MODEL)
    layer = DecoderLayer(D_MODEL, NUM_HEADS, D_FF, options=LayerOptions(norm_first=norm_first))
    decoder = Decoder(2, D_MODEL, NUM_HEADS, D_FF, options=LayerOptions(norm_first=norm_first))
    assert layer(x, memory).shape == (3, t, D_MODEL)
    assert decoder(x, memory).shape == (3, t, D_MODEL)


def test_stack_is_its_layers_in_turn_all_reading_the_same_memory():
    decoder = random_module(Decoder).eval()
    x, memory, tgt, src = batch()
    tgt_mask, memory_mask = padding_mask(tgt, 0), padding_mask(src, 0)
    h = x
    for layer in decoder.layers:
        h = layer(h, memory, tgt_mask=tgt_mask, memory_mask=memory_mask)
    torch.testing.assert_close(decoder(x, memory, tgt_mask=tgt_mask, memory_mask=memory_mask), h)


# --- agreement with torch.nn --------------------------------------------------------------------


@pytest.mark.parametrize("module_class", [DecoderLayer, Decoder], ids=["layer", "stack"])
@pytest.mark.parametrize("norm_first", [False, True], ids=["post_ln", "pre_ln"])
@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "padded"])
def test_values_and_gradients_match_torch(module_class, norm_first, padded):
    ours = random_module(module_class, norm_first)
    ref = torch_counterpart(ours, D_MODEL, NUM_HEADS, D_FF)
    x, memory, tgt, src = batch(requires_grad=True)
    tgt_mask = padding_mask(tgt, 0) if padded else None
    memory_mask = padding_mask(src, 0) if padded else None
    kwargs = dict(tgt_key_padding_mask=tgt == 0, memory_key_padding_mask=src == 0) if padded else {}
    assert_same_values_and_grads(
        ours, ref, (x, memory),
        lambda x, m: ours(x, m, tgt_mask=tgt_mask, memory_mask=memory_mask),
        lambda x, m: ref(x, m, tgt_mask=causal_mask(T), **kwargs),
    )


# --- the causal mask is always applied ------------------------------------------------------------


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("t", range(T - 1))
def test_future_target_tokens_do_not_change_earlier_outputs(norm_first, t):
    decoder = random_module(Decoder, norm_first).eval()
    x, memory, _, _ = batch()
    changed = x.clone()
    changed[:, t + 1:] = 10 * torch.randn(B, T - t - 1, D_MODEL)  # everything after position t
    # No tgt_mask is passed: the causal mask is built in.
    torch.testing.assert_close(decoder(changed, memory)[:, :t + 1], decoder(x, memory)[:, :t + 1])
    assert not torch.allclose(decoder(changed, memory)[:, t + 1:], decoder(x, memory)[:, t + 1:])


def test_tgt_mask_only_adds_masking():
    decoder = random_module(Decoder).eval()
    x, memory, tgt, _ = batch()
    none = decoder(x, memory)
    torch.testing.assert_close(decoder(x, memory, tgt_mask=causal_mask(T)), none)
    nothing = torch.zeros(T, T, dtype=torch.bool)  # a mask that allows everything still cannot unmask
    torch.testing.assert_close(decoder(x, memory, tgt_mask=nothing), none)
    # With target padding, changing the future still does not change the past.
    tgt_mask = padding_mask(tgt, 0)
    changed = x.clone()
    changed[:, 3:] = torch.randn(B, 2, D_MODEL)
    torch.testing.assert_close(decoder(changed, memory, tgt_mask=tgt_mask)[:, :3],
                               decoder(x, memory, tgt_mask=tgt_mask)[:, :3])


def test_one_parallel_pass_equals_passes_over_growing_prefixes():
    decoder = random_module(Decoder).eval()
    x, memory, _, src = batch()
    memory_mask = padding_mask(src, 0)
    one_pass = decoder(x, memory, memory_mask=memory_mask)
    steps = [decoder(x[:, :t], memory, memory_mask=memory_mask)[:, -1] for t in range(1, T + 1)]
    torch.testing.assert_close(one_pass, torch.stack(steps, dim=1))


# --- masks on the memory and the target ------------------------------------------------------------


@pytest.mark.parametrize("norm_first", [False, True])
def test_padded_memory_positions_do_not_change_outputs(norm_first):
    decoder = random_module(Decoder, norm_first).eval()
    x, memory, _, src = batch()
    memory_mask = padding_mask(src, 0)
    changed = memory.clone()
    changed[1, 4:] = 50 * torch.randn(2, D_MODEL)
    torch.testing.assert_close(decoder(x, changed, memory_mask=memory_mask),
                               decoder(x, memory, memory_mask=memory_mask))
    assert not torch.allclose(decoder(x, changed)[1], decoder(x, memory)[1])  # unmasked, it leaks


def test_padded_target_positions_do_not_change_real_outputs():
    decoder = random_module(Decoder).eval()
    x, memory, tgt, _ = batch()
    tgt_mask = padding_mask(tgt, 0)
    changed = x.clone()
    changed[1, 3:] = 50 * torch.randn(2, D_MODEL)
    real = tgt != 0
    torch.testing.assert_close(decoder(changed, memory, tgt_mask=tgt_mask)[real],
                               decoder(x, memory, tgt_mask=tgt_mask)[real])


def test_query_with_nothing_to_attend_gives_finite_values_and_gradients():
    # Left padding under the causal mask: the first target query of row 1 may attend to nothing.
    decoder = random_module(Decoder)
    x, memory, _, _ = batch(requires_grad=True)
    tgt = torch.tensor([[9, 10, 11, 12, 13], [0, 9, 10, 11, 12]])
    out = decoder(x, memory, tgt_mask=padding_mask(tgt, 0))
    assert torch.isfinite(out).all()
    (out * torch.randn_like(out)).sum().backward()
    assert torch.isfinite(x.grad).all() and torch.isfinite(memory.grad).all()
    assert all(torch.isfinite(p.grad).all() for p in decoder.parameters())


# --- training behaviour ---------------------------------------------------------------------------


@pytest.mark.parametrize("norm_first", [False, True])
def test_gradients_reach_every_parameter_and_the_memory(norm_first):
    decoder = Decoder(3, D_MODEL, NUM_HEADS, D_FF, dropout=0.0, options=LayerOptions(norm_first=norm_first))
    x, memory, tgt, src = batch(requires_grad=True)
    out = decoder(x, memory, tgt_mask=padding_mask(tgt, 0), memory_mask=padding_mask(src, 0))
    (out * torch.randn_like(out)).sum().backward()
    for name, p in decoder.named_parameters():
        assert p.grad is not None, name
        assert torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, name
    assert memory.grad.abs().sum() > 0 and (memory.grad[1, 4:] == 0).all()  # padding gets none


def test_float64():
    decoder = random_module(Decoder, norm_first=True).eval()
    x, memory, tgt, _ = batch()
    out = decoder(x, memory, tgt_mask=padding_mask(tgt, 0))
    out64 = decoder.double()(x.double(), memory.double(), tgt_mask=padding_mask(tgt, 0))
    assert out64.dtype == torch.float64
    torch.testing.assert_close(out64.float(), out, atol=1e-5, rtol=1e-5)


# --- bad input ------------------------------------------------------------------------------------


@pytest.mark.parametrize("module", [
    lambda: DecoderLayer(D_MODEL, NUM_HEADS, D_FF), lambda: Decoder(2, D_MODEL, NUM_HEADS, D_FF),
])
def test_bad_inputs(module):
    decoder = module()
    x, memory, tgt, src = batch()
    with pytest.raises(ValueError, match=r"memory must have shape \(\.\.\., \.\.\., d_model=8\), got \(2, 6, 4\)"):
        decoder(x, torch.randn(B, S, 4))
    with pytest.raises(ValueError, match=r"memory must have shape .*got \(6, 8\)"):
        decoder(x, torch.randn(S, D_MODEL))
    with pytest.raises(ValueError, match=r"x must have shape .*d_model=8\), got \(2, 5, 3\)"):
        decoder(torch.randn(B, T, 3), memory)
    with pytest.raises(ValueError, match=r"memory must have the batch size of x, B = 2, got memory \(3, 6, 8\)"):
        decoder(x, torch.randn(3, S, D_MODEL))
    with pytest.raises(ValueError, match=r"tgt_mask: mask must broadcast .*\(2, 2, 5, 5\), got shape \(2, 1, 1, 6\)"):
        decoder(x, memory, tgt_mask=padding_mask(src, 0))
    with pytest.raises(ValueError, match=r"memory_mask: mask must broadcast .*\(2, 2, 5, 6\), got shape \(2, 1, 1, 5\)"):
        decoder(x, memory, memory_mask=padding_mask(tgt, 0))
    with pytest.raises(TypeError, match="tgt_mask: mask must be a bool tensor"):
        decoder(x, memory, tgt_mask=causal_mask(T).float())
    with pytest.raises(TypeError, match="memory_mask: mask must be a bool tensor"):
        decoder(x, memory, memory_mask=padding_mask(src, 0).long())
    with pytest.raises(TypeError, match="memory must be a torch.Tensor"):
        decoder(x, memory.tolist())


# Without cross-attention: the layer of a decoder-only model.

@pytest.mark.parametrize("norm_first", [False, True])
def test_layer_without_cross_attention_is_a_causal_encoder_layer(norm_first):
    from transformer.nn.encoder import EncoderLayer
    layer = random_module(DecoderLayer, norm_first, cross_attention=False)
    assert layer.cross_attn is None and layer.norm2 is None and layer.dropout2 is None
    assert not any(name.startswith(("cross_attn", "norm2")) for name, _ in layer.named_parameters())
    encoder_layer = EncoderLayer(D_MODEL, NUM_HEADS, D_FF, dropout=0.0, options=LayerOptions(norm_first=norm_first))
    encoder_layer.load_state_dict({k.replace("norm3", "norm2"): v for k, v in layer.state_dict().items()})
    x = torch.randn(B, T, D_MODEL)
    torch.testing.assert_close(layer(x), encoder_layer(x, mask=causal_mask(T)))
    # and nn.TransformerEncoderLayer with the causal mask agrees as well
    ref = nn.TransformerEncoderLayer(D_MODEL, NUM_HEADS, D_FF, dropout=0.0, batch_first=True,
                                     norm_first=norm_first)
    ref.load_state_dict(torch_names({k.replace("norm3", "norm2"): v for k, v in layer.named_parameters()}))
    torch.testing.assert_close(layer(x), ref(x, src_mask=causal_mask(T)))


def test_stack_without_cross_attention_is_causal_and_caches():
    from transformer.nn.cache import DecoderCache
    torch.manual_seed(0)
    decoder = Decoder(2, D_MODEL, NUM_HEADS, D_FF, dropout=0.0, cross_attention=False, options=LayerOptions(norm_first=True)).eval()
    x = torch.randn(B, T, D_MODEL)
    later = x.clone()
    later[:, 3] = torch.randn(B, D_MODEL)
    torch.testing.assert_close(decoder(later)[:, :3], decoder(x)[:, :3])
    assert not torch.allclose(decoder(later)[:, 3:], decoder(x)[:, 3:])
    cache = DecoderCache(2)
    steps = torch.cat([decoder(x[:, t:t + 1], cache=cache) for t in range(T)], dim=1)
    torch.testing.assert_close(steps, decoder(x))
    assert cache.layers[0].cross_attn.key is None  # never used


def test_self_attention_factory_builds_each_layers_self_attention():
    built = []

    class Recorded(MultiHeadAttention):
        def __init__(self, d_model, num_heads, dropout=0.0):
            super().__init__(d_model, num_heads, dropout=dropout)
            built.append((d_model, num_heads, dropout))

    decoder = Decoder(3, D_MODEL, NUM_HEADS, D_FF, dropout=0.25,
                      options=LayerOptions(self_attention=Recorded, attention_dropout=0.125))
    assert built == [(D_MODEL, NUM_HEADS, 0.125)] * 3  # the factory gets the attention-weight dropout
    assert all(type(layer.self_attn) is Recorded for layer in decoder.layers)
    assert all(type(layer.cross_attn) is MultiHeadAttention for layer in decoder.layers)


def test_bad_arguments_without_cross_attention():
    layer = DecoderLayer(D_MODEL, NUM_HEADS, D_FF, cross_attention=False)
    x, memory = torch.randn(B, T, D_MODEL), torch.randn(B, S, D_MODEL)
    with pytest.raises(ValueError, match="memory must be None for a layer built with cross_attention=False, got a Tensor"):
        layer(x, memory)
    with pytest.raises(ValueError, match="memory_mask must be None"):
        layer(x, memory_mask=torch.zeros(B, 1, 1, S, dtype=torch.bool))
    with pytest.raises(ValueError, match="tgt_mask: mask must broadcast"):
        layer(x, tgt_mask=torch.zeros(B, 1, 1, T + 1, dtype=torch.bool))
    with pytest.raises(TypeError, match="cross_attention must be a bool"):
        DecoderLayer(D_MODEL, NUM_HEADS, D_FF, cross_attention=1)
    with pytest.raises(TypeError, match="self_attention must be callable"):
        Decoder(1, D_MODEL, NUM_HEADS, D_FF, options=LayerOptions(self_attention="rotary"))
    with pytest.raises(TypeError, match="options must be a LayerOptions, got dict"):
        DecoderLayer(D_MODEL, NUM_HEADS, D_FF, options={"norm_first": True})
    with pytest.raises(TypeError, match="memory must be a torch.Tensor"):
        DecoderLayer(D_MODEL, NUM_HEADS, D_FF)(x)  # with cross-attention the memory is required


@pytest.mark.parametrize("norm_first", [False, True])
def test_a_layer_built_with_causal_false_attends_to_every_position(norm_first):
    """causal=False (DETR's object queries, a set): without cross-attention, an encoder layer with no mask."""
    from transformer.nn.encoder import EncoderLayer
    layer = random_module(DecoderLayer, norm_first, cross_attention=False, causal=False)
    encoder_layer = EncoderLayer(D_MODEL, NUM_HEADS, D_FF, dropout=0.0, options=LayerOptions(norm_first=norm_first))
    encoder_layer.load_state_dict({k.replace("norm3", "norm2"): v for k, v in layer.state_dict().items()})
    x = torch.randn(B, T, D_MODEL)
    torch.testing.assert_close(layer(x), encoder_layer(x), rtol=0, atol=0)
    padding = torch.zeros(B, 1, 1, T, dtype=torch.bool)
    padding[1, ..., -2:] = True  # a tgt_mask is still applied
    torch.testing.assert_close(layer(x, tgt_mask=padding), encoder_layer(x, mask=padding), rtol=0, atol=0)
    decoder = Decoder(2, D_MODEL, NUM_HEADS, D_FF, causal=False)
    assert all(not layer.causal for layer in decoder.layers) and all(layer.causal for layer in Decoder(1, D_MODEL, NUM_HEADS, D_FF).layers)
    with pytest.raises(TypeError, match="causal must be a bool, got int"):
        DecoderLayer(D_MODEL, NUM_HEADS, D_FF, causal=0)
