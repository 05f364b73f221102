"""Tests for transformer/generation/sampling.py (chapters/sampling.md): the nucleus (top-p) filter,
against a hand computation and against Hugging Face transformers' ``TopPLogitsWarper``, and ``sample``
with ``top_p``. Top-k and the rest of ``sample`` are tested in tests/test_language_model.py."""

import math

import pytest
import torch

from transformer.generation.sampling import sample, top_k_filter, top_p_filter
from transformer.nn.decoder_only import DecoderOnlyLM

V = 11

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def small(**kwargs) -> DecoderOnlyLM:
    torch.manual_seed(0)
    return DecoderOnlyLM(V, d_model=16, num_heads=4, d_ff=32, num_layers=2, max_len=24, dropout=0.0, **kwargs).eval()


@pytest.mark.parametrize("p, kept", [
    (0.3, [False, True, False, False]),  # 0.5 alone reaches 0.3
    (0.5, [False, True, False, False]),  # ... and 0.5: "at least p"
    (0.6, [True, True, False, True]),  # 0.5 + 0.2 reaches 0.6; the other 0.2 is tied with it and stays
    (0.95, [True, True, True, True]),  # 0.5 + 0.2 + 0.2 = 0.9 < 0.95
])
def test_top_p_filter_by_hand(p, kept):
    probabilities = torch.tensor([0.2, 0.5, 0.1, 0.2], dtype=torch.float64)
    filtered = top_p_filter(probabilities.log(), p)
    assert torch.isfinite(filtered).tolist() == kept
    kept = torch.tensor(kept)
    assert torch.equal(filtered[kept], probabilities.log()[kept])  # the kept logits are unchanged
    expected = torch.where(kept, probabilities, 0.0) / probabilities[kept].sum()  # renormalised
    torch.testing.assert_close(filtered.softmax(-1), expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("p", [0.05, 0.3, 0.5, 0.8, 0.9, 0.95, 0.99])
def test_top_p_filter_matches_hugging_face(dtype, p):
    from transformers.generation.logits_process import TopPLogitsWarper

    generator = torch.Generator().manual_seed(int(100 * p))
    for scale in (0.3, 1.0, 4.0):  # flat, ordinary and peaked distributions
        logits = scale * torch.randn(32, 50, generator=generator, dtype=dtype)  # (B, V): no ties
        ours = top_p_filter(logits, p)
        theirs = TopPLogitsWarper(top_p=p)(None, logits.clone())
        assert torch.equal(torch.isfinite(ours), torch.isfinite(theirs))
        assert torch.equal(ours[torch.isfinite(ours)], logits[torch.isfinite(ours)])


def test_top_p_filter_keeps_ties_and_shapes():
    tied = torch.tensor([[1.0, 3.0, 3.0, 0.0, 3.0]])  # three tokens of probability ~0.32 each
    assert torch.isfinite(top_p_filter(tied, 0.2)).tolist() == [[False, True, True, False, True]]
    assert torch.isfinite(top_k_filter(tied, 1)).tolist() == [[False, True, True, False, True]]  # as top-k does
    logits = torch.randn(2, 3, 7, generator=torch.Generator().manual_seed(0))  # any leading shape
    filtered = top_p_filter(logits, 0.7)
    assert filtered.shape == logits.shape and torch.isfinite(filtered).any(-1).all()
    assert torch.equal(top_p_filter(logits, 1.0), logits) and torch.equal(top_p_filter(logits, None), logits)
    assert top_p_filter(logits, 1.0) is not logits  # a new tensor, as top_k_filter gives
    assert torch.equal(torch.isfinite(top_p_filter(logits, 1e-9)), torch.isfinite(top_k_filter(logits, 1)))


def test_top_p_filter_works_after_top_k_and_in_half_precision():
    logits = torch.randn(4, 20, generator=torch.Generator().manual_seed(2))
    after_k = top_p_filter(top_k_filter(logits, 5), 0.99)  # -inf from top-k: probability 0, never kept
    assert (torch.isfinite(after_k).sum(-1) <= 5).all()
    half = top_p_filter(logits.half(), 0.9)
    assert half.dtype == torch.float16
    assert torch.equal(torch.isfinite(half), torch.isfinite(top_p_filter(logits.half().float(), 0.9)))


@pytest.mark.parametrize("p", [0, 0.0, -0.5, 1.0001, 2, math.nan, math.inf])
def test_top_p_filter_refuses_p_outside_zero_one(p):
    with pytest.raises(ValueError, match=r"top_p must be a number in \(0, 1\], got"):
        top_p_filter(torch.randn(5), p)


@pytest.mark.parametrize("p", ["0.9", True, [0.9]])
def test_top_p_filter_refuses_a_non_number(p):
    with pytest.raises(TypeError, match="top_p must be a number in"):
        top_p_filter(torch.randn(5), p)
    with pytest.raises(TypeError, match="logits must be a torch.Tensor"):
        top_p_filter([1.0, 2.0], 0.5)


def test_sample_with_top_p_draws_from_the_nucleus_with_and_without_the_cache():
    model = small()
    prompt = torch.randint(0, V, (8, 3), generator=torch.Generator().manual_seed(6))
    out = sample(model, prompt, 6, temperature=1.5, top_p=0.6, generator=torch.Generator().manual_seed(1))
    again = sample(model, prompt, 6, temperature=1.5, top_p=0.6, use_cache=False,
                   generator=torch.Generator().manual_seed(1))
    assert torch.equal(out, again)
    with torch.no_grad():
        logits = model(out[:, :-1])[:, 2:] / 1.5  # (B, 6, V): the scores each new token was drawn from
    kept = torch.isfinite(top_p_filter(logits, 0.6))  # (B, 6, V)
    assert kept.gather(-1, out[:, 3:, None]).all()
    assert (kept.sum(-1) < V).any()  # the nucleus did cut something


def test_sample_with_a_tiny_nucleus_is_greedy():
    model = small(position=None)
    prompt = torch.randint(0, V, (3, 2), generator=torch.Generator().manual_seed(4))
    assert torch.equal(sample(model, prompt, 10, top_p=1e-6, generator=torch.Generator().manual_seed(0)),
                       sample(model, prompt, 10, top_k=1))


def test_sample_refuses_a_bad_top_p():
    model = small()
    with pytest.raises(ValueError, match=r"top_p must be a number in \(0, 1\], got 1.5"):
        sample(model, torch.tensor([1, 2]), 3, top_p=1.5)
