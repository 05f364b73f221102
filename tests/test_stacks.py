"""What the encoder and the decoder have in common (chapters/encoder.md, chapters/decoder.md),
checked once for both: a stack of layers with its final LayerNorm, the parameter count of a base
layer, layers that share no weights, dropout in training only, and the constructors' checks."""

import dataclasses
import inspect
from dataclasses import dataclass

import pytest
import torch
from torch import nn

from transformer.nn.decoder import Decoder, DecoderLayer
from transformer.nn.decoder_only import DecoderOnlyLM
from transformer.nn.encoder import Encoder, EncoderLayer, LayerOptions
from transformer.nn.model import Transformer
from transformer.nn.residual import LayerNorm
from factories import D_FF, D_MODEL, NUM_HEADS, random_module


@dataclass(frozen=True)
class Kind:
    stack: type
    layer: type
    torch_layer: type
    base_layer_parameters: int  # one layer of the base model: d_model 512, 8 heads, d_ff 2048
    a_weight: str  # a weight of a layer, changed in one layer to show that the others keep theirs

    def inputs(self):
        """x (2, 5, d_model), and for the decoder a memory (2, 6, d_model)."""
        torch.manual_seed(1)
        x = torch.randn(2, 5, D_MODEL)
        return (x,) if self.stack is Encoder else (x, torch.randn(2, 6, D_MODEL))


KINDS = [
    pytest.param(Kind(Encoder, EncoderLayer, nn.TransformerEncoderLayer, 3_152_384, "self_attn.w_q.weight"),
                 id="encoder"),
    pytest.param(Kind(Decoder, DecoderLayer, nn.TransformerDecoderLayer, 4_204_032, "cross_attn.w_v.weight"),
                 id="decoder"),
]


# --- structure --------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_stack_structure_and_final_norm(kind):
    post = kind.stack(4, D_MODEL, NUM_HEADS, D_FF)
    assert isinstance(post.layers, nn.ModuleList) and len(post.layers) == 4
    assert all(isinstance(layer, kind.layer) and not layer.norm_first for layer in post.layers)
    assert post.norm is None
    pre = kind.stack(2, D_MODEL, NUM_HEADS, D_FF, options=LayerOptions(norm_first=True))
    assert all(layer.norm_first for layer in pre.layers)
    assert isinstance(pre.norm, LayerNorm)


@pytest.mark.parametrize("kind", KINDS)
def test_base_layer_parameter_count_matches_torch(kind):
    def count(module):
        return sum(p.numel() for p in module.parameters())

    ours = kind.layer(512, 8, 2048)
    assert count(ours) == count(kind.torch_layer(512, 8, 2048)) == kind.base_layer_parameters


@pytest.mark.parametrize("kind", KINDS)
def test_layers_have_independent_weights(kind):
    stack = kind.stack(3, D_MODEL, NUM_HEADS, D_FF)
    for name, p in stack.layers[0].named_parameters():
        others = [dict(layer.named_parameters())[name] for layer in stack.layers[1:]]
        assert all(p.data_ptr() != q.data_ptr() for q in others), name
        if "w_" in name and name.endswith("weight"):  # random initial values, drawn per layer
            assert all(not torch.equal(p, q) for q in others), name
    before = [layer.get_parameter(kind.a_weight).clone() for layer in stack.layers]
    with torch.no_grad():
        stack.layers[0].get_parameter(kind.a_weight).add_(1.0)
    for layer, old in zip(stack.layers[1:], before[1:]):
        torch.testing.assert_close(layer.get_parameter(kind.a_weight), old)


# --- training behaviour ---------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_dropout_acts_in_training_only(kind):
    dropped = random_module(kind.stack, dropout=0.5)
    plain = kind.stack(3, D_MODEL, NUM_HEADS, D_FF, dropout=0.0)
    plain.load_state_dict(dropped.state_dict())
    inputs = kind.inputs()
    dropped.eval()
    torch.testing.assert_close(dropped(*inputs), plain.eval()(*inputs))
    dropped.train()
    torch.manual_seed(3)
    first = dropped(*inputs)
    torch.manual_seed(4)
    assert not torch.allclose(first, dropped(*inputs))


# --- bad arguments --------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("num_layers", [0, -1, -2])
def test_non_positive_num_layers(kind, num_layers):
    with pytest.raises(ValueError, match=f"num_layers must be a positive int, got {num_layers}"):
        kind.stack(num_layers, D_MODEL, NUM_HEADS, D_FF)


@pytest.mark.parametrize("kind", KINDS)
def test_non_integer_num_layers(kind):
    with pytest.raises(TypeError, match="num_layers must be a positive int, got float"):
        kind.stack(2.0, D_MODEL, NUM_HEADS, D_FF)


@pytest.mark.parametrize("build", [
    pytest.param(EncoderLayer, id="encoder_layer"),
    pytest.param(lambda *a, **k: Encoder(2, *a, **k), id="encoder"),
    pytest.param(DecoderLayer, id="decoder_layer"),
    pytest.param(lambda *a, **k: Decoder(2, *a, **k), id="decoder"),
])
def test_bad_constructor_arguments(build):
    with pytest.raises(ValueError, match="d_model must be divisible by num_heads, got d_model=10"):
        build(10, 4, D_FF)
    for dropout in (1.0, -0.1):
        with pytest.raises(ValueError, match=rf"dropout must be in \[0, 1\), got {dropout}"):
            build(D_MODEL, NUM_HEADS, D_FF, dropout=dropout)
    with pytest.raises(ValueError, match="d_ff must be a positive int, got 0"):
        build(D_MODEL, NUM_HEADS, 0)
    with pytest.raises(TypeError, match="norm_first must be a bool, got str"):
        build(D_MODEL, NUM_HEADS, D_FF, options=LayerOptions(norm_first="yes"))
    with pytest.raises(TypeError, match="norm_first must be a bool, got int"):
        build(D_MODEL, NUM_HEADS, D_FF, options=LayerOptions(norm_first=1))


# --- one configuration object -----------------------------------------------------------------


@pytest.mark.parametrize("build, positional", [(EncoderLayer, 4), (DecoderLayer, 4), (Encoder, 5), (Decoder, 5),
                                               (Transformer, 7), (DecoderOnlyLM, 5)],
                         ids=lambda value: getattr(value, "__name__", str(value)))
def test_at_most_the_papers_five_options_are_positional(build, positional):
    """The paper's sizes and dropout (after the vocabulary sizes) may be positional; every other option
    is keyword only, and the options beyond the paper travel in one ``LayerOptions``."""
    parameters = list(inspect.signature(build).parameters.values())
    assert [p.kind for p in parameters[:positional]] == [inspect.Parameter.POSITIONAL_OR_KEYWORD] * positional
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in parameters[positional:])
    assert "options" in {p.name for p in parameters}


@pytest.mark.parametrize("kind", KINDS)
def test_the_stack_hands_its_options_to_every_layer(kind):
    options = LayerOptions(norm_first=True, attention_dropout=0.25, activation_dropout=0.125, activation="gelu")
    stack = kind.stack(3, D_MODEL, NUM_HEADS, D_FF, options=options)
    for layer in stack.layers:
        assert layer.norm_first and layer.self_attn.dropout == 0.25
        assert layer.feed_forward.dropout.p == 0.125 and layer.feed_forward.activation == "gelu"
    with pytest.raises(TypeError, match="options must be a LayerOptions, got dict"):
        kind.stack(1, D_MODEL, NUM_HEADS, D_FF, options={"norm_first": True})
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.norm_first = False  # type: ignore[misc]
