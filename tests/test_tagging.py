"""Tests for transformer/tasks/tagging.py (chapters/tagging.md)."""

import math

import pytest
import torch
import torch.nn.functional as F

from transformer.tasks.multi30k import load_multi30k
from transformer.tasks.subwords import train_tokenizer
from transformer.tasks.masked_lm import IGNORE_INDEX
from transformer.training.loop import Callback
from transformer.tasks.tagging import (MARKS, TAG_LABELS, TokenClassifier, decide_tags, facet_scores,
    per_label_scores, restore_text, tag_targets, tagging_loss, tagging_tensors, text_labels, train_tagger, word_label)


def make_tagger(vocab_size=7, num_classes=3, seed=0, **kwargs):
    torch.manual_seed(seed)
    return TokenClassifier(vocab_size, num_classes, d_model=16, num_heads=2, d_ff=32, num_layers=2, dropout=0.0,
                           max_len=32, **kwargs).eval()


# Labels from the text.

@pytest.mark.parametrize("word, expected", [
    ("terrier", ("terrier", 0)), ("street.", ("street", 2)), ("snow,", ("snow", 1)), ("A", ("a", 3)),
    ("Boston,", ("boston", 4)), ("Street.", ("street", 5)), ("2.00", ("2.00", 0)), ("t-shirt", ("t-shirt", 0)),
    (".", (".", 0)), ("St.,", ("st.", 4)), ("man's", ("man's", 0)), ("USA", ("usa", 3)),
])
def test_word_label_by_hand(word, expected):
    assert word_label(word) == expected


def exactly_restorable(line):
    """An independent statement of when the labels can give ``line`` back: single spaces between
    words, and each word without its final comma or full stop lower case or a capital then lower case."""
    if line != " ".join(line.split()):
        return False
    for word in line.split():
        bare = word[:-1] if len(word) > 1 and word[-1] in ",." else word
        if bare != bare.lower() and not (bare[0].isupper() and bare[1:] == bare[1:].lower()):
            return False
    return True


def test_labels_give_the_text_back_on_every_multi30k_caption_that_they_can():
    lines = [line for split in ("train", "val", "test") for line in load_multi30k(split)[1]]
    back = [restore_text(*text_labels(line)) == line for line in lines]
    assert back == [exactly_restorable(line) for line in lines]
    assert sum(back) / len(lines) > 0.98
    for line in lines[:2000]:  # what the model reads has no capital
        words, labels = text_labels(line)
        assert all(word == word.lower() for word in words) and len(words) == len(labels) == len(line.split())


def test_restore_writes_each_label():
    words = ["a", "dog", "runs", "fast", "in", "paris"]
    assert restore_text(words, [3, 0, 1, 0, 4, 5]) == "A dog runs, fast In, Paris."
    assert [TAG_LABELS[label] for label in (0, 1, 2, 3, 4, 5)] == [
        "lower none", "lower comma", "lower period", "Capitalised none", "Capitalised comma", "Capitalised period"]
    assert MARKS == ("", ",", ".")


@pytest.mark.parametrize("call, error, match", [
    (lambda: word_label(""), ValueError, "non-empty str"),
    (lambda: word_label("a b"), ValueError, "without spaces"),
    (lambda: text_labels(3), TypeError, "line must be a str"),
    (lambda: restore_text(["a"], [0, 1]), ValueError, "same length"),
    (lambda: restore_text(["a"], [6]), ValueError, r"labels must lie in \[0, 6\)"),
])
def test_bad_labels_are_refused(call, error, match):
    with pytest.raises(error, match=match):
        call()


# Words and pieces.

@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(["a dog runs in the park", "a cat sleeps", "dogs and cats"] * 5, vocab_size=40)


def test_a_word_label_goes_to_its_first_piece_only(tokenizer):
    words, labels = ["a", "dog", "sleeps", "xylophone"], [3, 0, 1, 2]
    ids, targets = tag_targets(tokenizer, words, labels)
    tokens = [tokenizer.id_to_token(i) for i in ids]
    assert len(ids) == len(targets) > len(words)  # some word is cut into several pieces
    starts = [i for i, token in enumerate(tokens) if token.startswith("\u2581")]  # each word's first piece
    assert [targets[i] for i in starts] == labels
    assert all(target == IGNORE_INDEX for i, target in enumerate(targets) if i not in starts)


def test_tagging_tensors_pad_ids_and_targets(tokenizer):
    data = [(["a", "dog"], [3, 2]), (["a", "cat", "sleeps", "in", "the", "park"], [3, 0, 0, 0, 0, 2])]
    tokens, targets = tagging_tensors(tokenizer, data)
    assert tokens.shape == targets.shape and tokens.dtype == targets.dtype == torch.long
    for row, (words, labels) in enumerate(data):
        ids, row_targets = tag_targets(tokenizer, words, labels)
        assert tokens[row, :len(ids)].tolist() == ids and (tokens[row, len(ids):] == 0).all()
        assert targets[row, :len(ids)].tolist() == row_targets and (targets[row, len(ids):] == IGNORE_INDEX).all()
        assert targets[row][targets[row] != IGNORE_INDEX].tolist() == labels


# The tagger.

def test_tagger_shapes_and_head_at_every_position():
    model = make_tagger()
    tokens = torch.tensor([[1, 2, 3, 4, 5], [6, 5, 0, 0, 0]])
    logits = model(tokens)
    assert logits.shape == (2, 5, 3) and model.cls_token is None
    x, mask = model.encoder_inputs(tokens)
    assert x.shape == (2, 5, 16) and mask.shape == (2, 1, 1, 5)
    assert mask[:, 0, 0].tolist() == (tokens == 0).tolist()  # True at padding
    with torch.no_grad():
        h = model.encoder(x, mask=mask)
    torch.testing.assert_close(logits, h @ model.head.weight.T + model.head.bias)


def test_padding_does_not_change_the_real_positions():
    model = make_tagger()
    tokens = torch.tensor([[1, 2, 3, 0], [4, 0, 0, 0]])
    longer = torch.cat([tokens, torch.zeros(2, 6, dtype=torch.long)], dim=1)
    with torch.no_grad():
        torch.testing.assert_close(model(longer)[:, :4], model(tokens))
        torch.testing.assert_close(model(tokens[1:, :1]), model(tokens)[1:, :1])


def test_every_position_sees_the_last_token():
    model = make_tagger()
    tokens = torch.tensor([[1, 2, 3, 4]])
    changed = torch.tensor([[1, 2, 3, 5]])
    with torch.no_grad():
        assert not torch.allclose(model(tokens)[0, 0], model(changed)[0, 0])


def test_tagger_refuses_pooling_and_bad_tokens():
    with pytest.raises(TypeError, match="no pooling"):
        TokenClassifier(5, 3, pooling="cls")
    with pytest.raises(ValueError, match="vocab_size"):
        make_tagger()(torch.full((1, 3), 7))


def test_tagging_loss_is_the_mean_cross_entropy_of_the_labelled_positions():
    model = make_tagger()
    tokens = torch.tensor([[1, 2, 3, 4], [5, 6, 0, 0]])
    targets = torch.tensor([[2, IGNORE_INDEX, 0, 1], [1, IGNORE_INDEX, IGNORE_INDEX, IGNORE_INDEX]])
    loss, metrics = tagging_loss(model, (tokens, targets))
    logits = model(tokens)
    places = [(0, 0), (0, 2), (0, 3), (1, 0)]
    by_hand = sum(-F.log_softmax(logits[b, t], dim=-1)[targets[b, t]] for b, t in places) / len(places)
    torch.testing.assert_close(loss, by_hand)
    right = sum(int(logits[b, t].argmax() == targets[b, t]) for b, t in places) / len(places)
    assert math.isclose(metrics["accuracy"].item(), right)


@pytest.mark.slow  # trains a tagger
def test_train_tagger_learns_a_rule_that_needs_the_next_token():
    # label 1 where the next token is 1, else 0; padding and the last position carry no label
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(1, 4, (512, 8), generator=generator)
    targets = torch.full_like(tokens, IGNORE_INDEX)
    targets[:, :-1] = (tokens[:, 1:] == 1).long()
    model = make_tagger(vocab_size=4, num_classes=2)
    history = train_tagger(model, tokens, targets, steps=150, batch_size=64, lr=3e-3, warmup=20, seed=0)
    assert sum(history["accuracy"][-10:]) / 10 > 0.95 and not model.training
    again = make_tagger(vocab_size=4, num_classes=2)
    assert train_tagger(again, tokens, targets, steps=150, batch_size=64, lr=3e-3, warmup=20, seed=0)["loss"] \
        == history["loss"]  # seeded: the same run
    # a run stopped after 30 of its 150 steps is the start of the whole run, rates and all; the callbacks
    # see each of its steps
    seen = []

    class Steps(Callback):
        def on_step_end(self, step, record):
            seen.append(step)

    start = train_tagger(make_tagger(vocab_size=4, num_classes=2), tokens, targets, steps=150, batch_size=64,
                         lr=3e-3, warmup=20, seed=0, stop=30, callbacks=[Steps()])
    assert seen == list(range(1, 31))
    assert all(start[key] == history[key][:30] for key in ("lr", "loss", "grad_norm"))


def test_train_tagger_refuses_bad_arguments():
    model = make_tagger()
    tokens = torch.ones(4, 3, dtype=torch.long)
    with pytest.raises(ValueError, match="targets the same shape"):
        train_tagger(model, tokens, torch.zeros(4, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="batch_size must be at most"):
        train_tagger(model, tokens, torch.zeros(4, 3, dtype=torch.long), batch_size=5)
    with pytest.raises(ValueError, match="stop must be at most steps, 10, got 11"):
        train_tagger(model, tokens, torch.zeros(4, 3, dtype=torch.long), steps=10, batch_size=2, stop=11)
    with pytest.raises(ValueError, match="stop"):
        train_tagger(model, tokens, torch.zeros(4, 3, dtype=torch.long), steps=10, batch_size=2, stop=0)


# Scores.

def test_per_label_scores_by_hand():
    gold = [0, 0, 0, 1, 1, 2, 2, 2, 2, 0]
    guess = [0, 1, 0, 1, 0, 1, 0, 0, 0, 0]
    scores = per_label_scores(gold, guess, ["a", "b", "c"])
    # a: predicted 7 times, 3 right; 4 true.  b: predicted 2 times, 1 right; 2 true.  c: never predicted.
    assert scores["a"] == {"precision": 3 / 7, "recall": 3 / 4, "f1": 2 * (3 / 7) * (3 / 4) / (3 / 7 + 3 / 4),
                           "support": 4}
    assert scores["b"] == {"precision": 1 / 3, "recall": 1 / 2, "f1": 0.4, "support": 2}
    assert scores["c"] == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 4}
    with pytest.raises(ValueError, match="same length"):
        per_label_scores([0], [], ["a"])


def test_facet_scores_split_case_and_mark():
    gold = [3, 0, 1, 2]  # Capitalised none, lower none, lower comma, lower period
    guess = [4, 0, 0, 2]  # Capitalised comma, lower none, lower none, lower period
    scores = facet_scores(gold, guess)
    assert scores["Capitalised"]["f1"] == 1.0 and scores["lower"]["f1"] == 1.0
    assert scores["comma"] == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 1}
    assert scores["period"]["f1"] == 1.0 and scores["none"]["precision"] == 0.5


def test_decide_tags_puts_a_comma_where_its_probability_reaches_the_bar():
    probabilities = torch.tensor([[0.6, 0.1, 0.0, 0.0, 0.3, 0.0],  # comma 0.4 in all, Capitalised 0.3
                                  [0.05, 0.05, 0.0, 0.8, 0.1, 0.0],  # comma 0.15, Capitalised
                                  [0.9, 0.05, 0.05, 0.0, 0.0, 0.0]])  # comma 0.05
    logits = probabilities.clamp(min=1e-9).log()
    assert decide_tags(logits).tolist() == [0, 3, 0]
    assert decide_tags(logits, comma_at=0.35).tolist() == [1, 3, 0]
    assert decide_tags(logits, comma_at=0.1).tolist() == [1, 4, 0]
