"""The one training loop (transformer.training.loop) against the loop written out by hand.

Every task trains with ``run_steps``; these tests check that it takes exactly the steps of the
textbook loop (forward, loss, zero_grad, backward, clip, Adam, schedule), bit for bit, and that it
records what it says it records.
"""

import math

import pytest
import torch
import torch.nn.functional as F

from transformer.tasks.classifier import classification_loss
from transformer.tasks.language_model import next_token_loss
from transformer.training.checkpoint import SaveEvery
from transformer.training.loop import Callback, DivergedError, Evaluate, first_non_finite, optimizer_step, run_steps

pytestmark = pytest.mark.usefixtures("one_thread")


def _model_and_batches(seed: int = 0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Dropout(0.1), torch.nn.Linear(16, 3))
    batches = [(torch.randn(8, 6), torch.randint(0, 3, (8,))) for _ in range(5)]
    return model, batches


def _optimiser(model):
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2, betas=(0.9, 0.98), eps=1e-9)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda done: 1.0 / (done + 1))


@pytest.mark.parametrize("clip", [0.05, None])
def test_run_steps_takes_the_steps_of_the_loop_written_out(clip):
    # By hand: the loop every PyTorch tutorial writes.
    model, batches = _model_and_batches()
    optimizer, scheduler = _optimiser(model)
    torch.manual_seed(1)  # dropout draws
    losses, norms = [], []
    for x, y in batches:
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in model.parameters()]))
        if clip is not None and norm > clip:
            for p in model.parameters():
                p.grad.mul_(clip / (norm + 1e-6))  # clip_grad_norm_'s formula
        optimizer.step()
        scheduler.step()
        losses.append(loss.item())
        norms.append(norm.item())
    by_hand = [p.detach().clone() for p in model.parameters()]

    model, batches = _model_and_batches()
    optimizer, scheduler = _optimiser(model)
    torch.manual_seed(1)
    history: dict[str, list] = {}
    assert run_steps(model, iter(batches), optimizer, scheduler, classification_loss, 5, history, clip=clip) == 5
    assert history["loss"] == pytest.approx(losses, rel=1e-6)
    assert history["grad_norm"] == pytest.approx(norms, rel=1e-6)
    assert history["lr"] == pytest.approx([1e-2 / s for s in range(1, 6)])
    for ours, theirs in zip(model.parameters(), by_hand):
        torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-7)


def test_run_steps_records_the_metrics_of_the_loss_function_and_calls_back():
    model, batches = _model_and_batches()
    optimizer, scheduler = _optimiser(model)
    seen = []
    history: dict[str, list] = {"valid_step": []}

    def validate(step):
        history["valid_step"].append(step)
        return {"seen": str(step)}

    class Hooks(Callback):  # records every call, in order
        def on_train_begin(self, first, last):
            seen.append(("begin", first, last))

        def on_evaluate(self, step, measured):
            seen.append(("evaluate", step, measured))

        def on_train_end(self, step):
            seen.append(("end", step))

    run_steps(model, iter(batches), optimizer, scheduler, classification_loss, 5, history,
              callbacks=[Evaluate(validate, 2), SaveEvery(lambda step: seen.append(("save", step)), 3), Hooks()])
    assert list(history) == ["valid_step", "step", "lr", "loss", "accuracy", "grad_norm"]
    assert history["step"] == [1, 2, 3, 4, 5] and history["valid_step"] == [2, 4, 5]
    assert seen == [("begin", 1, 5), ("evaluate", 2, {"seen": "2"}), ("save", 3), ("evaluate", 4, {"seen": "4"}),
                    ("evaluate", 5, {"seen": "5"}), ("end", 5)]
    assert all(0.0 <= a <= 1.0 for a in history["accuracy"])


def test_the_language_models_loss_is_the_mean_cross_entropy_of_every_position():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(7, 5), torch.nn.Linear(5, 7))
    inputs, targets = torch.randint(0, 7, (3, 4)), torch.randint(0, 7, (3, 4))
    loss, metrics = next_token_loss(model, (inputs, targets))
    logits = model(inputs)
    by_hand = -sum(logits[b, t].log_softmax(-1)[targets[b, t]] for b in range(3) for t in range(4)) / 12
    assert metrics == {} and math.isclose(loss.item(), by_hand.item(), rel_tol=1e-6)


def test_optimizer_step_without_clip_measures_the_norm_and_leaves_the_gradient():
    model, batches = _model_and_batches()
    model.eval()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    loss, metrics, norm = optimizer_step(model, batches[0], optimizer, None, classification_loss, clip=None)
    grads = [p.grad for p in model.parameters()]
    assert math.isclose(norm, torch.linalg.vector_norm(torch.stack([g.norm() for g in grads])).item(), rel_tol=1e-6)
    assert set(metrics) == {"accuracy"} and math.isfinite(loss)


# --- divergence and bad arguments (issue 47) ---------------------------------------------------

def _squared_error(model, batch):
    x, y = batch
    return ((model(x) - y) ** 2).mean(), {}


def _diverging_run(lr: float = 1e20):
    """A least-squares line under plain gradient descent at ``lr``: step 1 throws the weights to about lr,
    and the loss of step 2 overflows float32."""
    torch.manual_seed(0)
    line = torch.nn.Linear(4, 1)
    return line, torch.optim.SGD(line.parameters(), lr=lr), iter([(torch.ones(8, 4), torch.zeros(8, 1))] * 5)


def test_a_diverging_run_stops_at_the_step_with_a_named_error_and_finite_weights():
    line, optimizer, stream = _diverging_run()
    history: dict[str, list] = {}
    after_step_1 = None

    class Keep(Callback):
        def on_step_end(self, step, record):
            nonlocal after_step_1
            after_step_1 = [p.detach().clone() for p in line.parameters()]

    with pytest.raises(DivergedError, match=r"^the run diverged at step 2: the loss is inf$") as err:
        run_steps(line, stream, optimizer, None, _squared_error, 5, history, callbacks=[Keep()])
    assert isinstance(err.value, FloatingPointError) and (err.value.step, err.value.what) == (2, "the loss is inf")
    assert history["step"] == [1]  # the diverged step is not recorded
    assert all(torch.equal(p, q) for p, q in zip(line.parameters(), after_step_1))  # the optimiser did not move
    assert first_non_finite(line.named_parameters()) is None


def test_a_non_finite_gradient_is_named_by_its_parameter():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    def nan_in_the_second_layer(net, batch):  # a finite loss (0) whose gradient is nan in layer 1 only
        weight = net[1].weight  # all -1: the sqrt branch is not taken, but its gradient, 0 * inf, is nan
        return net[0](batch).sum() * 0 + torch.where(weight > 0, weight.sqrt(), torch.zeros_like(weight)).sum(), {}

    with torch.no_grad():
        model[1].weight.fill_(-1.0)
    with pytest.raises(DivergedError, match=r"step 1: the gradient norm is nan \(first in the gradient of '1.weight'\)"):
        run_steps(model, iter([torch.ones(3, 2)]), optimizer, None, nan_in_the_second_layer, 1, {})


def test_a_diverging_step_outside_the_loop_names_no_step():
    line, optimizer, stream = _diverging_run()
    optimizer_step(line, next(stream), optimizer, None, _squared_error)
    with pytest.raises(DivergedError, match=r"^the run diverged: the loss is inf$"):
        optimizer_step(line, next(stream), optimizer, None, _squared_error)


@pytest.mark.parametrize("arguments, error, message", [
    (dict(stream=iter([])), ValueError, "stream ran out of batches before step 1 of 3"),
    (dict(steps=-1), ValueError, "steps must be a non-negative int, got -1"),
    (dict(steps=2.5), TypeError, "steps must be a non-negative int, got float 2.5"),
    (dict(step=-2), ValueError, "step must be a non-negative int, got -2"),
    (dict(history=None), TypeError, "history must be a dict .*, got NoneType"),
])
def test_run_steps_refuses_bad_arguments_naming_them(arguments, error, message):
    model, batches = _model_and_batches()
    optimizer, scheduler = _optimiser(model)
    given = dict(stream=iter(batches), steps=3, history={}, step=0, **{})
    given.update(arguments)
    with pytest.raises(error, match=message):
        run_steps(model, given["stream"], optimizer, scheduler, classification_loss, given["steps"], given["history"],
                  given["step"])


def test_a_finished_run_takes_no_steps_and_is_not_refused():
    model, batches = _model_and_batches()
    optimizer, scheduler = _optimiser(model)
    history: dict[str, list] = {}
    assert run_steps(model, iter(batches), optimizer, scheduler, classification_loss, 3, history, 5) == 5
    assert history == {}


def test_a_step_that_raises_tells_every_callback_which_closes_its_bar_first(capsys):
    from transformer.training.loop import Progress

    line, optimizer, stream = _diverging_run()
    stopped = []

    class Record(Callback):
        def on_train_stop(self, step, error):
            stopped.append((step, type(error).__name__))

    progress = Progress()
    with pytest.raises(DivergedError):
        run_steps(line, stream, optimizer, None, _squared_error, 5, {}, callbacks=[progress, Record()])
    assert stopped == [(2, "DivergedError")]
    assert progress.bar.disable  # closed: nothing more is drawn after the error's message

    def interrupted(net, batch):  # Ctrl-C inside a step: a KeyboardInterrupt reaches the callbacks too
        raise KeyboardInterrupt

    stopped.clear()
    line, optimizer, stream = _diverging_run()
    with pytest.raises(KeyboardInterrupt):
        run_steps(line, stream, optimizer, None, interrupted, 5, {}, callbacks=[Record()])
    assert stopped == [(1, "KeyboardInterrupt")]
