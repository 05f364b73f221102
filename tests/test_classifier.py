"""Tests for transformer/tasks/classifier.py (chapters/encoder_only.md)."""

import itertools
import math
import random

import pytest
import torch
from torch import nn

from transformer.nn.attention import padding_mask
from transformer.tasks.brackets import (BRACKET_VOCAB, bracket_dataset, bracket_split, decode_brackets, encode_brackets,
    is_balanced, near_miss, random_balanced)
from transformer import SequenceClassifier, train_classifier
from transformer.tasks.classifier import accuracy

D_MODEL, NUM_HEADS, D_FF = 16, 2, 32


def make_model(pooling="cls", seed=0, vocab_size=5, num_classes=3, dropout=0.0, **kwargs):
    torch.manual_seed(seed)
    return SequenceClassifier(vocab_size, num_classes, d_model=D_MODEL, num_heads=NUM_HEADS, d_ff=D_FF,
                              num_layers=2, dropout=dropout, max_len=32, pooling=pooling, **kwargs).eval()


def padded_tokens():
    """Three sequences of lengths 5, 3 and 1 (ids 1..4), padded with 0 at the end to length 5."""
    return torch.tensor([[1, 2, 3, 4, 1], [4, 3, 2, 0, 0], [2, 0, 0, 0, 0]])


def reference_balanced(text):
    """Balanced iff deleting adjacent "()" pairs until none is left leaves nothing (no depth counter)."""
    while "()" in text:
        text = text.replace("()", "")
    return text == ""


# The classifier.

@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_shapes(pooling):
    model = make_model(pooling)
    tokens = padded_tokens()
    assert model(tokens).shape == (3, 3)
    x, mask = model.encoder_inputs(tokens)
    extra = 1 if pooling == "cls" else 0
    assert x.shape == (3, 5 + extra, D_MODEL) and mask.shape == (3, 1, 1, 5 + extra)
    assert model.pool(torch.randn(3, 5 + extra, D_MODEL), mask).shape == (3, D_MODEL)


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_float64(pooling):
    model = make_model(pooling).double()
    logits = model(padded_tokens())
    assert logits.dtype == torch.float64 and torch.isfinite(logits).all()


def test_class_token_pooling_is_the_encoder_run_by_hand():
    model = make_model("cls")
    tokens = padded_tokens()
    B, N = tokens.shape
    with torch.no_grad():
        embedded = model.embed.weight[tokens] * math.sqrt(D_MODEL)  # (B, N, d_model)
        x = torch.cat([model.cls_token.expand(B, 1, D_MODEL), embedded], dim=1)  # class vector first
        x = x + model.positional_encoding.table[:N + 1]  # positions 0 .. N
        mask = torch.cat([torch.zeros(B, 1, dtype=torch.bool), tokens == 0], dim=1).view(B, 1, 1, N + 1)
        expected = model.head(model.encoder(x, mask=mask)[:, 0])
        torch.testing.assert_close(model(tokens), expected)


def test_mean_pooling_is_the_masked_mean():
    model = make_model("mean")
    tokens = padded_tokens()
    with torch.no_grad():
        x = model.embed.weight[tokens] * math.sqrt(D_MODEL) + model.positional_encoding.table[:5]
        h = model.encoder(x, mask=padding_mask(tokens, 0))  # (B, N, d_model)
        lengths = [5, 3, 1]
        means = torch.stack([h[i, :n].sum(dim=0) / n for i, n in enumerate(lengths)])
        torch.testing.assert_close(model(tokens), model.head(means))


def test_class_token_is_a_parameter_only_with_cls_pooling():
    assert any(name == "cls_token" for name, _ in make_model("cls").named_parameters())
    assert make_model("mean").cls_token is None
    assert not any("cls" in name for name, _ in make_model("mean").named_parameters())


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_padding_at_the_end_is_invisible(pooling):
    model = make_model(pooling)
    tokens = padded_tokens()
    more = torch.cat([tokens, torch.zeros(3, 7, dtype=torch.long)], dim=1)  # (3, 12)
    torch.testing.assert_close(model(more), model(tokens))
    torch.testing.assert_close(model(tokens[1:2, :3]), model(tokens)[1:2])  # no padding at all


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_padding_is_masked_in_attention(pooling):
    """A padding id with a non-zero embedding still changes nothing: it is masked, not just zero."""
    model = make_model(pooling)
    with torch.no_grad():
        model.embed.weight[0] = torch.randn(D_MODEL)
    tokens = padded_tokens()
    more = torch.cat([tokens, torch.zeros(3, 4, dtype=torch.long)], dim=1)
    torch.testing.assert_close(model(more), model(tokens))


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_batch_rows_are_independent(pooling):
    model = make_model(pooling)
    tokens = padded_tokens()
    alone = torch.cat([model(tokens[i:i + 1]) for i in range(3)])
    torch.testing.assert_close(model(tokens), alone)


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_order_matters(pooling):
    """With positions, reversing a sequence changes the logits (a bag of tokens would not)."""
    model = make_model(pooling)
    tokens = torch.tensor([[1, 2, 3, 4, 1]])
    assert not torch.allclose(model(tokens), model(tokens.flip(1)))


def test_class_token_sees_the_last_position():
    model = make_model("cls")
    tokens = torch.tensor([[1, 2, 3, 4, 1]])
    changed = tokens.clone()
    changed[0, -1] = 2
    assert not torch.allclose(model(tokens), model(changed))


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_all_padding_row_is_finite(pooling):
    model = make_model(pooling)
    tokens = torch.tensor([[1, 2, 3], [0, 0, 0]])
    logits = model(tokens)
    assert torch.isfinite(logits).all()
    if pooling == "mean":  # nothing to average: the pooled vector is zero, the logits are the bias
        torch.testing.assert_close(logits[1], model.head.bias)


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_gradients_reach_every_parameter(pooling):
    model = make_model(pooling).train()
    tokens = padded_tokens()
    loss = torch.nn.functional.cross_entropy(model(tokens), torch.tensor([0, 1, 2]))
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, name
    assert (model.embed.weight.grad[0] == 0).all()  # the padding row gets no gradient


def test_dropout_is_active_in_training_mode_only():
    model = make_model("cls", dropout=0.5)
    tokens = padded_tokens()
    torch.testing.assert_close(model(tokens), model(tokens))
    model.train()
    assert not torch.allclose(model(tokens), model(tokens))


def test_bad_arguments():
    with pytest.raises(ValueError, match="pooling must be 'cls' or 'mean'"):
        SequenceClassifier(5, 2, pooling="max")
    with pytest.raises(ValueError, match="num_classes must be a positive int"):
        SequenceClassifier(5, 0)
    with pytest.raises(TypeError, match="pad_id must be an int"):
        SequenceClassifier(5, 2, pad_id=None)
    with pytest.raises(ValueError, match=r"pad_id must lie in \[0, vocab_size=5\)"):
        SequenceClassifier(5, 2, pad_id=5)
    with pytest.raises(ValueError, match="vocab_size must be a positive int"):
        SequenceClassifier(0, 2)
    with pytest.raises(ValueError, match=r"dropout must be in \[0, 1\)"):
        SequenceClassifier(5, 2, dropout=1.0)
    with pytest.raises(ValueError, match="divisible"):
        SequenceClassifier(5, 2, d_model=10, num_heads=4)


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_bad_tokens(pooling):
    model = make_model(pooling)
    with pytest.raises(TypeError, match="tokens must hold integer token ids"):
        model(torch.rand(2, 4))
    with pytest.raises(TypeError, match="tokens must be a torch.Tensor"):
        model([[1, 2]])
    with pytest.raises(ValueError, match=r"tokens must have shape \(B, S\)"):
        model(torch.tensor([1, 2, 3]))
    with pytest.raises(ValueError, match=r"tokens must lie in \[0, vocab_size=5\)"):
        model(torch.tensor([[1, 5]]))
    longest = 32 - (pooling == "cls")
    assert model(torch.ones(1, longest, dtype=torch.long)).shape == (1, 3)  # the longest accepted
    with pytest.raises(ValueError, match="max_len=32"):
        model(torch.ones(1, longest + 1, dtype=torch.long))


# The bracket task.

def test_is_balanced_agrees_with_a_reference_on_every_short_string():
    for length in range(9):
        for chars in itertools.product("()", repeat=length):
            text = "".join(chars)
            assert is_balanced(text) == reference_balanced(text), text


def test_encode_and_decode():
    assert BRACKET_VOCAB[0] == "<pad>"
    assert encode_brackets("(()").tolist() == [1, 1, 2]
    assert encode_brackets("(()", 5).tolist() == [1, 1, 2, 0, 0]
    assert encode_brackets("").dtype == torch.long
    assert decode_brackets(torch.tensor([1, 2, 2, 1, 0, 0])) == "())("
    with pytest.raises(ValueError, match="text must hold only"):
        encode_brackets("(x)")
    with pytest.raises(TypeError, match="text must be a str"):
        encode_brackets(["(", ")"])
    with pytest.raises(ValueError, match="more than length=2"):
        encode_brackets("(((", 2)
    with pytest.raises(ValueError, match=r"tokens must have shape \(N,\)"):
        decode_brackets(torch.tensor([[1, 2]]))
    with pytest.raises(ValueError, match="tokens must lie in"):
        decode_brackets(torch.tensor([1, 3]))


def test_random_balanced_is_balanced_and_covers_every_sequence():
    rng = random.Random(0)
    for n in range(1, 15):
        text = random_balanced(n, rng)
        assert len(text) == 2 * n and reference_balanced(text)
    draws = [random_balanced(4, rng) for _ in range(2800)]
    counts = {text: draws.count(text) for text in set(draws)}
    assert len(counts) == 14  # the Catalan number C_4: every balanced sequence of 4 pairs
    assert all(abs(c / 2800 - 1 / 14) < 0.03 for c in counts.values())  # about equally often


def test_near_miss():
    rng = random.Random(0)
    for _ in range(300):
        n = rng.randint(3, 12)
        text = near_miss(n, rng)
        assert len(text) == 2 * n and text.count("(") == text.count(")") == n
        assert not reference_balanced(text)
        assert text[0] == "(" and text[-1] == ")"
        # one exchange away from balanced: some ')' before a '(' can swap back
        assert any(reference_balanced(text[:i] + "(" + text[i + 1:j] + ")" + text[j + 1:])
                   for i in range(len(text)) for j in range(i + 1, len(text)) if text[i] == ")" and text[j] == "(")
    with pytest.raises(ValueError, match="n must be >= 3"):
        near_miss(2, rng)


def test_bracket_split():
    assert {bracket_split("(" * k + ")" * k) for k in range(1, 60)} == {"train", "test"}
    texts = ["".join(random.Random(k).choices("()", k=12)) for k in range(2000)]
    share = sum(bracket_split(t) == "test" for t in set(texts)) / len(set(texts))
    assert abs(share - 0.2) < 0.04
    assert all(bracket_split(t, 0.2) == bracket_split(t, 0.2) for t in texts[:50])


def test_dataset_labels_counts_and_padding():
    tokens, labels = bracket_dataset(400, max_len=20, seed=3, min_len=8)
    assert tokens.shape == (400, 20) and labels.shape == (400,)
    assert tokens.dtype == labels.dtype == torch.long
    assert labels.sum().item() == 200  # half balanced
    for row, label in zip(tokens.tolist(), labels.tolist()):
        length = sum(t != 0 for t in row)
        assert all(t != 0 for t in row[:length]) and all(t == 0 for t in row[length:])  # padding at the end
        assert length % 2 == 0 and 8 <= length <= 20
        text = "".join("()"[t - 1] for t in row[:length])
        assert reference_balanced(text) == bool(label)
        assert text.count("(") == text.count(")")  # negatives too: counts say nothing
        assert text[0] == "(" and text[-1] == ")"


def test_dataset_lengths_alike_in_both_classes():
    tokens, labels = bracket_dataset(4000, max_len=16, seed=0, min_len=8)
    lengths = (tokens != 0).sum(dim=1)
    for length in (8, 10, 12, 14, 16):
        pos = (lengths[labels == 1] == length).float().mean().item()
        neg = (lengths[labels == 0] == length).float().mean().item()
        assert abs(pos - 0.2) < 0.04 and abs(neg - 0.2) < 0.04


def test_dataset_splits_are_disjoint():
    train, _ = bracket_dataset(2000, max_len=16, seed=0, split="train")
    test, _ = bracket_dataset(2000, max_len=16, seed=0, split="test")
    train_rows, test_rows = {tuple(r) for r in train.tolist()}, {tuple(r) for r in test.tolist()}
    assert not train_rows & test_rows
    assert all(bracket_split(decode_brackets(r)) == "test" for r in test[:200])


def test_dataset_distinct_draws_every_sequence_once():
    tokens, labels = bracket_dataset(600, max_len=16, seed=2, split="test", min_len=8, distinct=True)
    texts = [decode_brackets(row) for row in tokens]
    assert len(set(texts)) == 600 and labels.sum().item() == 300
    assert all(bracket_split(t) == "test" and reference_balanced(t) == bool(y) for t, y in zip(texts, labels.tolist()))
    plain, _ = bracket_dataset(600, max_len=16, seed=2, split="test", min_len=8)
    assert len({tuple(r) for r in plain.tolist()}) < 600  # without it, short sequences repeat
    with pytest.raises(ValueError, match="no new near-miss sequence of length 6 found in the 'test' split"):
        bracket_dataset(10, max_len=6, min_len=6, split="test", distinct=True)  # 1 near miss of length 6 is there
    with pytest.raises(TypeError, match="distinct must be a bool"):
        bracket_dataset(10, distinct=1)


def test_dataset_is_seeded():
    a = bracket_dataset(100, max_len=16, seed=5)
    b = bracket_dataset(100, max_len=16, seed=5)
    c = bracket_dataset(100, max_len=16, seed=6)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[0], c[0])


def test_dataset_bad_arguments():
    with pytest.raises(ValueError, match="num_examples must be even"):
        bracket_dataset(7)
    with pytest.raises(ValueError, match="num_examples must be a positive int"):
        bracket_dataset(0)
    with pytest.raises(TypeError, match="max_len must be a positive int"):
        bracket_dataset(10, max_len=12.0)
    with pytest.raises(ValueError, match="min_len must be >= 6"):
        bracket_dataset(10, min_len=4)
    with pytest.raises(ValueError, match="min_len must be >= 6"):
        bracket_dataset(10, max_len=10, min_len=12)
    with pytest.raises(ValueError, match="no even length"):
        bracket_dataset(10, max_len=7, min_len=7)
    with pytest.raises(ValueError, match="no near-miss sequence of length 6 found in the 'train' split"):
        bracket_dataset(10, max_len=6, min_len=6, split="train")  # the only one is in the test split
    with pytest.raises(ValueError, match="split must be 'train' or 'test'"):
        bracket_dataset(10, split="valid")
    with pytest.raises(ValueError, match="test_fraction must be a number in"):
        bracket_dataset(10, test_fraction=1.0)


# Training and accuracy.

def test_accuracy_counts_right_answers():
    model = make_model("mean", num_classes=3)
    tokens = torch.randint(1, 5, (50, 6))
    predictions = model(tokens).argmax(dim=-1)
    labels = predictions.clone()
    labels[:10] = (labels[:10] + 1) % 3  # ten wrong on purpose
    assert accuracy(model, tokens, labels, batch_size=7) == pytest.approx(0.8)
    model.train()
    accuracy(model, tokens, labels)
    assert model.training  # mode restored
    model.head.register_forward_hook(lambda *_: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        accuracy(model, tokens, labels)
    assert model.training  # also after an error


def test_accuracy_bad_input():
    model = make_model("cls")
    tokens = torch.ones(4, 3, dtype=torch.long)
    with pytest.raises(ValueError, match="labels"):
        accuracy(model, tokens, torch.zeros(3, dtype=torch.long))
    with pytest.raises(TypeError, match="labels must be an integer tensor"):
        accuracy(model, tokens, torch.zeros(4))


def tiny_task(seed):
    """A tiny easy bracket task: lengths 8 and 10 only (few different sequences)."""
    return bracket_dataset(1000, max_len=10, min_len=8, seed=seed, split="train")


@pytest.mark.slow  # a training run
def test_training_learns_the_tiny_task():
    torch.manual_seed(0)
    model = SequenceClassifier(len(BRACKET_VOCAB), 2, d_model=16, num_heads=2, d_ff=32, num_layers=2, dropout=0.0)
    tokens, labels = tiny_task(0)
    before = accuracy(model, tokens, labels)
    history = train_classifier(model, tokens, labels, steps=150, batch_size=64, lr=3e-3, warmup=15, seed=0,
                               valid=(tokens[:200], labels[:200]), eval_every=50)
    after = accuracy(model, tokens, labels)
    assert after > 0.9 and after > before + 0.2, (before, after)
    assert sum(history["loss"][-10:]) < sum(history["loss"][:10])
    assert history["valid_step"] == [50, 100, 150] and len(history["valid_accuracy"]) == 3
    assert history["step"] == list(range(1, 151)) and len(history["lr"]) == 150
    assert not model.training


def test_training_schedule_peaks_at_lr():
    torch.manual_seed(0)
    model = make_model("mean", vocab_size=3, num_classes=2)
    tokens, labels = tiny_task(1)
    history = train_classifier(model, tokens, labels, steps=12, batch_size=16, lr=1e-3, warmup=4)
    lrs = history["lr"]
    assert lrs[:4] == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3])  # linear warm-up to lr
    assert lrs[8] == pytest.approx(1e-3 * math.sqrt(4 / 9))  # then lr * sqrt(warmup / step)
    # the default cooldown, the last quarter (3 of 12 steps): the same times 3/3, 2/3, 1/3
    assert lrs[9:] == pytest.approx([1e-3 * math.sqrt(4 / s) * (12 - s + 1) / 3 for s in (10, 11, 12)])
    torch.manual_seed(0)
    plain = train_classifier(make_model("mean", vocab_size=3, num_classes=2), tokens, labels, steps=12,
                             batch_size=16, lr=1e-3, warmup=4, cooldown=0.0)["lr"]
    assert plain[4:] == pytest.approx([1e-3 * math.sqrt(4 / s) for s in range(5, 13)])  # no cooldown


def test_training_is_seeded_and_restores_threads():
    tokens, labels = tiny_task(2)
    threads = torch.get_num_threads()
    runs = []
    for seed in (0, 0, 1):
        model = make_model("cls", vocab_size=3, num_classes=2, dropout=0.1)
        runs.append(train_classifier(model, tokens, labels, steps=5, batch_size=16, seed=seed)["loss"])
    assert runs[0] == runs[1] and runs[0] != runs[2]
    assert torch.get_num_threads() == threads


def test_training_bad_arguments():
    model = make_model("cls", vocab_size=3, num_classes=2)
    tokens, labels = tiny_task(0)
    with pytest.raises(ValueError, match="steps must be a positive int"):
        train_classifier(model, tokens, labels, steps=0)
    with pytest.raises(ValueError, match="batch_size must be at most the number of examples"):
        train_classifier(model, tokens, labels, batch_size=5000)
    with pytest.raises(ValueError, match="lr must be a number > 0"):
        train_classifier(model, tokens, labels, lr=0.0)
    with pytest.raises(ValueError, match="clip must be > 0 or None"):
        train_classifier(model, tokens, labels, clip=-1.0)
    with pytest.raises(ValueError, match=r"inputs must have shape \(M, S\) of token ids and labels \(M,\)"):
        train_classifier(model, tokens, labels[:-1])
    with pytest.raises(TypeError, match="inputs must hold integer token ids when pad_id is set"):
        train_classifier(model, tokens.float(), labels)
    with pytest.raises(TypeError, match="inputs must hold integer token ids"):
        train_classifier(model, tokens.bool(), labels, pad_id=None)
    with pytest.raises(ValueError, match=r"inputs must have shape \(M, \.\.\.\) and labels \(M,\)"):
        train_classifier(model, tokens.float(), labels[:-1], pad_id=None)


def test_training_float_inputs():
    """With pad_id=None, inputs may be floats of any shape (images): a linear model learns a sign."""
    torch.manual_seed(0)
    images = torch.randn(256, 1, 2, 2)  # (M, C, H, W)
    labels = (images.sum(dim=(1, 2, 3)) > 0).long()
    model = nn.Sequential(nn.Flatten(), nn.Linear(4, 2))
    nn.init.zeros_(model[1].weight), nn.init.zeros_(model[1].bias)  # every logit 0: always class 0
    before = accuracy(model, images, labels)
    assert before == (labels == 0).float().mean().item()
    train_classifier(model, images, labels, steps=100, batch_size=32, lr=1e-2, warmup=10, pad_id=None)
    after = accuracy(model, images, labels)
    assert after > 0.95 and after > before + 0.2


def test_batches_are_cut_to_their_longest_row():
    """Training on tokens with many extra padding columns gives the same run (they are cut off)."""
    tokens, labels = tiny_task(0)
    wide = torch.cat([tokens, torch.zeros(len(tokens), 20, dtype=torch.long)], dim=1)
    losses = []
    for t in (tokens, wide):
        model = make_model("mean", vocab_size=3, num_classes=2)
        losses.append(train_classifier(model, t, labels, steps=5, batch_size=32)["loss"])
    assert losses[0] == losses[1]


def test_labels_outside_the_models_classes_are_refused_by_name_before_a_step():
    model = make_model("cls", vocab_size=3, num_classes=2)
    tokens, labels = tiny_task(0)
    before = [p.detach().clone() for p in model.parameters()]
    for bad, message in ((5, "labels must be class ids below the model's 2 classes, got 5"),
                         (-1, "labels must be class ids >= 0, got -1")):
        with pytest.raises(ValueError, match=message):
            train_classifier(model, tokens, labels.clone().index_fill_(0, torch.tensor([3]), bad), steps=2, batch_size=8)
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), before))


def test_with_few_examples_the_other_checks_come_before_the_batch_size():
    model = make_model("cls", vocab_size=3, num_classes=2)
    tokens, labels = tiny_task(0)
    with pytest.raises(ValueError, match="lr must be a number > 0"):
        train_classifier(model, tokens[:10], labels[:10], lr=-1.0)  # the default batch_size, 128, is > 10 too
    wrong = labels[:10].clone().index_fill_(0, torch.tensor([3]), 7)  # the user trial's case: a label out of range
    with pytest.raises(ValueError, match="labels must be class ids below the model's 2 classes, got 7"):
        train_classifier(model, tokens[:10], wrong)
    with pytest.raises(ValueError, match="batch_size must be at most the number of examples, 10, got 128"):
        train_classifier(model, tokens[:10], labels[:10])
