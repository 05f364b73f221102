"""SmolLM2-135M-Instruct asked zero-shot about the movie-review sentences (benchmarks/sentiment_zero_shot.py,
read by chapters/sentiment.md): the committed scores cover every validation and test sentence once, its
accuracies and threshold are what its scores give, and its first test scores are recomputed live by the
book's model and by transformers' ``LlamaForCausalLM`` read from the same GGUF file (an independent
reference: its own tokenizer, chat template and a full pass over each prompt, no shared cache).

The review file and the GGUF file are fetched by ``make setup``; without them the tests that need them
fail, saying so."""

import json
import math

import pytest
import torch

from benchmarks import sentiment_zero_shot as zero_shot
from transformer.tasks.sentiment import SENTIMENTS, read_reviews, reviews_file, split_reviews

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

RECORDED = json.loads(zero_shot.RESULTS.read_text())


@pytest.fixture(scope="module")
def splits():
    """The chapter's split of the reviews; a failure if they are not fetched."""
    try:
        path = reviews_file()
    except FileNotFoundError as err:
        pytest.fail(f"{err}. The tests of the real reviews need them: run `make setup`.")
    return split_reviews(read_reviews(path))


def recorded_scores(split: str) -> list[float]:
    return [row["score"] for row in RECORDED["scores"] if row["split"] == split]


def test_every_validation_and_test_sentence_has_one_score_and_no_text(splits):
    rows = RECORDED["scores"]
    assert all(set(row) == {"split", "id", "score"} for row in rows)  # never the review's text
    assert {row["split"] for row in rows} == {"valid", "test"}
    for name in ("valid", "test"):
        ids = [row["id"] for row in rows if row["split"] == name]
        assert ids == [review.id for review in splits[name]]  # each once, in file order
    assert len(rows) == len(splits["valid"]) + len(splits["test"]) == 1_017 + 1_078
    assert all(isinstance(row["score"], float) and math.isfinite(row["score"]) for row in rows)
    assert len({row["score"] for row in rows}) > 0.9 * len(rows)  # scores, not a constant


def test_the_recorded_accuracies_and_threshold_are_what_the_scores_give(splits):
    labels = {name: [review.label for review in splits[name]] for name in ("valid", "test")}
    scores = {name: recorded_scores(name) for name in ("valid", "test")}
    threshold = RECORDED["threshold"]
    # the threshold is the best on validation: no cut between two sorted scores does better; a
    # cut after the k lowest scores (never between equal ones) calls those negative, the rest positive
    ordered = sorted(zip(scores["valid"], labels["valid"]))
    positives, below = sum(labels["valid"]), [0]  # below[k]: positives among the k lowest
    for _, label in ordered:
        below.append(below[-1] + label)
    best = max(
        (k - below[k]) + (positives - below[k])
        for k in range(len(ordered) + 1)
        if k in (0, len(ordered)) or ordered[k - 1][0] < ordered[k][0]
    )
    right = {
        (name, rule): sum((s > t) == bool(y) for s, y in zip(scores[name], labels[name]))
        for name in ("valid", "test") for rule, t in (("at_zero", 0.0), ("tuned", threshold))
    }
    assert right["valid", "tuned"] == best
    for (name, rule), count in right.items():
        entry = RECORDED["accuracy"][f"{name}_{rule}"]
        assert (entry["correct"], entry["total"]) == (count, len(labels[name]))
        assert entry["accuracy"] == count / len(labels[name])


def test_the_recorded_run_says_how_it_was_made():
    assert RECORDED["command"].startswith("nice python -m benchmarks.sentiment_zero_shot")
    assert "one thread" in RECORDED["machine"] and RECORDED["date"] and RECORDED["cpu_seconds"] > 0
    assert RECORDED["prompt"] == zero_shot.prompt_text("{review}")
    assert RECORDED["prompt"].count("{review}") == 1 and RECORDED["prompt"].endswith("<|im_start|>assistant\n")
    assert zero_shot.ANSWERS == SENTIMENTS  # the answer words by label, as the chapter names the classes


def test_the_tuned_threshold_is_the_lowest_of_the_best_cuts():
    scores, labels = [-2.0, -1.0, 0.5, 1.0, 3.0], [0, 0, 1, 0, 1]
    # cuts: below all (3 right), -1.5 (3), -0.25 (4), 0.75 (3), 2.0 (4)
    assert zero_shot.tuned_threshold(scores, labels) == -0.25
    assert zero_shot.correct(scores, labels, -0.25) == 4
    assert zero_shot.tuned_threshold([1.0, 2.0], [1, 1]) == 0.0  # everything positive: below them all


@pytest.mark.slow  # loads SmolLM2 (a 98 MB file) twice, in the book's classes and in transformers' (about 20 s)
def test_the_first_test_scores_recomputed_by_the_book_and_by_transformers(splits):
    from transformers import AutoTokenizer, LlamaForCausalLM

    from transformer.interop.gguf import load_smollm2, smollm2_path

    # the first test sentences, all from positive reviews, and the last, all negative
    chosen = [*range(4), *range(len(splits["test"]) - 4, len(splits["test"]))]
    reviews = [splits["test"][i].text for i in chosen]
    committed = torch.tensor([recorded_scores("test")[i] for i in chosen])
    model, tokenizer = load_smollm2()
    ours = torch.tensor(zero_shot.score_reviews(model, tokenizer, reviews))
    assert (ours - committed).abs().max() < 1e-3
    path = smollm2_path()
    theirs_tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    reference = LlamaForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()
    answers = theirs_tokenizer.convert_tokens_to_ids(list(zero_shot.ANSWERS))  # negative, positive
    theirs = []
    with torch.no_grad():
        for review in reviews:
            messages = [{"role": "user", "content": zero_shot.PROMPT.format(review=review)}]
            text = theirs_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            ids = theirs_tokenizer(text, return_tensors="pt").input_ids  # (1, T), the whole prompt
            log_p = reference(ids).logits[0, -1].log_softmax(-1)  # (V,)
            theirs.append(float(log_p[answers[1]] - log_p[answers[0]]))
    assert (torch.tensor(theirs) - committed).abs().max() < 1e-3
    # the scores differ from sentence to sentence by far more than that
    assert committed.max() - committed.min() > 0.5
