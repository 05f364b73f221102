"""Tests of transformer.generation.compiled: decoding with fixed shapes (decode_step, static_greedy_decode) and
the step under torch.compile.

References: the model's full forward pass (one call on the whole prefix) for the scores of every
step, and greedy_decode, itself checked against a written-out greedy decoding (test_decoding.py),
for the tokens."""

import os
import subprocess
import sys

import pytest
import torch
from torch._dynamo.testing import CompileCounter

from transformer import LayerOptions, RotaryMultiHeadAttention, greedy_decode, padding_mask
from transformer.generation.compiled import compile_step, decode_step, static_cache, static_greedy_decode
from factories import PAD, SRC_VOCAB, TGT_VOCAB, small_transformer
from torch_reference import randomise

BOS, EOS = 1, 2

# torch's own jit module warns that it is deprecated when the compiler imports it: not the package's doing.
pytestmark = [pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning"),
              pytest.mark.usefixtures("one_thread")]  # tests/conftest.py


def _src(seed=1, batch=4, length=7):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(3, SRC_VOCAB, (batch, length), generator=g)
    src[1, 4:] = PAD
    src[3, 2:] = PAD
    return src


def _model(norm_first=False, seed=0):
    """The small Transformer built under ``seed``, with random biases and gains so that they show."""
    return randomise(small_transformer(seed=seed, options=LayerOptions(norm_first=norm_first))).eval()


def test_each_seed_gives_another_model():
    weights = [torch.nn.utils.parameters_to_vector(_model(seed=seed).parameters()) for seed in range(4)]
    assert all(not torch.equal(weights[i], weights[j]) for i in range(4) for j in range(i))


@pytest.mark.parametrize("norm_first", [False, True])
def test_every_step_gives_the_scores_of_the_full_forward_pass(norm_first):
    model, src = _model(norm_first), _src()
    mask = padding_mask(src, PAD)
    tgt = torch.randint(3, TGT_VOCAB, (src.shape[0], 9), generator=torch.Generator().manual_seed(2))
    tgt[:, 0] = BOS
    with torch.no_grad():
        full = model(src, tgt, mask)  # (B, T, V): every position in one call
        memory = model.encode(src, mask)  # (B, S, d_model)
        cache = static_cache(model, memory, capacity=12)
        steps = [decode_step(model, tgt[:, t], torch.tensor(t), cache, memory, mask) for t in range(tgt.shape[1])]
    torch.testing.assert_close(torch.stack(steps, dim=1), full, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("eos_id,extra_len", [(None, None), (EOS, None), (EOS, 1), (None, 0)])
def test_static_greedy_decode_gives_the_tokens_of_greedy_decode(norm_first, seed, eos_id, extra_len):
    model, src = _model(norm_first, seed), _src(seed + 1)
    mask = padding_mask(src, PAD)
    expected = greedy_decode(model, src, 15, BOS, eos_id, mask, pad_id=PAD, extra_len=extra_len)
    got = static_greedy_decode(model, src, 15, BOS, eos_id, mask, pad_id=PAD, extra_len=extra_len)
    assert torch.equal(got, expected)


def test_static_greedy_decode_stops_when_every_row_has_ended():
    model, src = _model(), _src()
    mask = padding_mask(src, PAD)
    common = greedy_decode(model, src, 6, BOS, None, mask)[0, 2].item()  # a token row 0 produces early
    expected = greedy_decode(model, src[:1], 40, BOS, common, mask[:1])
    got = static_greedy_decode(model, src[:1], 40, BOS, common, mask[:1])
    assert torch.equal(got, expected) and got.shape[1] < 40  # the output ends at its end token


def test_static_greedy_decode_restores_training_mode():
    model, src = _model(), _src()
    model.train()
    static_greedy_decode(model, src, 5, BOS)
    assert model.training


@pytest.mark.slow  # torch.compile traces the step
def test_the_step_is_one_graph_traced_once():
    """Every step has the same shapes, and the position is a tensor: one graph, no recompiling."""
    model, src = _model(), _src()
    counter = CompileCounter()
    torch._dynamo.reset()
    step = torch.compile(decode_step, backend=counter, fullgraph=True, dynamic=False)
    tokens = static_greedy_decode(model, src, 10, BOS, None, padding_mask(src, PAD), step=step)
    assert tokens.shape[1] == 10 and counter.frame_count == 1
    torch._dynamo.reset()


@pytest.mark.slow
def test_the_compiled_step_gives_the_same_tokens():
    """Inductor's generated code (C++ on the CPU) against eager greedy_decode."""
    torch._dynamo.reset()
    step = compile_step()
    for norm_first in (False, True):
        model, src = _model(norm_first), _src()
        mask = padding_mask(src, PAD)
        assert torch.equal(static_greedy_decode(model, src, 12, BOS, EOS, mask, step=step),
                           greedy_decode(model, src, 12, BOS, EOS, mask))
    torch._dynamo.reset()


@pytest.mark.slow
def test_the_step_compiles_on_both_arithmetic_paths(tmp_path):
    """Compiled on the vectorised path, then under ATEN_CPU_CAPABILITY=default (the book's second
    path) with the same Inductor cache: torch 2.13 reuses the cached vectorised C++ there, which does
    not build; compile_step generates scalar code on that path, and both decode as eager does."""
    script = ("import torch\n"
              "from transformer import Transformer, padding_mask\n"
              "from transformer.generation.compiled import compile_step, static_greedy_decode\n"
              "from transformer.generation.decoding import greedy_decode\n"
              "torch.manual_seed(0)\n"
              "model = Transformer(20, 15, d_model=32, num_heads=4, num_layers=2, d_ff=64, pad_id=0).eval()\n"
              "src = torch.tensor([[5, 9, 3, 7, 8], [4, 8, 6, 0, 0]])\n"
              "mask = padding_mask(src, 0)\n"
              "assert torch.equal(static_greedy_decode(model, src, 12, 1, 4, mask, step=compile_step()),\n"
              "                   greedy_decode(model, src, 12, 1, 4, mask))\n"
              "print(torch.backends.cpu.get_cpu_capability())\n")
    env = {key: value for key, value in os.environ.items() if key != "ATEN_CPU_CAPABILITY"}
    env["TORCHINDUCTOR_CACHE_DIR"] = str(tmp_path)
    for path in ({}, {"ATEN_CPU_CAPABILITY": "default"}):
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600,
                              env={**env, **path})
        assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "DEFAULT"


def test_a_converted_marian_model_decodes_the_same():
    transformers = pytest.importorskip("transformers")
    from transformer.interop.huggingface_in import from_huggingface

    config = transformers.MarianConfig(vocab_size=30, d_model=16, encoder_layers=2, decoder_layers=2,
                                       encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=32,
                                       decoder_ffn_dim=32, max_position_embeddings=40, activation_function="swish",
                                       pad_token_id=29, decoder_start_token_id=29, eos_token_id=0)
    torch.manual_seed(0)
    model = from_huggingface(transformers.MarianMTModel(config).eval())
    src = torch.randint(1, 29, (3, 6))
    assert torch.equal(static_greedy_decode(model, src, 12, 29, 0, pad_id=29),
                       greedy_decode(model, src, 12, 29, 0, pad_id=29))


def test_bad_input():
    model, src = _model(), _src()
    with pytest.raises(TypeError, match="step must be callable like decode_step, got int"):
        static_greedy_decode(model, src, 5, BOS, step=3)
    with pytest.raises(ValueError, match="max_len must be at most the model's max_len"):
        static_greedy_decode(model, src, 10**6, BOS)
    with pytest.raises(ValueError, match="eos_id must be a token id in the target vocabulary"):
        static_greedy_decode(model, src, 5, BOS, eos_id=TGT_VOCAB)
    with pytest.raises(ValueError, match="capacity must be a positive int, got 0"):
        static_cache(model, model.encode(src), capacity=0)
    model.decoder.layers[1].self_attn = RotaryMultiHeadAttention(16, 4)
    with pytest.raises(TypeError, match="the paper's attention .* got RotaryMultiHeadAttention"):
        static_greedy_decode(model, src, 5, BOS)


def test_prepack_keeps_the_function_and_repacks_a_changed_weight():
    """prepack (issue 35): PackedLinear gives nn.Linear's outputs to rounding at inference, nn.Linear's own
    under gradients, packs again when the weight changes, and its model still copies."""
    import copy

    from torch import nn

    from transformer.generation.packed import PackedLinear, prepack

    torch.manual_seed(0)
    linear = nn.Linear(16, 3000)
    packed = prepack(linear)
    assert isinstance(packed, PackedLinear) and type(linear) is nn.Linear
    x = torch.randn(5, 16)
    with torch.no_grad():
        torch.testing.assert_close(packed(x), linear(x))
        if torch.backends.mkldnn.is_available():
            assert packed._packed is not None
        packed.weight.mul_(2)  # a new version of the weight: packed again
        torch.testing.assert_close(packed(x), torch.nn.functional.linear(x, 2 * linear.weight, linear.bias))
    y = packed(x.requires_grad_())  # with gradients: nn.Linear.forward
    y.sum().backward()
    torch.testing.assert_close(x.grad, (2 * linear.weight).sum(0).expand(5, 16), atol=1e-4, rtol=1e-4)
    with torch.inference_mode():
        torch.testing.assert_close(copy.deepcopy(packed)(x.detach()), packed(x.detach()))


def test_without_the_private_operators_nothing_is_packed(monkeypatch):
    """PackedLinear calls two private operators of torch (PACKING_OPS): a torch without one of them gets
    its nn.Linear layers back unchanged from pack_linear_layers and prepack, which still give the model's
    outputs; with them (this pinned torch, where it has oneDNN) the layers are packed."""
    from torch import nn

    from transformer.generation import packed as module

    assert all(hasattr(torch.ops.mkldnn, name) for name in module.PACKING_OPS)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4))
    packed_kind = module.PackedLinear if torch.backends.mkldnn.is_available() else nn.Linear
    assert type(module.prepack(model)[2]) is packed_kind
    monkeypatch.setattr(module, "PACKING_OPS", (*module.PACKING_OPS, "_an_operator_this_torch_lacks"))
    copy = module.prepack(model)
    assert [type(layer) for layer in copy] == [nn.Linear, nn.ReLU, nn.Linear]
    assert module.pack_linear_layers(model) is model and type(model[0]) is nn.Linear
    x = torch.randn(3, 8)
    with torch.no_grad():
        assert torch.equal(copy(x), model(x))


def test_a_packed_linear_multiplies_a_single_row_by_the_stored_weight():
    """One row (greedy decoding of one sequence) is a matrix-vector product, where oneDNN's packed layout
    was slower (benchmarks/smollm2_decoding.py): PackedLinear gives nn.Linear's output bit for bit and
    packs nothing; the first call of several rows packs."""
    from torch import nn

    from transformer.generation.packed import prepack

    torch.manual_seed(0)
    linear = nn.Linear(16, 300)
    packed = prepack(linear)
    with torch.no_grad():
        for one_row in (torch.randn(16), torch.randn(1, 16), torch.randn(1, 1, 16)):
            assert torch.equal(packed(one_row), torch.nn.functional.linear(one_row, linear.weight, linear.bias))
        assert packed._packed is None
        packed(torch.randn(2, 1, 16))
        if torch.backends.mkldnn.is_available():
            assert packed._packed is not None
