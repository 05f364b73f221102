"""The models under torch.compile (fullgraph), torch.export, torch.jit.trace, vmap and the meta device.

Eager mode is the reference: a compiled, exported or traced model must give the eager model's
outputs and gradients. The token-id range check reads values (a data-dependent step), so it runs
in eager mode on the CPU only; these tests show that it no longer breaks the graph and that eager
users still get its error.
"""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from transformer import DecoderOnlyLM, SequenceClassifier, Transformer, causal_mask

# torch's own jit module warns that it is deprecated when the compiler imports it: not the package's doing.
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")

SIZES = dict(d_model=16, num_heads=2, d_ff=32, num_layers=2, dropout=0.0)


def _transformer():
    torch.manual_seed(0)
    model = Transformer(11, 13, max_len=20, pad_id=0, **SIZES)
    src = torch.tensor([[3, 4, 5, 6, 0], [7, 8, 9, 10, 2]])
    tgt = torch.tensor([[1, 5, 6, 7], [1, 2, 0, 0]])
    src_mask = (src == 0)[:, None, None, :]  # (B, 1, 1, S)
    return model, (src, tgt, src_mask)


def _language_model():
    torch.manual_seed(0)
    return DecoderOnlyLM(17, max_len=20, **SIZES), (torch.randint(0, 17, (3, 9)),)


def _classifier():
    torch.manual_seed(0)
    return SequenceClassifier(5, 2, max_len=20, **SIZES), (torch.randint(1, 5, (3, 7)),)


MODELS = {"Transformer": _transformer, "DecoderOnlyLM": _language_model, "SequenceClassifier": _classifier}


def _grads(model):
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.slow  # torch.compile
@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("training", [False, True], ids=["inference", "training"])
def test_fullgraph_compile_equals_eager(name, training):
    """One graph (fullgraph=True refuses any break), the eager outputs, and in training the eager gradients."""
    model, inputs = MODELS[name]()
    model.train(training)
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    with torch.set_grad_enabled(training):
        expected, got = model(*inputs), compiled(*inputs)
        torch.testing.assert_close(got, expected)
    if training:
        expected.square().mean().backward()
        eager_grads = _grads(model)
        model.zero_grad(set_to_none=True)
        got.square().mean().backward()
        compiled_grads = _grads(model)
        assert eager_grads.keys() == compiled_grads.keys() and eager_grads
        for key in eager_grads:
            torch.testing.assert_close(compiled_grads[key], eager_grads[key])


@pytest.mark.slow  # torch.compile with inductor: C++ compiled on the spot
def test_inductor_compiles_the_transformer_in_one_graph():
    """The default backend (C++ code on the CPU) as well, once: one graph, the eager logits."""
    model, inputs = _transformer()
    model.eval()
    counts = []
    compiled = torch.compile(model, fullgraph=True, backend=lambda gm, example: counts.append(1) or gm)
    torch.testing.assert_close(compiled(*inputs), model(*inputs))
    assert counts == [1]
    torch._dynamo.reset()
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(model, fullgraph=True)(*inputs), model(*inputs))


def test_export_of_transformer_forward():
    model, inputs = _transformer()
    model.eval()
    program = torch.export.export(model, inputs)
    torch.testing.assert_close(program.module()(*inputs), model(*inputs))
    other = (torch.tensor([[9, 9, 1, 2, 3], [4, 4, 4, 4, 4]]), torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]]),
             torch.zeros(2, 1, 1, 5, dtype=torch.bool))  # same shapes, other values
    torch.testing.assert_close(program.module()(*other), model(*other))


@pytest.mark.filterwarnings("ignore:`torch.jit.:DeprecationWarning")  # still supported, and still used
@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")  # shape checks become constants: expected
@pytest.mark.filterwarnings("ignore:There is a performance drop:UserWarning")  # vmap over the fused kernel
def test_jit_trace_and_vmap():
    model, (src, tgt, _) = _transformer()
    model.eval()
    with torch.no_grad():
        traced = torch.jit.trace(model, (src, tgt), check_trace=False)
        torch.testing.assert_close(traced(src, tgt), model(src, tgt))
        per_row = torch.func.vmap(lambda s, t: model(s[None], t[None])[0])(src, tgt)
        torch.testing.assert_close(per_row, model(src, tgt))


def test_forward_on_meta_and_fake_tensors_gives_shapes():
    model, (src, tgt, src_mask) = _transformer()
    with torch.device("meta"):
        meta_model = Transformer(11, 13, max_len=20, pad_id=0, **SIZES)
    assert meta_model(src.to("meta"), tgt.to("meta")).shape == (2, 4, 13)
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fake = mode.from_tensor
        assert model(fake(src), fake(tgt), fake(src_mask)).shape == (2, 4, 13)


@pytest.mark.parametrize("name", MODELS)
def test_eager_bad_ids_still_raise_the_clear_error(name):
    model, inputs = MODELS[name]()
    bad = inputs[0].clone()
    bad[0, 0] = 99
    with pytest.raises(ValueError, match=r"must lie in \[0, vocab_size=\d+\), got ids from \d+ to 99"):
        model(bad, *inputs[1:])
    bad[0, 0] = -1
    with pytest.raises(ValueError, match=r"got ids from -1 to"):
        model(bad, *inputs[1:])


def test_causal_mask_still_checks_plain_sizes():
    with pytest.raises(ValueError, match="size must be a positive int, got 0"):
        causal_mask(0)
    with pytest.raises(TypeError, match="size must be a positive int, got float"):
        causal_mask(2.0)
