"""Tests for transformer/tasks/sentiment.py, transformer/tasks/intervals.py and
transformer/tasks/fine_tuning.py (chapters/sentiment.md): the review file is read only when it is the
pinned one, the split is fixed, disjoint and near 80/10/10, the bootstrap interval agrees with the closed
form of a proportion's standard error, and the committed fine-tuning of MiniLM
(benchmarks/sentiment_fine_tune_results.json) is the chapter's recipe and gives its recorded accuracy.

The real file is Pang and Lee's sentences in Hutto and Gilbert's copy, which ``make setup`` fetches
into data/reviews/ (tools/fetch_reviews.py): without it the tests that read it fail, saying so,
rather than skip."""

import hashlib
import io
import json
import math
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import torch

from committed_runs import ROOT, assert_same_start
from tools import fetch_reviews
from transformer.tasks.intervals import bootstrap_interval
from transformer.tasks.sentiment import (REVIEWS_SHA256, Review, read_reviews, reviews_file, split_reviews,
                                          write_review_jsonl)

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def reviews():
    """The 10,605 reviews; a failure if they are not fetched."""
    try:
        path = reviews_file()
    except FileNotFoundError as err:
        pytest.fail(f"{err}. The tests of the real reviews need them: run `make setup`.")
    return read_reviews(path)


def test_the_file_has_the_pinned_checksum_and_the_documented_counts(reviews):
    assert hashlib.sha256(reviews_file().read_bytes()).hexdigest() == REVIEWS_SHA256
    assert [review.id for review in reviews] == list(range(1, 10_606))
    positive = [review for review in reviews if review.label == 1]
    assert (len(positive), len(reviews) - len(positive)) == (5_331, 5_274)  # data/README.md
    assert all(-4 <= review.rating <= 4 and review.text.strip() == review.text != "" for review in reviews)
    assert not any("\r" in review.text or "\t" in review.text for review in reviews)


def test_a_tampered_file_is_refused(tmp_path, reviews):
    raw = reviews_file().read_bytes()
    changed = tmp_path / "reviews.txt"
    changed.write_bytes(raw.replace(b"\t2.26666666667\t", b"\t-2.26666666667\t", 1))  # one rating's sign
    assert changed.read_bytes() != raw
    with pytest.raises(ValueError, match=f"SHA-256 is {hashlib.sha256(changed.read_bytes()).hexdigest()}"):
        read_reviews(changed)
    with pytest.raises(ValueError, match=REVIEWS_SHA256):
        read_reviews(changed)


def test_a_missing_file_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="make setup"):
        read_reviews(tmp_path / "nothing.txt")


def test_the_split_is_disjoint_complete_and_near_80_10_10(reviews):
    splits = split_reviews(reviews)
    sizes = {name: len(split) for name, split in splits.items()}
    assert sizes == {"train": 8_508, "valid": 1_017, "test": 1_078}  # fixed by the texts alone
    ids = [{review.id for review in split} for split in splits.values()]
    texts = [{review.text.lower() for review in split} for split in splits.values()]
    for a in range(3):
        for b in range(a + 1, 3):
            assert not ids[a] & ids[b] and not texts[a] & texts[b]
    kept = sum(sizes.values())
    assert 10_555 < kept < 10_605  # only duplicates leave
    assert all(abs(sizes[name] / kept - 0.1) < 0.01 for name in ("valid", "test"))
    for name, digits in (("test", {0}), ("valid", {1}), ("train", set(range(2, 10)))):
        assert [review.id for review in splits[name]] == sorted(review.id for review in splits[name])
        assert {review.key % 10 for review in splits[name]} == digits


def test_the_split_depends_on_each_text_alone():
    made_up = [Review(i, 0.0, f"sentence number {i} with some words of its own {i * 7}") for i in range(1, 301)]
    whole, half = split_reviews(made_up), split_reviews(made_up[::2])
    for name in whole:
        assert {r.id for r in half[name]} == {r.id for r in whole[name] if r.id % 2 == 1}


def test_duplicates_are_dropped_keeping_the_first():
    made_up = [Review(1, 1.0, "A fine, warm film."), Review(2, 1.0, "a fine warm film"),
               Review(6000, -1.0, "A dull and tired film.")]
    kept = [review.id for split in split_reviews(made_up).values() for review in split]
    assert sorted(kept) == [1, 6000]
    assert [review.label for review in made_up] == [1, 1, 0]


@pytest.mark.parametrize("bad, message", [({"valid": 0}, "valid must be"), ({"test": 1.5}, "test must be"),
                                          ({"valid": 5, "test": 5}, "below 10")])
def test_split_refuses_bad_fractions(bad, message):
    with pytest.raises(ValueError, match=message):
        split_reviews([Review(1, 0.0, "a")], **bad)


@pytest.mark.parametrize("p", [0.5, 0.8, 0.95])
def test_bootstrap_agrees_with_the_normal_approximation_on_a_large_sample(p):
    n = 20_000
    correct = torch.arange(n) < round(p * n)
    low, high = bootstrap_interval(correct, samples=2000)
    half = 1.96 * math.sqrt(p * (1 - p) / n)  # the closed form: p +- z sqrt(p (1 - p) / n)
    assert abs(low - (p - half)) < 0.1 * half and abs(high - (p + half)) < 0.1 * half


def test_bootstrap_level_seed_and_order():
    correct = torch.arange(1000) % 4 != 0  # 75 % right
    narrow, wide = bootstrap_interval(correct, level=0.5), bootstrap_interval(correct, level=0.99)
    assert wide[0] < narrow[0] < 0.75 < narrow[1] < wide[1]
    assert bootstrap_interval(correct, seed=3) == bootstrap_interval(correct, seed=3)
    assert bootstrap_interval(correct) == bootstrap_interval(correct.int())  # bools or 0/1 alike
    assert bootstrap_interval(torch.ones(50, dtype=torch.bool)) == (1.0, 1.0)


@pytest.mark.parametrize("args, error, message", [
    ((torch.tensor([0.5, 1.0]),), ValueError, "0/1"), ((torch.ones(2, 2),), ValueError, "1-D"),
    ((torch.tensor([], dtype=torch.bool),), ValueError, "non-empty"), (([1, 0],), TypeError, "correct"),
    ((torch.ones(3), 1.0), ValueError, "level"), ((torch.ones(3), 0.95, 0), ValueError, "samples")])
def test_bootstrap_refuses_bad_input(args, error, message):
    with pytest.raises(error, match=message):
        bootstrap_interval(*args)


def test_the_fetch_tool_pins_the_archives_and_one_member():
    assert fetch_reviews.SDIST_SHA256 == "5d7c06e027fc8b99238edb0d53d970cf97066ef97654009890b83703849632f9"
    assert fetch_reviews.ARCHIVE_SHA256 == "d5bb07d87474b3eb8d30b4deccbc23f19d742a6c5718fbacc65485b70b95c5fa"
    assert fetch_reviews.MEMBER == "hutto_ICWSM_2014/movieReviewSnippets_GroundTruth.txt"


def test_the_fetch_tool_takes_one_member_by_name_and_refuses_a_wrong_checksum():
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for name, data in (("corpus/wanted.txt", b"kept"), ("corpus/held_out.txt", b"never read")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    buffer.seek(0)
    with tarfile.open(fileobj=buffer) as archive:
        assert fetch_reviews._member(archive, "corpus/wanted.txt") == b"kept"
        with pytest.raises(SystemExit, match="no corpus/missing.txt"):
            fetch_reviews._member(archive, "corpus/missing.txt")
    assert fetch_reviews._checked("x", b"kept", hashlib.sha256(b"kept").hexdigest()) == b"kept"
    with pytest.raises(SystemExit, match="x has SHA-256 .*nothing written"):
        fetch_reviews._checked("x", b"kept", "0" * 64)


def test_no_code_of_the_book_names_another_member_of_the_archive():
    root = Path(__file__).resolve().parent.parent
    files = [path for folder in ("transformer", "tools", "tests", "chapters", "benchmarks")
             for path in (root / folder).rglob("*") if path.suffix in (".py", ".md")]
    assert len(files) > 100
    for path in files:
        for match in re.finditer("hutto_ICWSM_2014" + r"/(\S*)", path.read_text(encoding="utf-8")):
            assert match.group(1).startswith("movieReviewSnippets_GroundTruth.txt"), (path, match.group(0))


def test_the_review_files_hold_each_split_in_order_with_word_labels_and_ids(tmp_path):
    reviews = [Review(1, 2.5, "Warm and funny."), Review(9000, -3.0, 'Dull, "clever" and long.')]
    paths = write_review_jsonl({"train": reviews, "test": reviews[::-1]}, tmp_path / "out")
    assert sorted(paths) == ["test", "train"]
    rows = [json.loads(line) for line in paths["test"].read_text(encoding="utf-8").splitlines()]
    assert rows == [{"text": 'Dull, "clever" and long.', "label": "negative", "id": 9000},
                    {"text": "Warm and funny.", "label": "positive", "id": 1}]


@pytest.mark.slow  # the command labels the 1,078 test sentences
def test_the_committed_sentiment_classifier_reproduces_its_figures(reviews, tmp_path, capsys):
    from transformer.cli.classify import main as classify

    folder = Path(__file__).resolve().parents[1] / "models" / "sentiment-classifier"
    recorded = json.loads((folder / "results.json").read_text())
    splits = split_reviews(reviews)
    files = write_review_jsonl(splits, tmp_path)
    assert classify(["--checkpoint", str(folder / "classifier.pt"), "--input", str(files["test"])]) == 0
    answers = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [answer["id"] for answer in answers] == [review.id for review in splits["test"]]
    right = [answer["label"] == ("negative", "positive")[review.label] for answer, review in zip(answers, splits["test"])]
    assert len(right) == recorded["test_sentences"] == 1078
    assert sum(right) == recorded["test_correct"] and recorded["test_accuracy"] == sum(right) / len(right)
    assert recorded["test_accuracy"] > 0.65  # well above a coin (the test set is 50 % positive)


# --- the committed fine-tuning of MiniLM (benchmarks/sentiment_fine_tune.py)

FINE_TUNED = ROOT / "benchmarks" / "sentiment_fine_tune_results.json"


def test_the_committed_answers_give_the_recorded_accuracy(reviews):
    committed = json.loads(FINE_TUNED.read_text())
    test = split_reviews(reviews)["test"]
    answers = committed["test_answers"]  # (id, label, logit margin) per test sentence, in file order
    assert [answer[0] for answer in answers] == [review.id for review in test]
    # the label is the sign of the margin (positive minus negative logit)
    assert all(margin >= 0 if label else margin <= 0 for _, label, margin in answers)
    right = sum(answer[1] == review.label for answer, review in zip(answers, test, strict=True))
    assert committed["test_sentences"] == len(test) == 1078
    assert committed["test_correct"] == right and committed["test_accuracy"] == right / len(test)
    assert 0.70 < committed["test_accuracy"] < 0.815  # above the frozen MiniLM's 74 %, below Kim's CNN
    # one pass over 2,000 sentences in batches of 16, validated halfway and at the end, on the plain path
    history = committed["history"]
    assert committed["steps"] == len(history["loss"]) == 125 and history["valid_step"] == [63, 125]
    assert committed["capability"] == "DEFAULT" and committed["threads"] == 1 and committed["seed"] == 0
    assert len(committed["train_ids"]) == len(set(committed["train_ids"])) == 2000


@pytest.mark.slow  # fine-tunes MiniLM for 8 steps in a process of its own (about 15 s)
def test_the_committed_fine_tuning_is_the_chapters_recipe(tmp_path):
    """The script's first 8 steps on the plain path and one thread, as the committed run was made: the
    same training sentences, the same rates, and losses, accuracies and gradient norms within 1e-3 of
    the committed run's first 8 (the warm-up's rates do not depend on where a run stops)."""
    committed = json.loads(FINE_TUNED.read_text())
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "default", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    out = tmp_path / "start.json"
    done = subprocess.run([sys.executable, "-m", "benchmarks.sentiment_fine_tune", "--steps", "8", "--out", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    start = json.loads(out.read_text())
    assert start["train_ids"] == committed["train_ids"] and start["seed"] == committed["seed"]
    assert start["history"]["valid_step"] == []  # a stopped run is not validated
    per_step = [key for key in start["history"] if not key.startswith("valid_")]
    assert_same_start({key: start["history"][key] for key in per_step},
                      {key: committed["history"][key] for key in per_step}, 8)


def test_the_fine_tuning_script_refuses_no_steps_in_one_line(capsys):
    from benchmarks.sentiment_fine_tune import main  # what `python -m` runs, in this process

    assert main(["--steps", "0"]) == 2
    assert capsys.readouterr().err.strip() == "sentiment_fine_tune: --steps must be an int >= 1, got 0"


@pytest.mark.slow  # MiniLM embeds 200 review sentences twice (a few seconds)
def test_embeddings_in_batches_of_one_length_equal_those_of_mixed_batches(reviews):
    """The chapter embeds in batches of one length in WordPiece tokens, to cut padding: the same
    embeddings, within float rounding, as batches of 128 sorted by characters, as it used to."""
    from transformer.interop.bert import embed_sentences, load_minilm

    minilm, wordpiece = load_minilm()
    sentences = [review.text for review in split_reviews(reviews)["test"][:200]]
    by_characters = sorted(range(len(sentences)), key=lambda i: len(sentences[i]))
    lengths = [sum(e.attention_mask) for e in wordpiece.encode_batch(sentences)]
    by_tokens = sorted(range(len(sentences)), key=lengths.__getitem__)
    embeddings = []
    for order, size in ((by_characters, 128), (by_tokens, 64)):
        out = torch.empty(len(sentences), 384)  # (N, d_model)
        for start in range(0, len(order), size):
            rows = order[start : start + size]
            out[rows] = embed_sentences(minilm, wordpiece, [sentences[i] for i in rows])
        embeddings.append(out)
    torch.testing.assert_close(embeddings[1], embeddings[0], atol=1e-5, rtol=0)


class _Sums(torch.nn.Module):
    """A stand-in classifier: the scores of a row are (sum of its ids, minus it), padding adding 0."""

    def forward(self, input_ids):
        total = input_ids.sum(dim=-1).float()  # (B,)
        return torch.stack([total, -total], dim=-1)  # (B, 2)


def test_class_scores_come_back_in_the_order_of_the_rows():
    from transformer.tasks.fine_tuning import by_length, class_scores

    rows = [[1] * (n % 7 + 1) + [n] for n in range(300)]  # of lengths 2 to 8, in no order
    batches = by_length(rows, 128)
    assert sorted(i for batch in batches for i in batch) == list(range(300))
    assert all(len(rows[a]) <= len(rows[b]) for a, b in zip(sum(batches, []), sum(batches, [])[1:]))
    expected = torch.tensor([float(sum(row)) for row in rows])
    torch.testing.assert_close(class_scores(_Sums(), rows), torch.stack([expected, -expected], dim=-1))


@pytest.mark.parametrize("stop, message", [(0, "stop must be"), (3, "stop must be at most the run's 2 steps, got 3")])
def test_fine_tune_refuses_a_stop_outside_the_run(stop, message):
    from transformer.tasks.fine_tuning import fine_tune

    rows, targets = [[101, 7, 102]] * 32, torch.zeros(32, dtype=torch.long)  # one epoch: 2 steps of 16
    with pytest.raises(ValueError, match=message):
        fine_tune(_Sums(), rows, targets, (rows, targets), stop=stop)


class _Bag(torch.nn.Module):
    """A trainable stand-in classifier: the mean of its ids' embeddings, then a linear layer."""

    def __init__(self):
        super().__init__()
        self.embed, self.out = torch.nn.Embedding(200, 4, padding_idx=0), torch.nn.Linear(4, 2)

    def forward(self, input_ids):
        return self.out(self.embed(input_ids).mean(dim=1))  # (B, 2)


@pytest.mark.parametrize("checks, steps", [(2, [1, 2, 3, 4, 5, 6]), (1, [2, 4, 6]), (0.5, [4, 6]), (1 / 3, [6])])
def test_fine_tune_validates_checks_times_a_pass_or_once_in_several(checks, steps):
    """Three passes of 2 steps: ``checks`` a pass puts a validation every 2 / checks steps, and at the last."""
    from transformer.tasks.fine_tuning import fine_tune

    rows, targets = [[101, n, 102] for n in range(1, 33)], torch.arange(32) % 2
    history = fine_tune(_Bag(), rows, targets, (rows[:8], targets[:8]), epochs=3, checks=checks)
    assert len(history["loss"]) == 6 and history["valid_step"] == steps


@pytest.mark.parametrize("checks, error", [(0, ValueError), (-1.5, ValueError), (float("nan"), ValueError),
                                           ("2", TypeError)])
def test_fine_tune_refuses_checks_that_are_not_a_positive_number(checks, error):
    from transformer.tasks.fine_tuning import fine_tune

    rows, targets = [[101, 7, 102]] * 32, torch.zeros(32, dtype=torch.long)
    with pytest.raises(error, match="checks must be"):
        fine_tune(_Sums(), rows, targets, (rows, targets), checks=checks)


def test_keep_best_keeps_the_first_of_the_best_scores_and_restores_it():
    from transformer.tasks.fine_tuning import KeepBest

    model = torch.nn.Linear(2, 1)
    keep = KeepBest(model)
    keep.restore()  # nothing kept: the weights stay
    weights = []
    for score in [0.5, 0.7, 0.7, 0.6]:
        with torch.no_grad():
            model.weight.add_(1.0)
        weights.append(model.weight.detach().clone())
        keep.offer(score)
    keep.restore()
    assert torch.equal(model.weight, weights[1]) and keep.score == 0.7  # the first 0.7, not the tie after it
    with torch.no_grad():
        model.weight.zero_()
    keep.restore()
    assert torch.equal(model.weight, weights[1])  # the copy is the kept one's, not a view of the model
