"""Gradient accumulation (transformer/training/accumulation.py, chapter "Scaling out"): one step over k
micro-batches is one step over the whole batch, because each micro-batch counts by its share of the
target tokens; the mean of the micro-batches' means is not, and the checks here see the difference."""

import pytest
import torch

from transformer.tasks.numbers import make_batch, source_vocab, target_vocab
from transformer.training.accumulation import accumulate
from transformer.training.config import TrainConfig, make_model, make_optimizer
from transformer.training.distributed import shard_batch, target_tokens
from transformer.training.loop import optimizer_step, run_settings, run_steps
from transformer.training.losses import seq2seq_loss

CONFIG = TrainConfig(d_model=32, num_heads=2, num_layers=1, d_ff=64, dropout=0.0)
NUMBERS = [7, 777_777, 15, 40_002, 123_456, 9, 300, 58_019]  # lengths 1 to 6 digits


def _batch(numbers=NUMBERS):
    return make_batch(numbers, source_vocab(), target_vocab())


def _model(dtype=torch.float32):
    with run_settings(CONFIG.seed, None):
        return make_model(CONFIG, source_vocab(), target_vocab()).to(dtype)


def _loss():
    return seq2seq_loss(CONFIG.label_smoothing, target_vocab().pad_id)


def _mean_of_means(k):
    """The usual recipe: each micro-batch's loss divided by k."""
    loss_fn = _loss()
    return lambda model, b: (sum(loss_fn(model, shard_batch(b, j, k))[0] for j in range(k)) / k, {})


def _one_step(loss_fn, dtype=torch.float32, batch=None):
    """The book's first optimiser step (Adam, warm-up, clipping) from the same start: the step's
    (loss, metrics, gradient norm) and each parameter's (gradient, value after the step)."""
    model = _model(dtype)
    optimizer, scheduler = make_optimizer(CONFIG, model)
    result = optimizer_step(model, _batch() if batch is None else batch, optimizer, scheduler, loss_fn)
    return result, {name: (p.grad.clone(), p.detach().clone()) for name, p in model.named_parameters()}


@pytest.mark.parametrize("k", [2, 3, 5, 8])
def test_one_accumulated_step_is_the_whole_batch_step(k):
    counts = [int(target_tokens(shard_batch(_batch(), j, k))) for j in range(k)]
    assert len(set(counts)) > 1  # uneven micro-batches: the weighting matters
    (loss, metrics, norm), whole = _one_step(_loss())
    (acc_loss, acc_metrics, acc_norm), accumulated = _one_step(accumulate(_loss(), k))
    assert acc_loss == pytest.approx(loss, rel=1e-6) and acc_norm == pytest.approx(norm, rel=1e-6)
    assert acc_metrics["accuracy"] == pytest.approx(metrics["accuracy"], rel=1e-6)
    for name, (grad, param) in whole.items():
        torch.testing.assert_close(accumulated[name][0], grad, rtol=1e-5, atol=1e-7)
        # a key's bias has a gradient of pure float32 rounding, which Adam's first step divides by
        # its own size: compared in float64 below
        if not name.endswith("w_k.bias"):
            torch.testing.assert_close(accumulated[name][1], param, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("k", [2, 5])
def test_in_float64_every_parameter_agrees_after_the_step(k):
    _, whole = _one_step(_loss(), torch.float64)
    _, accumulated = _one_step(accumulate(_loss(), k), torch.float64)
    for name, (grad, param) in whole.items():
        torch.testing.assert_close(accumulated[name][0], grad, rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(accumulated[name][1], param)


def test_the_mean_of_means_is_another_gradient():
    _, whole = _one_step(_loss())
    _, naive = _one_step(_mean_of_means(4))
    _, accumulated = _one_step(accumulate(_loss(), 4))
    naive_error = max((naive[n][0] - g).abs().max().item() for n, (g, _) in whole.items())
    error = max((accumulated[n][0] - g).abs().max().item() for n, (g, _) in whole.items())
    assert naive_error > 1e-3 > 1e-6 > error
    with pytest.raises(AssertionError):  # the check above would catch the usual recipe
        for name, (grad, _) in whole.items():
            torch.testing.assert_close(naive[name][0], grad, rtol=1e-5, atol=1e-7)


def test_equal_micro_batches_make_both_weightings_agree():
    """Where every micro-batch holds as many tokens, n_j / n = 1 / k: the mean of means is right."""
    batch = _batch([123_456, 654_321, 100_001, 999_999])
    _, weighted = _one_step(accumulate(_loss(), 2), batch=batch)
    _, naive = _one_step(_mean_of_means(2), batch=batch)
    for name, (grad, _) in weighted.items():
        torch.testing.assert_close(naive[name][0], grad, rtol=1e-5, atol=1e-7)


def test_one_micro_batch_is_the_plain_loss():
    (loss, _, _), whole = _one_step(_loss())
    (acc_loss, _, _), accumulated = _one_step(accumulate(_loss(), 1))
    assert acc_loss == pytest.approx(loss, rel=1e-7)
    for name, (grad, param) in whole.items():
        torch.testing.assert_close(accumulated[name], (grad, param))


def test_the_loop_runs_on_accumulated_steps():
    """``run_steps`` takes the loss function as it is: the history of three steps in float64 is the
    whole batches' history."""
    histories = []
    for loss_fn in (_loss(), accumulate(_loss(), 3)):
        model = _model(torch.float64)
        optimizer, scheduler = make_optimizer(CONFIG, model)
        history: dict[str, list] = {}
        stream = iter([_batch(NUMBERS[i:] + NUMBERS[:i]) for i in range(3)])
        assert run_steps(model, stream, optimizer, scheduler, loss_fn, 3, history) == 3
        histories.append(history)
    assert histories[0].keys() == histories[1].keys()
    for key, values in histories[0].items():
        # the accuracy is a float32 mean whatever the model's type
        assert histories[1][key] == pytest.approx(values, rel=1e-6 if key == "accuracy" else 1e-9), key


def test_frozen_and_unused_parameters_keep_no_gradient():
    model = _model()
    model.src_embed.requires_grad_(False)
    frozen = [p for p in model.parameters() if not p.requires_grad]
    loss, _ = accumulate(_loss(), 2)(model, _batch())
    loss.backward()
    assert all(p.grad is None for p in frozen)
    assert any(p.grad is not None for p in model.parameters())


@pytest.mark.parametrize(
    "micro_batches, error, message",
    [
        (0, ValueError, "micro_batches must be a positive int, got 0"),
        (-2, ValueError, "micro_batches must be a positive int, got -2"),
        (2.0, TypeError, "micro_batches must be a positive int, got float 2.0"),
        (True, TypeError, "micro_batches must be a positive int, got bool True"),
        ("4", TypeError, "micro_batches must be a positive int, got str '4'"),
    ],
)
def test_bad_micro_batches_are_refused_by_name(micro_batches, error, message):
    with pytest.raises(error, match=message):
        accumulate(_loss(), micro_batches)


def test_other_bad_arguments_are_refused_by_name():
    with pytest.raises(TypeError, match="loss_fn must be a loss function .* got int"):
        accumulate(3, 2)
    with pytest.raises(ValueError, match="pad_id must be a non-negative int, got -1"):
        accumulate(_loss(), 2, pad_id=-1)
    loss_fn = accumulate(_loss(), 9)
    with pytest.raises(ValueError, match="micro_batches must be at most the batch's 8 sequences .*got 9"):
        loss_fn(_model(), _batch())
    with pytest.raises(TypeError, match="batch must be a Batch, got tuple"):
        accumulate(_loss(), 2)(_model(), tuple(_batch()))


def test_a_micro_batch_that_diverges_stops_the_step_before_the_optimiser_moves():
    from transformer.training.loop import DivergedError

    plain = _loss()
    calls = []

    def second_is_nan(model, b):
        calls.append(len(b.src))
        loss, metrics = plain(model, b)
        return (loss * float("nan") if len(calls) == 2 else loss), metrics

    model = _model()
    before = [p.detach().clone() for p in model.parameters()]
    optimizer, scheduler = make_optimizer(CONFIG, model)
    with pytest.raises(DivergedError, match="at step 5"):
        optimizer_step(model, _batch(), optimizer, scheduler, accumulate(second_is_nan, 4), step=5)
    assert calls == [2, 2, 2, 2]
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), before))


class _Kept:
    """A tensor that autograd keeps for the backward pass, counted while it is kept."""

    now = peak = 0

    def __init__(self, tensor):
        self.tensor, self.nbytes = tensor, tensor.numel() * tensor.element_size()
        _Kept.now += self.nbytes
        _Kept.peak = max(_Kept.peak, _Kept.now)

    def __del__(self):
        _Kept.now -= self.nbytes


def test_a_micro_batch_s_activations_are_freed_before_the_next_one_runs():
    """What accumulation is for: the most that autograd keeps at once falls about as 1 / k."""
    batch = _batch(NUMBERS * 4)  # 32 numbers

    def peak_kept(loss_fn):
        _Kept.now = _Kept.peak = 0
        model = _model()
        with torch.autograd.graph.saved_tensors_hooks(_Kept, lambda kept: kept.tensor):
            loss, _ = loss_fn(model, batch)
        loss.backward()
        return _Kept.peak

    whole = peak_kept(_loss())
    shares = {k: peak_kept(accumulate(_loss(), k)) / whole for k in (1, 2, 4, 8)}
    assert shares[1] == pytest.approx(1, abs=0.01)
    assert shares[8] < shares[4] < shares[2] < shares[1]
    assert all(share < 1 / k + 0.1 for k, share in shares.items() if k > 1), shares
