"""The learning curve of chapters/24_pretraining.md: spam-vs-ham test accuracy and spam F1 against the
number of labelled training emails, for (a) a bag-of-words logistic regression, (b) the encoder
trained from scratch, (c) the encoder pre-trained as a masked LM (``models/spam-mlm``) and fine-tuned;
over seeds. Writes ``benchmarks/spam_curve_results.json``, which the chapter reads and
``tests/test_masked_lm.py`` checks.

Usage (from the repository's root):
    python -m benchmarks.spam_curve --sizes 32 128 512 0 --seeds 0 1 2   (0: all training emails)
"""

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import torch

from transformer.tasks.baselines import bag_of_words, fit_logistic_regression, word_vocabulary
from transformer.tasks.classifier import SequenceClassifier, train_classifier
from transformer.tasks.email import read_emails, split_emails
from transformer.tasks.masked_lm import classifier_from_mlm, first_tokens, load_mlm

MODELS = ("bag of words", "encoder from scratch", "pre-trained encoder")


def scores(predicted: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
    """Accuracy, and the F1 of the spam class (label 1)."""
    tp = int(((predicted == 1) & (labels == 1)).sum())
    fp, fn = int(((predicted == 1) & (labels == 0)).sum()), int(((predicted == 0) & (labels == 1)).sum())
    return {"accuracy": (predicted == labels).float().mean().item(),
            "spam_f1": 2 * tp / (2 * tp + fp + fn) if tp else 0.0}


def sample(labels: torch.Tensor, size: int, seed: int) -> torch.Tensor:
    """``size`` indices of training emails, spam in the same share as in all of them (stratified), by ``seed``."""
    generator = torch.Generator().manual_seed(seed)
    spam, ham = (labels == 1).nonzero()[:, 0], (labels == 0).nonzero()[:, 0]
    n_spam = max(1, round(size * len(spam) / len(labels)))
    pick = lambda rows, n: rows[torch.randperm(len(rows), generator=generator)[:n]]  # noqa: E731
    return torch.cat([pick(spam, n_spam), pick(ham, size - n_spam)])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.spam_curve", description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[32, 128, 512, 0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--model", type=Path, default=Path("models/spam-mlm"))
    parser.add_argument("--out", type=Path, default=Path("benchmarks/spam_curve_results.json"))
    args = parser.parse_args(argv)
    start = time.perf_counter()
    splits = split_emails(read_emails())
    mlm, tokenizer = load_mlm(args.model)
    length = mlm.settings["max_len"]
    train_texts, test_texts = [m.text for m in splits["train"]], [m.text for m in splits["test"]]
    train_x, test_x = first_tokens(train_texts, tokenizer, length), first_tokens(test_texts, tokenizer, length)
    train_y = torch.tensor([m.label for m in splits["train"]])
    test_y = torch.tensor([m.label for m in splits["test"]])
    runs = []
    for size in args.sizes:
        for seed in args.seeds:
            rows = sample(train_y, size or len(train_y), seed)
            vocabulary = word_vocabulary([train_texts[i] for i in rows], min_count=1)
            bow = fit_logistic_regression(bag_of_words([train_texts[i] for i in rows], vocabulary), train_y[rows])
            predicted = {MODELS[0]: bow(bag_of_words(test_texts, vocabulary)).argmax(dim=-1)}
            for name in MODELS[1:]:
                torch.manual_seed(seed)
                model = (classifier_from_mlm(mlm) if name == MODELS[2] else
                         SequenceClassifier(mlm.settings["vocab_size"], 2, d_model=mlm.settings["d_model"],
                                            num_heads=mlm.settings["num_heads"], d_ff=mlm.settings["d_ff"],
                                            num_layers=mlm.settings["num_layers"], max_len=length, pooling="mean"))
                train_classifier(model, train_x[rows], train_y[rows], steps=args.steps,
                                 batch_size=min(32, len(rows)), lr=args.lr, warmup=15, seed=seed)
                with torch.no_grad():
                    predicted[name] = model(test_x).argmax(dim=-1)
            for name, guess in predicted.items():
                runs.append({"labels": len(rows), "seed": seed, "model": name, **scores(guess, test_y)})
                print(json.dumps(runs[-1]), flush=True)
    results = {"runs": runs, "test_emails": len(test_y), "train_emails": len(train_y), "steps": args.steps,
               "lr": args.lr, "seconds": round(time.perf_counter() - start, 1),
               "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores (shared), torch {torch.__version__}",
               "command": "python -m benchmarks.spam_curve " + " ".join(sys.argv[1:] if argv is None else argv)}
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
