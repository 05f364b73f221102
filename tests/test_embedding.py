"""Tests for transformer.nn.embedding: TokenEmbedding, x_t = sqrt(d_model) * E[t]."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from transformer.nn.embedding import TokenEmbedding


def _tokens(shape, vocab_size, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab_size, shape, generator=g)


# Values ---------------------------------------------------------------------------------------


def test_matches_functional_embedding_times_sqrt_d_model():
    torch.manual_seed(0)
    emb = TokenEmbedding(vocab_size=11, d_model=6)
    tokens = _tokens((2, 5), 11)
    expected = F.embedding(tokens, emb.weight.detach()) * math.sqrt(6)
    torch.testing.assert_close(emb(tokens), expected)


def test_matches_nn_embedding_with_scaled_weight_values_and_gradients():
    torch.manual_seed(0)
    d_model, vocab = 8, 13
    emb = TokenEmbedding(vocab, d_model, padding_idx=3)
    ref = nn.Embedding(vocab, d_model, padding_idx=3)
    with torch.no_grad():
        ref.weight.copy_(emb.weight * math.sqrt(d_model))
    tokens = torch.tensor([[0, 3, 5, 5, 12], [3, 3, 1, 7, 0]])  # (B, N), with padding
    out, out_ref = emb(tokens), ref(tokens)
    torch.testing.assert_close(out, out_ref)

    upstream = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
    (out * upstream).sum().backward()
    (out_ref * upstream).sum().backward()
    # d/dE of sqrt(d) * E[t] is sqrt(d) times the gradient with respect to the scaled table.
    torch.testing.assert_close(emb.weight.grad, ref.weight.grad * math.sqrt(d_model))


def test_matches_one_hot_times_weight():
    torch.manual_seed(0)
    vocab, d_model = 9, 4
    emb = TokenEmbedding(vocab, d_model)
    tokens = _tokens((3, 7), vocab)
    one_hot = F.one_hot(tokens, vocab).to(emb.weight.dtype)  # (B, N, V)
    expected = math.sqrt(d_model) * (one_hot @ emb.weight.detach())  # (B, N, d_model)
    torch.testing.assert_close(emb(tokens), expected)


def test_matches_formula_element_by_element():
    torch.manual_seed(0)
    emb = TokenEmbedding(5, 4)
    tokens = torch.tensor([[4, 0, 2]])
    out = emb(tokens)
    w = emb.weight.detach()
    for j, t in enumerate(tokens[0].tolist()):
        for k in range(4):
            assert math.isclose(out[0, j, k].item(), math.sqrt(4) * w[t, k].item(), rel_tol=1e-6)


# Shapes ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(2, 5), (1, 1), (5,), (2, 3, 4), (0,), (2, 0)])
def test_output_shape_for_any_leading_shape(shape):
    torch.manual_seed(0)
    emb = TokenEmbedding(10, 6)
    tokens = _tokens(shape, 10)
    out = emb(tokens)
    assert out.shape == (*shape, 6)
    torch.testing.assert_close(out, F.embedding(tokens, emb.weight.detach()) * math.sqrt(6))


def test_int32_token_ids_give_the_same_result_as_long():
    torch.manual_seed(0)
    emb = TokenEmbedding(10, 6)
    tokens = _tokens((2, 5), 10)
    torch.testing.assert_close(emb(tokens.to(torch.int32)), emb(tokens))


def test_float64_module():
    torch.manual_seed(0)
    emb = TokenEmbedding(10, 6).double()
    assert emb.weight.dtype == torch.float64
    tokens = _tokens((2, 5), 10)
    out = emb(tokens)
    assert out.dtype == torch.float64
    torch.testing.assert_close(out, F.embedding(tokens, emb.weight.detach()) * math.sqrt(6))


# Parameter, gradients, padding ----------------------------------------------------------------


def test_weight_is_a_parameter_named_weight():
    emb = TokenEmbedding(7, 3)
    params = dict(emb.named_parameters())
    assert list(params) == ["weight"]
    assert isinstance(emb.weight, nn.Parameter)
    assert emb.weight.shape == (7, 3)
    assert emb.weight.requires_grad
    assert list(emb.state_dict()) == ["weight"]


def test_only_used_rows_receive_gradient():
    torch.manual_seed(0)
    vocab, d_model = 10, 4
    emb = TokenEmbedding(vocab, d_model)
    tokens = torch.tensor([[1, 4, 4, 7], [7, 1, 2, 4]])
    upstream = torch.randn(2, 4, d_model, generator=torch.Generator().manual_seed(2))
    (emb(tokens) * upstream).sum().backward()

    expected = torch.zeros(vocab, d_model)
    for b in range(2):
        for j in range(4):
            expected[tokens[b, j]] += math.sqrt(d_model) * upstream[b, j]
    torch.testing.assert_close(emb.weight.grad, expected)
    unused = [t for t in range(vocab) if t not in tokens.unique().tolist()]
    assert (emb.weight.grad[unused] == 0).all()
    assert (emb.weight.grad[[1, 2, 4, 7]].abs().sum(dim=1) > 0).all()


def test_padding_row_is_zero_gives_zero_vectors_and_gets_no_gradient():
    torch.manual_seed(0)
    pad = 0
    emb = TokenEmbedding(8, 5, padding_idx=pad)
    assert (emb.weight[pad] == 0).all()
    assert (emb.weight[1:].abs().sum(dim=1) > 0).all()
    tokens = torch.tensor([[3, 5, pad, pad], [pad, 1, 2, pad]])
    out = emb(tokens)
    assert (out[tokens == pad] == 0).all()
    assert (out[tokens != pad].abs().sum(dim=-1) > 0).all()

    out.pow(2).sum().backward()
    assert (emb.weight.grad[pad] == 0).all()
    assert (emb.weight.grad[[1, 2, 3, 5]].abs().sum(dim=1) > 0).all()

    # A gradient step leaves the padding row at zero.
    with torch.no_grad():
        emb.weight -= 0.1 * emb.weight.grad
    assert (emb.weight[pad] == 0).all()


def test_padding_idx_last_row():
    emb = TokenEmbedding(6, 4, padding_idx=5)
    assert (emb.weight[5] == 0).all()
    assert (emb(torch.tensor([[5, 5]])) == 0).all()


def test_initialisation_std_is_one_over_sqrt_d_model():
    torch.manual_seed(0)
    d_model = 64
    emb = TokenEmbedding(2000, d_model)  # 128,000 entries
    w = emb.weight.detach()
    assert abs(w.mean().item()) < 0.005
    # Expected std 0.125; the estimate's standard error is ~3e-4. std 1 would fail by far.
    assert abs(w.std().item() - d_model**-0.5) < 0.005
    # The scaled vectors therefore have entries of unit variance.
    out = emb(torch.arange(2000))
    assert abs(out.std().item() - 1.0) < 0.04


def test_reset_parameters_redraws_and_keeps_padding_zero():
    torch.manual_seed(0)
    emb = TokenEmbedding(50, 8, padding_idx=2)
    before = emb.weight.detach().clone()
    emb.reset_parameters()
    assert not torch.equal(before, emb.weight.detach())
    assert (emb.weight[2] == 0).all()


# Bad input ------------------------------------------------------------------------------------


@pytest.mark.parametrize("kwargs, name, value", [
    (dict(vocab_size=0, d_model=4), "vocab_size", 0),
    (dict(vocab_size=-3, d_model=4), "vocab_size", -3),
    (dict(vocab_size=10, d_model=0), "d_model", 0),
    (dict(vocab_size=10, d_model=-8), "d_model", -8),
])
def test_rejects_non_positive_sizes(kwargs, name, value):
    with pytest.raises(ValueError, match=rf"{name} must be a positive int, got {value}"):
        TokenEmbedding(**kwargs)


@pytest.mark.parametrize("kwargs, name, shown", [
    (dict(vocab_size=10.0, d_model=4), "vocab_size", "float 10.0"),
    (dict(vocab_size=10, d_model=4.0), "d_model", "float 4.0"),
    (dict(vocab_size=True, d_model=4), "vocab_size", "bool True"),
    (dict(vocab_size=10, d_model=True), "d_model", "bool True"),
    (dict(vocab_size="10", d_model=4), "vocab_size", "str '10'"),
])
def test_rejects_non_int_sizes(kwargs, name, shown):
    with pytest.raises(TypeError, match=rf"{name} must be a positive int, got {shown}"):
        TokenEmbedding(**kwargs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bool])
def test_rejects_non_integer_token_ids(dtype):
    emb = TokenEmbedding(10, 4)
    tokens = torch.tensor([[1, 0, 2]]).to(dtype)
    with pytest.raises(TypeError, match=rf"tokens must hold integer token ids .*got dtype {dtype}"):
        emb(tokens)


@pytest.mark.parametrize("bad_id, low, high", [(10, 0, 10), (57, 0, 57), (-1, -1, 3)])
def test_rejects_ids_outside_vocabulary(bad_id, low, high):
    emb = TokenEmbedding(10, 4)
    tokens = torch.tensor([[0, 3, bad_id]]) if bad_id >= 0 else torch.tensor([[bad_id, 3, 2]])
    with pytest.raises(ValueError, match=rf"tokens must lie in \[0, vocab_size=10\), got ids from {low} to {high}"):
        emb(tokens)


@pytest.mark.parametrize("tokens, type_name", [([[1, 2, 3]], "list"), (None, "NoneType")])
def test_rejects_non_tensor_tokens(tokens, type_name):
    emb = TokenEmbedding(10, 4)
    with pytest.raises(TypeError, match=rf"tokens must be a torch.Tensor of token ids, got {type_name}"):
        emb(tokens)


@pytest.mark.parametrize("padding_idx", [10, 11, -1])
def test_rejects_padding_idx_out_of_range(padding_idx):
    with pytest.raises(ValueError, match=rf"padding_idx must lie in \[0, vocab_size=10\), got {padding_idx}"):
        TokenEmbedding(10, 4, padding_idx=padding_idx)


@pytest.mark.parametrize("padding_idx, type_name", [(True, "bool"), (2.0, "float"), ("0", "str")])
def test_rejects_padding_idx_of_wrong_type(padding_idx, type_name):
    with pytest.raises(TypeError, match=rf"padding_idx must be None or an int, got {type_name}"):
        TokenEmbedding(10, 4, padding_idx=padding_idx)


def test_scale_false_returns_the_rows_unscaled():
    scaled = TokenEmbedding(vocab_size=10, d_model=16)
    unscaled = TokenEmbedding(vocab_size=10, d_model=16, scale=False)
    unscaled.load_state_dict(scaled.state_dict())
    tokens = _tokens((2, 5), 10)
    torch.testing.assert_close(unscaled(tokens), F.embedding(tokens, scaled.weight))
    torch.testing.assert_close(scaled(tokens), unscaled(tokens) * 4.0)


def test_scale_must_be_a_bool():
    with pytest.raises(TypeError, match="scale must be a bool, got int 0"):
        TokenEmbedding(vocab_size=10, d_model=16, scale=0)


def test_models_pass_scale_embedding_on():
    from transformer import DecoderOnlyLM
    from transformer.nn.model import Transformer

    model = Transformer(11, 13, d_model=8, num_heads=2, num_layers=1, d_ff=16, scale_embedding=False)
    assert model.src_embed.scale is False and model.tgt_embed.scale is False
    assert Transformer(11, 13, d_model=8, num_heads=2, num_layers=1, d_ff=16).src_embed.scale is True
    assert DecoderOnlyLM(11, d_model=8, num_heads=2, d_ff=16, num_layers=1, scale_embedding=False).embed.scale is False


def test_accepts_a_numpy_integer_padding_idx_as_an_int():
    import numpy as np

    embedding = TokenEmbedding(10, 4, padding_idx=np.int64(3))  # as read from a configuration file
    assert embedding.padding_idx == 3 and type(embedding.padding_idx) is int
    assert torch.equal(embedding.weight[3], torch.zeros(4))
