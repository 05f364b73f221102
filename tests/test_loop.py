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
from transformer.training.loop import Callback, Evaluate, optimizer_step, run_steps

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
