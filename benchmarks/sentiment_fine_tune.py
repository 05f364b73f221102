"""The sentiment chapter's MiniLM fine-tuned end to end, run once outside the book: the chapter's seed-0
recipe (``fine_tune`` on the same 2,000 training sentences, chosen by the seed as the chapter chooses them,
read as the same WordPiece rows), which takes a minute and a half of one core. Writes
``benchmarks/sentiment_fine_tune_results.json``: the command, machine, date and CPU seconds, the history of
every step, the validation accuracies, and each test sentence's id, predicted label and logit margin
(positive minus negative). No review text: the sentences are third-party data, fetched by ``make setup``.

chapters/sentiment.md reads the file at its seed, repeats the first steps and checks them against it;
tests/test_sentiment.py does the same on the plain path and recomputes the recorded accuracy.

Usage (from the repository's root, on the plain path and one thread, as the committed file was made):
    ATEN_CPU_CAPABILITY=default OMP_NUM_THREADS=1 python -m benchmarks.sentiment_fine_tune
    ... --steps 8 --out /tmp/start.json    (the run's first 8 steps only, without validation or test)
"""

import argparse
import datetime
import json
import os
import platform
import sys
import time
from pathlib import Path

import torch

from benchmarks.machine import cpu_name
from transformer.interop.bert import BertClassifier, load_minilm
from transformer.tasks.fine_tuning import class_scores, fine_tune, wordpieces
from transformer.tasks.sentiment import read_reviews, split_reviews

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "sentiment_fine_tune_results.json"
#: the chapter's number of labelled training sentences
SAMPLE = 2000


def run(seed: int, steps: int | None) -> dict:
    """The chapter's fine-tuning at ``seed`` (``steps``: stop after that many, None: the whole run) and
    what the results file records of it."""
    splits = split_reviews(read_reviews())
    train = splits["train"]
    # as the chapter draws it, from the seed alone
    sample = torch.randperm(len(train), generator=torch.Generator().manual_seed(seed))[:SAMPLE]
    minilm, wordpiece = load_minilm()
    del minilm
    torch.manual_seed(seed)  # the head's initial weights, as in the chapter
    model = BertClassifier(load_minilm()[0], num_classes=2)
    rows = {
        "train": wordpieces(wordpiece, [train[i].text for i in sample]),
        "valid": wordpieces(wordpiece, [review.text for review in splits["valid"]]),
        "test": wordpieces(wordpiece, [review.text for review in splits["test"]]),
    }
    targets = {name: torch.tensor([review.label for review in split]) for name, split in splits.items()}
    tick = time.process_time()
    history = fine_tune(model, rows["train"], targets["train"][sample], valid=(rows["valid"], targets["valid"]),
                        seed=seed, stop=steps)
    record: dict = {"seed": seed, "steps": len(history["loss"]), "train_ids": [train[i].id for i in sample]}
    if steps is None:
        logits = class_scores(model, rows["test"])  # (n, 2)
        predicted = logits.argmax(-1)  # (n,)
        margins = logits[:, 1] - logits[:, 0]  # (n,), > 0 where positive is predicted
        correct = int((predicted == targets["test"]).sum())
        record |= {"test_sentences": len(predicted), "test_correct": correct,
                   "test_accuracy": correct / len(predicted),
                   "test_answers": [[review.id, int(label), round(float(margin), 4)]
                                    for review, label, margin in zip(splits["test"], predicted, margins, strict=True)]}
    record["cpu_seconds"] = round(time.process_time() - tick, 1)
    record["history"] = history
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=None, help="stop after this many steps (default: the whole run)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.steps is not None and args.steps < 1:
        print(f"sentiment_fine_tune: --steps must be an int >= 1, got {args.steps}", file=sys.stderr)
        return 2
    torch.set_num_threads(1)  # as the chapter runs
    record = run(args.seed, args.steps)
    about = {
        "command": "ATEN_CPU_CAPABILITY=default OMP_NUM_THREADS=1 python -m benchmarks.sentiment_fine_tune"
        + ("" if args.steps is None else f" --steps {args.steps}"),
        "machine": f"{cpu_name()}, {platform.machine()}, {os.cpu_count()} cores, shared",
        "date": datetime.date.today().isoformat(),
        "torch": torch.__version__,
        "capability": torch.backends.cpu.get_cpu_capability(),
        "threads": torch.get_num_threads(),
    }
    # one key a line, each value on one line
    args.out.write_text("{\n" + ",\n".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in (about | record).items()) + "\n}\n")
    print(f"{record['steps']} steps in {record['cpu_seconds']:.0f} s of CPU"
          + (f"; test accuracy {record['test_accuracy']:.1%}" if "test_accuracy" in record else "")
          + f"; wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
