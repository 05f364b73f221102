"""Tests of transformer.tasks.numbers_fit: schedule, loss, clipping, checkpoints, the training loop."""

import copy
import math
from dataclasses import asdict

import pytest
import torch
import torch.nn.functional as F

from transformer import (TrainConfig, label_smoothed_cross_entropy, load_checkpoint, fit, run_steps, save_checkpoint,
    make_adam)
from transformer.training.schedules import cooldown_factor, warmup_lr, warmup_rate
from transformer.tasks.numbers_fit import evaluate_loss, exact_match, exact_match_below, predict, training_batches
from transformer.training.config import make_model, make_optimizer
from transformer.nn.modes import evaluating
from transformer.paths import model_cache_dir
from transformer.training.checkpoint import Resume, SaveCheckpoint, SaveEvery
from transformer.training.loop import Callback, Evaluate, train_step
from transformer.tasks.numbers import make_batch, source_vocab, split_numbers, target_vocab
from transformer.training.losses import seq2seq_loss

SRC, TGT = source_vocab(), target_vocab()
TINY = dict(d_model=16, num_heads=2, num_layers=1, d_ff=32, batch_size=16, warmup=4, eval_every=5, eval_size=20)


def tiny_config(**changes) -> TrainConfig:
    return TrainConfig(**{**TINY, **changes})


@pytest.fixture(scope="module")
def data():
    train_numbers, valid_numbers, _ = split_numbers(200, 20, 0, seed=1)
    return train_numbers, valid_numbers


def paper_rate(step, d_model, warmup):
    return d_model ** -0.5 * min(step ** -0.5, step * warmup ** -1.5)


# The schedule.

def test_warmup_lr_is_the_papers_formula():
    for step in [1, 2, 50, 399, 400, 401, 1000, 100_000]:
        assert math.isclose(warmup_lr(step, 512, 400), 512 ** -0.5 * min(step ** -0.5, step * 400 ** -1.5))


@pytest.mark.parametrize("d_model, warmup", [(512, 4000), (64, 100), (8, 1)])
def test_warmup_lr_peaks_at_warmup(d_model, warmup):
    rates = [warmup_lr(s, d_model, warmup) for s in range(1, 3 * warmup + 10)]
    assert rates.index(max(rates)) + 1 == warmup
    assert math.isclose(max(rates), (d_model * warmup) ** -0.5)
    # linear before the peak, 1 / sqrt(step) after it
    assert all(math.isclose(rates[s - 1], s * rates[0]) for s in range(1, warmup + 1))
    assert math.isclose(warmup_lr(4 * warmup, d_model, warmup), max(rates) / 2)


def test_scheduler_sets_factor_times_the_formula_on_the_optimizer():
    weight = torch.nn.Parameter(torch.zeros(3))
    optimizer, scheduler = make_adam([weight], warmup_rate(d_model=32, warmup=10, factor=2.0))
    group = optimizer.param_groups[0]
    assert type(optimizer) is torch.optim.Adam and group["betas"] == (0.9, 0.98) and group["eps"] == 1e-9
    for step in range(1, 40):
        assert math.isclose(optimizer.param_groups[0]["lr"], 2.0 * paper_rate(step, 32, 10))
        weight.grad = torch.ones(3)
        optimizer.step()
        scheduler.step()


@pytest.mark.parametrize("weight_decay", [0.0, 0.01])
def test_make_adam_foreach_gives_the_same_weights_bit_for_bit(weight_decay):
    # sentiment's fine-tuning asks for foreach=True to save time; it must change nothing
    torch.manual_seed(0)
    start = [torch.randn(300, 16), torch.randn(16), torch.randn(7, 16)]
    grads = [[torch.randn_like(w) for w in start] for _ in range(5)]
    weights = {}
    for foreach in (None, False, True):
        params = [torch.nn.Parameter(w.clone()) for w in start]
        optimizer, scheduler = make_adam(
            params, lambda s: min(1.0, s / 3), 1e-2, weight_decay=weight_decay, foreach=foreach
        )
        assert optimizer.defaults["foreach"] is foreach
        for step_grads in grads:
            for p, g in zip(params, step_grads):
                p.grad = g.clone()
            optimizer.step()
            scheduler.step()
        weights[foreach] = [p.detach() for p in params]
    assert not torch.equal(weights[None][0], start[0])  # the steps moved the weights
    for foreach in (False, True):
        assert all(torch.equal(a, b) for a, b in zip(weights[None], weights[foreach]))


def test_make_optimizer_uses_the_papers_adam():
    model = make_model(tiny_config(), SRC, TGT)
    optimizer, scheduler = make_optimizer(tiny_config(lr_factor=0.5), model)
    assert isinstance(optimizer, torch.optim.Adam)
    group = optimizer.param_groups[0]
    assert group["betas"] == (0.9, 0.98) and group["eps"] == 1e-9
    assert math.isclose(group["lr"], 0.5 * paper_rate(1, 16, 4))


def test_cooldown_is_a_line_to_zero_over_the_last_share_of_the_run():
    steps, cooldown = 40, 0.25  # the last 10 steps cool down
    expected = [1.0] * 31 + [(steps - s + 1) / 10 for s in range(32, 41)]  # 9/10, 8/10, ..., 1/10
    assert [cooldown_factor(s, steps, cooldown) for s in range(1, steps + 1)] == pytest.approx(expected)
    assert [cooldown_factor(s, steps, 0.0) for s in range(1, steps + 1)] == [1.0] * steps


def test_scheduler_with_cooldown_multiplies_the_papers_rate_and_makes_the_config_default():
    weight = torch.nn.Parameter(torch.zeros(3))
    optimizer, scheduler = make_adam([weight], warmup_rate(d_model=32, warmup=10, factor=0.5, steps=40, cooldown=0.25))
    for step in range(1, 41):
        line = min(1.0, (40 - step + 1) / 10)  # written out, independently of cooldown_factor
        assert math.isclose(optimizer.param_groups[0]["lr"], 0.5 * paper_rate(step, 32, 10) * line)
        weight.grad = torch.ones(3)
        optimizer.step()
        scheduler.step()
    assert TrainConfig().cooldown == 0.25  # the book's runs cool down; cooldown=0 is the paper's schedule


def test_an_interrupted_run_with_a_cooldown_resumes_exactly(data, tmp_path):
    train_numbers, valid_numbers = data
    config = tiny_config(dropout=0.1, steps=12, cooldown=0.5)
    straight_model, straight = fit(config, train_numbers, valid_numbers, progress=False)
    taken = []

    class StopAfterFive(Callback):  # a stand-in for a crash
        def on_step_begin(self, step, batch):
            taken.append(1)
            if len(taken) > 5:
                raise KeyboardInterrupt
            return batch

    with pytest.raises(KeyboardInterrupt):
        fit(config, train_numbers, valid_numbers, progress=False,
            callbacks=[SaveCheckpoint(tmp_path / "run.pt", 5), StopAfterFive()])
    assert torch.load(tmp_path / "run.pt", weights_only=True)["step"] == 5
    resumed_model, resumed = fit(config, train_numbers, valid_numbers, progress=False,
                                 callbacks=[Resume(tmp_path / "run.pt")])
    assert resumed["loss"] == straight["loss"] and resumed["lr"] == straight["lr"]
    assert resumed["lr"][-1] < resumed["lr"][5] / 5  # the cooldown did happen
    for a, b in zip(straight_model.state_dict().values(), resumed_model.state_dict().values()):
        assert torch.equal(a, b)


@pytest.mark.parametrize("call, message", [
    (lambda: TrainConfig(cooldown=1.0), r"cooldown must be in \[0, 1\), got 1.0"),
    (lambda: cooldown_factor(0, 10, 0.5), "step must be a positive int"),
    (lambda: warmup_rate(8, 4, cooldown=0.5), "cooldown needs steps"),
    (lambda: warmup_lr(0, 512, 4000), "step must be a positive int"),
    (lambda: warmup_lr(1, 0, 4000), "d_model must be a positive int"),
    (lambda: warmup_lr(1, 512, -1), "warmup must be a positive int"),
    (lambda: warmup_rate(8, 4, factor=0.0), "factor must be > 0"),
])
def test_bad_schedule_arguments(call, message):
    with pytest.raises(ValueError, match=message):
        call()


# The loss.

@pytest.fixture
def logits_and_target():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 13, generator=g, requires_grad=True)
    target = torch.randint(3, 13, (3, 5), generator=g)
    target[0, 3:] = 0
    target[2, 1:] = 0
    return logits, target


@pytest.mark.parametrize("epsilon", [0.0, 0.1, 0.3])
def test_loss_equals_torch_cross_entropy_with_label_smoothing(logits_and_target, epsilon):
    logits, target = logits_and_target
    ours = label_smoothed_cross_entropy(logits, target, epsilon=epsilon, ignore_index=0)
    theirs = F.cross_entropy(logits.flatten(0, 1), target.flatten(), label_smoothing=epsilon, ignore_index=0)
    torch.testing.assert_close(ours, theirs)
    (g_ours,) = torch.autograd.grad(ours, logits)
    (g_theirs,) = torch.autograd.grad(theirs, logits)
    torch.testing.assert_close(g_ours, g_theirs)


def test_loss_equals_the_formula(logits_and_target):
    logits, target = logits_and_target
    epsilon, V = 0.1, logits.shape[-1]
    total, count = 0.0, 0
    for b in range(target.shape[0]):
        for t in range(target.shape[1]):
            y = target[b, t].item()
            if y == 0:
                continue
            log_p = torch.log(torch.softmax(logits[b, t].double(), dim=0))
            q = torch.full((V,), epsilon / V, dtype=torch.float64)
            q[y] += 1 - epsilon
            total += -(q * log_p).sum().item()
            count += 1
    ours = label_smoothed_cross_entropy(logits, target, epsilon=epsilon)
    assert math.isclose(ours.item(), total / count, rel_tol=1e-5)


def test_padding_targets_are_ignored(logits_and_target):
    logits, target = logits_and_target
    changed = logits.detach().clone()
    changed[target == 0] = torch.randn(int((target == 0).sum()), 13) * 100
    torch.testing.assert_close(label_smoothed_cross_entropy(changed, target), label_smoothed_cross_entropy(logits, target))
    loss = label_smoothed_cross_entropy(logits, target)
    (grad,) = torch.autograd.grad(loss, logits)
    assert (grad[target == 0] == 0).all() and (grad[target != 0] != 0).any()


def test_smoothed_optimum_is_one_minus_epsilon_plus_epsilon_over_v():
    epsilon, V = 0.1, 13
    logits = torch.zeros(1, V, dtype=torch.float64, requires_grad=True)
    optimizer = torch.optim.LBFGS([logits], max_iter=200, line_search_fn="strong_wolfe")

    def closure():
        optimizer.zero_grad()
        loss = label_smoothed_cross_entropy(logits, torch.tensor([4]), epsilon, ignore_index=-100)
        loss.backward()
        return loss

    optimizer.step(closure)
    p = logits.detach().softmax(-1)[0]
    assert math.isclose(p[4].item(), 1 - epsilon + epsilon / V, abs_tol=1e-5)
    assert math.isclose(p[0].item(), epsilon / V, abs_tol=1e-5)


def test_loss_in_half_precision_is_computed_in_float32(logits_and_target):
    logits, target = logits_and_target
    half = label_smoothed_cross_entropy(logits.detach().bfloat16(), target)
    assert half.dtype == torch.float32 and torch.isfinite(half)
    torch.testing.assert_close(half, label_smoothed_cross_entropy(logits.detach(), target), atol=0.05, rtol=0.02)


def test_bad_loss_arguments(logits_and_target):
    logits, target = logits_and_target
    with pytest.raises(ValueError, match="target must have shape"):
        label_smoothed_cross_entropy(logits, target[:, :-1])
    with pytest.raises(ValueError, match=r"epsilon must be in \[0, 1\)"):
        label_smoothed_cross_entropy(logits, target, epsilon=1.0)
    with pytest.raises(TypeError, match="logits must be a torch.Tensor"):
        label_smoothed_cross_entropy(logits.tolist(), target)


# One step, and clipping.

def test_train_step_clips_the_gradient_norm():
    torch.manual_seed(0)
    model = make_model(tiny_config(), SRC, TGT)
    batch = make_batch([7, 1005, 12345], SRC, TGT)
    before = [p.detach().clone() for p in model.parameters()]
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    loss, accuracy, norm = train_step(model, batch, optimizer, label_smoothing=0.1, clip=1e-3)
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    clipped = torch.linalg.vector_norm(torch.stack([g.norm() for g in grads]))
    assert norm > 1e-3 and math.isclose(clipped.item(), 1e-3, rel_tol=1e-4)
    # SGD with lr 1 moves the parameters by exactly the clipped gradient
    moved = torch.linalg.vector_norm(torch.stack([(p.detach() - b).norm() for p, b in zip(model.parameters(), before)]))
    assert math.isclose(moved.item(), 1e-3, rel_tol=1e-3)
    assert 0.0 <= accuracy <= 1.0 and loss > 0


def test_train_step_without_clipping_returns_the_true_norm():
    torch.manual_seed(0)
    model = make_model(tiny_config(), SRC, TGT)
    batch = make_batch([7, 1005, 12345], SRC, TGT)
    _, _, norm = train_step(model, batch, torch.optim.SGD(model.parameters(), lr=0.0), clip=None)
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert math.isclose(norm, torch.linalg.vector_norm(torch.stack([g.norm() for g in grads])).item(), rel_tol=1e-5)


def test_train_step_under_bfloat16_autocast_keeps_float32_weights_and_a_close_loss():
    torch.manual_seed(0)
    model = make_model(tiny_config(), SRC, TGT)
    other = copy.deepcopy(model)
    batch = make_batch([7, 1005, 12345], SRC, TGT)
    full = train_step(model, batch, torch.optim.SGD(model.parameters(), lr=0.0))
    half = train_step(other, batch, torch.optim.SGD(other.parameters(), lr=0.0), autocast=torch.bfloat16)
    assert all(math.isfinite(x) for x in half)
    # bfloat16 keeps about 3 significant digits: close to the float32 loss and norm, but not the same
    assert half[0] != full[0] and math.isclose(half[0], full[0], rel_tol=2e-2)
    assert math.isclose(half[2], full[2], rel_tol=5e-2)
    assert all(p.dtype == torch.float32 for p in other.parameters())
    assert all(p.grad.dtype == torch.float32 for p in other.parameters() if p.grad is not None)
    # the loss function's autocast holds at every step of run_steps
    config = tiny_config(steps=2)
    losses = []
    for autocast, net in ((None, model), (torch.bfloat16, other)):
        history: dict[str, list] = {}
        run_steps(net, iter([batch, batch]), *make_optimizer(config, net), seq2seq_loss(autocast=autocast),
                  config.steps, history)
        losses.append(history["loss"])
    assert losses[0] != losses[1] and losses[1] == pytest.approx(losses[0], rel=2e-2)


def test_run_steps_takes_the_remaining_steps_and_calls_back_on_schedule():
    torch.manual_seed(0)
    config = tiny_config(steps=5, eval_every=2, cooldown=0.0, warmup=3)
    model = make_model(config, SRC, TGT)
    optimizer, scheduler = make_optimizer(config, model)
    batches = [make_batch([n, n + 11, n * 7], SRC, TGT) for n in range(1, 6)]
    stream, calls = iter(batches), {"validate": [], "save": [], "shard": 0}

    def validate(step):
        calls["validate"].append(step)
        return {"seen": str(step)}

    class Shard(Callback):
        def on_step_begin(self, step, batch):
            calls["shard"] += 1
            return batch

    history: dict[str, list] = {}
    loss_fn = seq2seq_loss(autocast=torch.bfloat16)
    # a run of 2 steps, then on to 5
    assert run_steps(model, stream, optimizer, scheduler, loss_fn, 2, history) == 2
    assert run_steps(model, stream, optimizer, scheduler, loss_fn, config.steps, history, 2,
                     callbacks=[Shard(), Evaluate(validate, 2),
                                SaveEvery(lambda step: calls["save"].append(step), 2)]) == 5
    assert list(history) == ["step", "lr", "loss", "accuracy", "grad_norm"]
    assert history["step"] == [1, 2, 3, 4, 5] and calls["shard"] == 3
    assert calls["validate"] == [4, 5] and calls["save"] == [4]  # every 2 steps and at the last one
    assert history["lr"] == pytest.approx([config.lr_factor * paper_rate(s, 16, 3) for s in range(1, 6)])
    assert all(math.isfinite(x) for key in ("loss", "grad_norm") for x in history[key])
    assert all(0.0 <= x <= 1.0 for x in history["accuracy"])
    with pytest.raises(StopIteration):
        next(stream)  # one batch a step
    # A run that is already complete takes no step.
    assert run_steps(model, iter([]), optimizer, scheduler, loss_fn, config.steps, history, 5) == 5
    assert len(history["loss"]) == 5


def test_checkpoint_keeps_the_extra_entries(tmp_path):
    model = make_model(tiny_config(), SRC, TGT)
    extra = {"tokenizer": '{"model": {"type": "BPE"}}', "note": {"averaged_steps": [3, 6]}}
    save_checkpoint(tmp_path / "c.pt", model, None, None, step=4, extra=extra)
    raw = torch.load(tmp_path / "c.pt", weights_only=True)  # plain types: still loads safely
    assert raw["tokenizer"] == extra["tokenizer"] and raw["note"] == extra["note"] and raw["step"] == 4
    assert load_checkpoint(tmp_path / "c.pt", make_model(tiny_config(), SRC, TGT)) == 4
    save_checkpoint(tmp_path / "plain.pt", model, None, None, step=4)
    assert "tokenizer" not in torch.load(tmp_path / "plain.pt", weights_only=True)


# Checkpoints.

def test_checkpoint_round_trip(tmp_path):
    torch.manual_seed(0)
    config = tiny_config()
    model = make_model(config, SRC, TGT)
    optimizer, scheduler = make_optimizer(config, model)
    for batch in [make_batch([1, 22, 333], SRC, TGT), make_batch([4444, 55555], SRC, TGT)]:
        train_step(model, batch, optimizer, scheduler)
    save_checkpoint(tmp_path / "c.pt", model, optimizer, scheduler, step=2)
    raw = torch.load(tmp_path / "c.pt", weights_only=True)  # loads safely
    assert raw["step"] == 2 and set(raw) >= {"model", "optimizer", "scheduler", "step", "rng_state"}

    torch.manual_seed(1)
    other = make_model(config, SRC, TGT)
    other_optimizer, other_scheduler = make_optimizer(config, other)
    assert load_checkpoint(tmp_path / "c.pt", other, other_optimizer, other_scheduler) == 2
    for (name, a), b in zip(model.state_dict().items(), other.state_dict().values()):
        assert torch.equal(a, b), name
    assert other_scheduler.last_epoch == scheduler.last_epoch == 2
    assert other_optimizer.param_groups[0]["lr"] == optimizer.param_groups[0]["lr"]
    for p, q in zip(model.parameters(), other.parameters()):
        assert torch.equal(optimizer.state[p]["exp_avg"], other_optimizer.state[q]["exp_avg"])
    assert other.output.weight is other.tgt_embed.weight  # still tied


def test_checkpoint_of_another_shape_names_the_parameter(tmp_path):
    model = make_model(tiny_config(), SRC, TGT)
    save_checkpoint(tmp_path / "c.pt", model, None, None, step=0)
    wider = make_model(tiny_config(d_ff=64), SRC, TGT)
    with pytest.raises(ValueError, match=r"'encoder\.layers\.0\.feed_forward\.w_1\.weight' has shape \(32, 16\), "
                                         r"but the model's has shape \(64, 16\)"):
        load_checkpoint(tmp_path / "c.pt", wider)
    deeper = make_model(tiny_config(num_layers=2), SRC, TGT)
    with pytest.raises(ValueError, match=r"the checkpoint has no parameter 'encoder\.layers\.1\."):
        load_checkpoint(tmp_path / "c.pt", deeper)
    save_checkpoint(tmp_path / "deep.pt", deeper, None, None, step=0)
    with pytest.raises(ValueError, match=r"parameter 'encoder\.layers\.1\..*' is not in the model"):
        load_checkpoint(tmp_path / "deep.pt", model)


def test_resumed_run_continues_the_same_loss_trajectory(data, tmp_path):
    train_numbers, valid_numbers = data
    k = 7  # 200 numbers in batches of 16: the second half crosses an epoch boundary (13 per epoch)
    # No cooldown: then a run of k steps is the start of a run of 2k, and carrying it on gives the same run.
    config = tiny_config(dropout=0.1, steps=2 * k, cooldown=0.0)
    straight_model, straight = fit(config, train_numbers, valid_numbers, progress=False)
    fit(tiny_config(dropout=0.1, steps=k, cooldown=0.0), train_numbers, valid_numbers, progress=False,
          callbacks=[SaveCheckpoint(tmp_path / "half.pt")])
    assert load_checkpoint(tmp_path / "half.pt", make_model(config, SRC, TGT)) == k
    resumed_model, resumed = fit(config, train_numbers, valid_numbers, progress=False,
                                 callbacks=[Resume(tmp_path / "half.pt")])
    assert resumed["step"] == list(range(1, 2 * k + 1))
    assert resumed["loss"] == straight["loss"] and resumed["lr"] == straight["lr"]
    for a, b in zip(straight_model.state_dict().values(), resumed_model.state_dict().values()):
        assert torch.equal(a, b)


def test_checkpoints_every_n_steps(data, tmp_path):
    train_numbers, _ = data
    fit(tiny_config(steps=6), train_numbers, progress=False, callbacks=[SaveCheckpoint(tmp_path / "run.pt", 4)])
    assert torch.load(tmp_path / "run.pt", weights_only=True)["step"] == 6


# The training loop.

def test_training_batches_resume_where_an_unbroken_stream_would_be(data):
    train_numbers, _ = data
    stream = training_batches(train_numbers, 16, SRC, TGT, seed=3)
    unbroken = [next(stream).tgt_out for _ in range(30)]  # more than two epochs of 13 batches
    later = training_batches(train_numbers, 16, SRC, TGT, seed=3, start_step=17)
    for expected in unbroken[17:]:
        assert torch.equal(next(later).tgt_out, expected)
    first_epoch = [int(TGT.decode(row)) for b in unbroken[:13] for row in b]
    assert sorted(first_epoch) == sorted(train_numbers)  # an epoch is every number once
    assert not torch.equal(unbroken[0], unbroken[13][:16])  # the next epoch is shuffled anew


def test_tiny_training_run_reduces_the_loss(data):
    train_numbers, valid_numbers = data
    model, history = fit(tiny_config(steps=60, lr_factor=0.25), train_numbers, valid_numbers, progress=False)
    first, last = sum(history["loss"][:10]) / 10, sum(history["loss"][-10:]) / 10
    assert last < 0.85 * first
    assert history["valid_step"] == list(range(5, 61, 5)) and history["valid_loss"][-1] < history["valid_loss"][0]
    assert history["step"] == list(range(1, 61)) and not model.training


def test_training_is_reproducible_and_leaves_global_state_alone(data):
    train_numbers, valid_numbers = data
    threads = torch.get_num_threads()
    torch.manual_seed(123)
    expected_draw = torch.rand(3)
    torch.manual_seed(123)
    first = fit(tiny_config(steps=5, num_threads=1), train_numbers, valid_numbers, progress=False)[1]
    assert torch.equal(torch.rand(3), expected_draw)  # the caller's random stream is untouched
    assert torch.get_num_threads() == threads
    second = fit(tiny_config(steps=5, num_threads=1), train_numbers, valid_numbers, progress=False)[1]
    assert first == second


def test_progress_bar_on_stderr_only_when_asked(data, capsys):
    train_numbers, _ = data
    fit(tiny_config(steps=3), train_numbers, progress=True)
    out, err = capsys.readouterr()
    assert "training" in err and "3/3" in err and out == ""
    fit(tiny_config(steps=3), train_numbers, progress=False)
    assert capsys.readouterr() == ("", "")


def test_cached_run_is_loaded_and_identical(data, tmp_path):
    train_numbers, valid_numbers = data
    config = tiny_config(steps=5)
    trained, history = fit(config, train_numbers, valid_numbers, progress=False, cache_dir=tmp_path)
    files = list(tmp_path.glob("*.pt"))
    assert len(files) == 1
    loaded, loaded_history = fit(config, train_numbers, valid_numbers, progress=False, cache_dir=tmp_path)
    assert loaded_history == history and list(tmp_path.glob("*.pt")) == files
    for a, b in zip(trained.state_dict().values(), loaded.state_dict().values()):
        assert torch.equal(a, b)
    fit(tiny_config(steps=6), train_numbers, valid_numbers, progress=False, cache_dir=tmp_path)
    assert len(list(tmp_path.glob("*.pt"))) == 2  # another config, another file


def test_model_cache_dir_finds_the_book_root(tmp_path, monkeypatch):
    (tmp_path / "_toc.yml").write_text("format: jb-book\n")
    (tmp_path / "chapters").mkdir()
    monkeypatch.chdir(tmp_path / "chapters")
    assert model_cache_dir() == tmp_path / "_build" / "models"


def test_exact_match_agrees_with_predict(data):
    train_numbers, valid_numbers = data
    model, _ = fit(tiny_config(steps=3), train_numbers, progress=False)
    answers = predict(model, valid_numbers, SRC, TGT, batch_size=7)
    assert len(answers) == len(valid_numbers) and all(isinstance(a, str) for a in answers)
    accuracy = exact_match(model, valid_numbers, SRC, TGT, batch_size=7)
    assert accuracy == sum(a == str(n) for a, n in zip(answers, valid_numbers)) / len(valid_numbers)
    assert 0.0 <= accuracy < 0.5  # three steps teach it next to nothing


def test_exact_match_below_counts_the_right_answers_under_each_limit(monkeypatch):
    numbers = [3, 7, 42, 99, 345, 5000]
    answers = ["3", "77773", "42", "9", "345", "5000"]  # 7 and 99 wrong
    monkeypatch.setattr("transformer.tasks.numbers_fit.predict", lambda model, given, *args, **kwargs: answers)
    assert exact_match_below(None, numbers, SRC, TGT) == {10: (1, 2), 100: (2, 4), 1_000: (3, 5)}
    assert exact_match_below(None, numbers, SRC, TGT, limits=(1_000_000,)) == {1_000_000: (4, 6)}



def test_evaluating_is_eval_mode_without_gradients_and_restores_the_mode_after_an_exception():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout(0.5)).train()
    with evaluating(model):
        assert not model.training and not model[1].training and not torch.is_grad_enabled()
    assert model.training and model[1].training and torch.is_grad_enabled()
    with pytest.raises(RuntimeError, match="inside"), evaluating(model):
        raise RuntimeError("inside")
    assert model.training and model[1].training and torch.is_grad_enabled()
    frozen = model.eval()
    with evaluating(frozen):
        pass
    assert not frozen.training  # eval mode stays eval mode


def test_evaluate_loss_restores_the_mode_when_the_model_fails():
    model = make_model(tiny_config(dropout=0.3), SRC, TGT).train()
    loss = evaluate_loss(model, [1, 22, 333], SRC, TGT)
    assert model.training and loss == evaluate_loss(model.eval(), [1, 22, 333], SRC, TGT)  # no dropout
    model.train()
    model.encoder.layers[0].feed_forward.register_forward_hook(lambda *_: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        evaluate_loss(model, [1, 22, 333], SRC, TGT)
    assert model.training


@pytest.mark.parametrize("changes, error, message", [
    ({"d_model": 0}, ValueError, "d_model must be a positive int"),
    ({"steps": 2.5}, TypeError, "steps must be a positive int"),
    ({"dropout": 1.0}, ValueError, r"dropout must be in \[0, 1\)"),
    ({"label_smoothing": -0.1}, ValueError, r"label_smoothing must be in \[0, 1\)"),
    ({"lr_factor": 0}, ValueError, "lr_factor must be a number > 0"),
    ({"clip": 0.0}, ValueError, "clip must be a number > 0"),
    ({"num_threads": 0}, ValueError, "num_threads must be a positive int"),
    ({"eval_every": 0}, ValueError, "eval_every must be a positive int"),
    ({"eval_size": -1}, ValueError, "eval_size must be a non-negative int"),
    # Issue 32: every field, its type and its range, named before a run starts.
    ({"betas": [0.9, "x"]}, TypeError, r"betas\[1\] must be a float in \[0, 1\), got str 'x'"),
    ({"betas": 0.9}, TypeError, r"betas must be two numbers \(beta1, beta2\), got 0.9"),
    ({"betas": (0.9,)}, ValueError, "betas must be two numbers"),
    ({"betas": (2.0, 3.0)}, ValueError, r"betas\[0\] must be in \[0, 1\), got 2.0"),
    ({"betas": (0.9, 1.0)}, ValueError, r"betas\[1\] must be in \[0, 1\), got 1.0"),
    ({"adam_eps": -1}, ValueError, "adam_eps must be a number > 0, got -1"),
    ({"adam_eps": float("inf")}, ValueError, "adam_eps must be a finite number > 0"),
    ({"lr_factor": float("nan")}, ValueError, "lr_factor must be a number > 0"),
    ({"seed": 1.5}, TypeError, "seed must be a non-negative int, got float 1.5"),
    ({"seed": True}, TypeError, "seed must be a non-negative int, got bool"),
    ({"seed": -1}, ValueError, "seed must be a non-negative int, got -1"),
    ({"seed": 2**64}, ValueError, "seed must be below 2\\*\\*64"),
    ({"warmup": 0}, ValueError, "warmup must be a positive int"),
    ({"dropout": "0.1"}, TypeError, r"dropout must be a float in \[0, 1\), got str"),
    ({"cooldown": None}, TypeError, "cooldown must be a float"),
    ({"clip": "1"}, TypeError, "clip must be a number > 0, got str"),
    ({"num_threads": 1.0}, TypeError, "num_threads must be a positive int, got float"),
    ({"max_len": None}, TypeError, "max_len must be a positive int, got NoneType"),
])
def test_bad_config(changes, error, message):
    with pytest.raises(error, match=message):
        TrainConfig(**changes)


def test_bad_training_data():
    with pytest.raises(ValueError, match=r"numbers\[1\] must be an int in \[0, 999999\]"):
        fit(tiny_config(steps=1), [5, 1_000_000], progress=False)
    with pytest.raises(ValueError, match="numbers must not be empty"):
        fit(tiny_config(steps=1), [], progress=False)


def test_config_defaults_are_the_books_run():
    config = TrainConfig()
    assert asdict(config)["betas"] == (0.9, 0.98) and config.adam_eps == 1e-9 and config.label_smoothing == 0.1


# Issue 13: checkpoints that describe their model, and clear errors.

def test_label_smoothing_refuses_a_float_target():
    with pytest.raises(TypeError, match="target must hold integer token ids"):
        label_smoothed_cross_entropy(torch.randn(2, 3, 5), torch.zeros(2, 3))


def test_load_checkpoint_refuses_a_plain_state_dict(tmp_path):
    model = make_model(TrainConfig(**TINY), SRC, TGT)
    torch.save(model.state_dict(), tmp_path / "plain.pt")
    with pytest.raises(ValueError, match="plain.pt is not a checkpoint of save_checkpoint .* plain state_dict"):
        load_checkpoint(tmp_path / "plain.pt", model)


def test_a_checkpoint_of_fit_rebuilds_its_model_and_refuses_other_settings(tmp_path):
    from transformer.training.checkpoint import check_resume

    config = TrainConfig(**TINY, steps=3, seed=1)
    numbers = list(range(1, 40))
    model, _ = fit(config, numbers, progress=False, callbacks=[SaveCheckpoint(tmp_path / "c.pt")])
    rebuilt = load_checkpoint(tmp_path / "c.pt")  # from the file alone
    assert isinstance(rebuilt, type(model)) and not rebuilt.training
    batch = make_batch([12, 345], SRC, TGT)
    torch.testing.assert_close(rebuilt(batch.src, batch.tgt_in, batch.src_mask),
                               model(batch.src, batch.tgt_in, batch.src_mask), rtol=0, atol=0)
    # Going on for more steps (or, after a divergence, at a lower rate) is allowed; another width or smoothing is not.
    fit(TrainConfig(**TINY, steps=4, seed=1), numbers, progress=False, callbacks=[Resume(tmp_path / "c.pt")])
    with pytest.raises(ValueError, match=r"cannot resume from .*c.pt: .* d_model=16 there, 32 here"):
        fit(TrainConfig(**{**TINY, "d_model": 32}, steps=4, seed=1), numbers, progress=False,
            callbacks=[Resume(tmp_path / "c.pt")])
    checkpoint = torch.load(tmp_path / "c.pt", weights_only=True)
    with pytest.raises(ValueError, match="label_smoothing=0.1 there, 0.2 here"):
        check_resume(checkpoint, TrainConfig(**TINY, steps=3, seed=1, label_smoothing=0.2), "c.pt")
    check_resume(checkpoint, TrainConfig(**TINY, steps=3, seed=1, lr_factor=0.1, clip=None), "c.pt")
    save_checkpoint(tmp_path / "bare.pt", model, None, None, step=0)
    with pytest.raises(ValueError, match="does not describe its model"):
        load_checkpoint(tmp_path / "bare.pt")


def test_a_batch_whose_targets_are_all_padding_has_loss_zero_and_a_zero_gradient():
    logits = torch.randn(2, 5, 11, requires_grad=True)  # (B, T, V)
    target = torch.zeros(2, 5, dtype=torch.long)  # every target is the padding id 0
    loss = label_smoothed_cross_entropy(logits, target, epsilon=0.1, ignore_index=0)
    assert loss.item() == 0.0  # not nan, torch's mean over no positions
    loss.backward()
    assert logits.grad is not None and (logits.grad == 0).all()
    assert torch.isnan(F.cross_entropy(logits.flatten(0, 1), target.flatten(), ignore_index=0))  # what it replaces
