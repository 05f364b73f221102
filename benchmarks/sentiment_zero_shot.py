"""SmolLM2-135M-Instruct asked, untrained, whether a movie-review sentence is positive or negative
(issue 46, item 1): the zero-shot row of the sentiment chapter (chapters/sentiment.md).

Every validation and test sentence of the chapter's split (``split_reviews``) goes into one chat
prompt, SmolLM2's chat format with its default system message (``chat_prompt``), whose user turn is
``PROMPT`` with the sentence in place of ``{review}``. The model is not asked to write anything: the
score of a sentence is read off the distribution of the answer's first token,

    score = log p("positive") - log p("negative"),

the two words being single tokens of SmolLM2's vocabulary, lower case and without a leading space,
as the answer's first token follows ``<|im_start|>assistant\\n`` (both are the model's two likeliest
first tokens on the sentences tried). Both log-probabilities share the softmax's normaliser, so the
score is the difference of the two logits. A sentence is called positive when its score is above a
threshold: 0 (the likelier word wins) or the threshold that does best on the validation sentences.

The prompt was picked among two wordings (the question before the sentence, or after it) by the
accuracy on 170 validation sentences; the test sentences played no part. Every prompt begins with
the same tokens, system message and question, up to the line break before the sentence: the
model reads them once, and each batch starts from a copy of their keys and values
(``prefix_cache``), so a sentence costs only its own tokens and the end of the turn. Sentences of one
length in tokens go in batches together (no padding needed).

    nice .venv/bin/python -m benchmarks.sentiment_zero_shot      # about 5 minutes of one core

The scores go to ``benchmarks/sentiment_zero_shot_results.json`` (``--out``), one per sentence by
split and id in the review file, with the command, the machine, the date, the CPU seconds, the
prompt and the accuracies; never the sentences themselves (third-party text, fetched by ``make
setup``, not committed). The chapter reads that file; tests/test_sentiment_zero_shot.py checks that
it is complete and recomputes its first test scores, with this model and with transformers'.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.machine import cpu_name

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "sentiment_zero_shot_results.json"
#: the user's turn; the sentence takes the place of ``{review}``, on a line of its own
PROMPT = (
    "Is the following movie review sentence positive or negative? "
    "Answer with one word: positive or negative.\n{review}"
)
#: the answers' words, by label (0 negative, 1 positive, as ``SENTIMENTS``)
ANSWERS = ("negative", "positive")
SPLITS = ("valid", "test")
DIGITS = 5  # the scores' decimals in the results file, far below the 1e-3 the tests allow


def prompt_text(review: str) -> str:
    """The whole chat prompt of one sentence, up to where the assistant's answer starts."""
    from transformer.interop.gguf import chat_prompt

    return chat_prompt([{"role": "user", "content": PROMPT.format(review=review)}])


def prefix_text() -> str:
    """The text every prompt starts with: the system turn and the question, up to the
    sentence."""
    return prompt_text("\0").split("\0")[0]


def answer_ids(tokenizer: Any) -> tuple[int, int]:
    """The token ids of ``ANSWERS``, (negative, positive); ValueError unless each word
    is one token."""
    ids = [tokenizer.encode(word).ids for word in ANSWERS]
    if any(len(word) != 1 for word in ids):
        raise ValueError(f"each answer must be one token, got {dict(zip(ANSWERS, ids))}")
    return ids[0][0], ids[1][0]


def prefix_cache(model: Any, prefix: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The keys and values of ``prefix`` at every layer, ``(1, H_kv, P, d_k)`` each:
    the model reads the shared part of the prompts once."""
    cache = model.new_cache()
    with torch.inference_mode():
        model(torch.tensor([prefix]), cache=cache)  # (1, P) -> logits, unread
    return [(layer.self_attn.key, layer.self_attn.value) for layer in cache.layers]


def score_reviews(model: Any, tokenizer: Any, reviews: list[str], batch_size: int = 32) -> list[float]:
    """log p("positive") - log p("negative") at the first answer token of each review's
    prompt, in the order of ``reviews``.

    The shared prefix is read once (``prefix_cache``); then the rest of the prompts, in
    batches of prompts of one length, each batch after a copy of the prefix's keys and
    values."""
    negative, positive = answer_ids(tokenizer)
    prefix = tokenizer.encode(prefix_text()).ids
    rows = [tokenizer.encode(prompt_text(review)).ids for review in reviews]
    for review, row in zip(reviews, rows):
        if row[: len(prefix)] != prefix:  # a sentence that merges with the line break
            raise ValueError(f"the prompt of {review!r} does not start with the prefix's tokens")
    held = prefix_cache(model, prefix)
    by_length: dict[int, list[int]] = {}
    for i, row in enumerate(rows):
        by_length.setdefault(len(row), []).append(i)
    scores = [0.0] * len(rows)
    with torch.inference_mode():
        for length in sorted(by_length):
            indices = by_length[length]
            for start in range(0, len(indices), batch_size):
                batch = indices[start : start + batch_size]
                cache = model.new_cache()
                for layer, (key, value) in zip(cache.layers, held, strict=True):
                    # (1, H_kv, P, d_k) -> (B, H_kv, P, d_k), copied into the cache's buffer
                    layer.self_attn.update(key.expand(len(batch), -1, -1, -1),
                                           value.expand(len(batch), -1, -1, -1))
                rest = torch.tensor([rows[i][len(prefix):] for i in batch])  # (B, length - P)
                logits = model(rest, cache=cache)[:, -1]  # (B, T, V) -> (B, V)
                for i, row in zip(batch, logits):
                    scores[i] = float(row[positive] - row[negative])
    return scores


def tuned_threshold(scores: list[float], labels: list[int]) -> float:
    """The threshold t that makes "positive when score > t" most accurate on (``scores``,
    ``labels``): the midpoint between two neighbouring scores (or below them all), the
    lowest of the best."""
    values = sorted(set(scores))
    candidates = [values[0] - 1.0] + [(a + b) / 2 for a, b in zip(values, values[1:])]
    return max(candidates, key=lambda t: (correct(scores, labels, t), -t))


def correct(scores: list[float], labels: list[int], threshold: float) -> int:
    """How many of ``labels`` the rule "positive when score > threshold" gets right."""
    return sum((score > threshold) == bool(label) for score, label in zip(scores, labels, strict=True))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch-size", type=int, default=32, help="prompts of one length read together")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.batch_size < 1:
        print(f"error: --batch-size must be >= 1, got {args.batch_size}", file=sys.stderr)
        raise SystemExit(2)
    from transformer.interop.gguf import SMOLLM2_FILE, SMOLLM2_SHA256, load_smollm2
    from transformer.tasks.sentiment import read_reviews, split_reviews

    torch.set_num_threads(1)
    machine = (f"{cpu_name()} ({torch.backends.cpu.get_cpu_capability()}), one thread, torch "
               f"{torch.__version__}")
    print(machine, flush=True)
    tick = time.process_time()
    model, tokenizer = load_smollm2()
    splits = split_reviews(read_reviews())
    scores, labels = {}, {}
    for name in SPLITS:
        # rounded as the file keeps them: the accuracies below are the file's
        scores[name] = [round(score, DIGITS) for score in score_reviews(
            model, tokenizer, [review.text for review in splits[name]], args.batch_size)]
        labels[name] = [review.label for review in splits[name]]
        print(f"{name}: {len(scores[name]):,} sentences scored, {time.process_time() - tick:.0f} s of CPU so far",
              flush=True)
    threshold = tuned_threshold(scores["valid"], labels["valid"])
    accuracy = {}
    for name in SPLITS:
        for rule, t in (("at_zero", 0.0), ("tuned", threshold)):
            right = correct(scores[name], labels[name], t)
            accuracy[f"{name}_{rule}"] = {"correct": right, "total": len(labels[name]),
                                          "accuracy": right / len(labels[name])}
            print(f"{name}, threshold {t:+.3f}: {right / len(labels[name]):.1%}")
    seconds = time.process_time() - tick
    negative, positive = answer_ids(tokenizer)
    args.out.write_text(json.dumps({
        "command": "nice python -m benchmarks.sentiment_zero_shot"
                   + ("" if args.batch_size == 32 else f" --batch-size {args.batch_size}"),
        "machine": machine,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "cpu_seconds": round(seconds, 1),
        "model": {"file": SMOLLM2_FILE, "sha256": SMOLLM2_SHA256},
        "prompt": prompt_text("{review}"),
        "answers": {"negative": negative, "positive": positive},
        "score": 'log p("positive") - log p("negative") at the first answer token',
        "threshold": threshold,
        "accuracy": accuracy,
        "scores": [{"split": name, "id": review.id, "score": score}
                   for name in SPLITS for review, score in zip(splits[name], scores[name], strict=True)],
    }, indent=1) + "\n")
    print(f"{seconds:.0f} s of CPU; tuned threshold {threshold:+.3f}; results in {os.path.relpath(args.out)}")


if __name__ == "__main__":
    main()
