"""The learning curve of chapters/pretraining.md: spam-vs-ham test accuracy and spam F1 against the
number of labelled training emails, for (a) a bag-of-words logistic regression, (b) the encoder
trained from scratch, (c) the encoder pre-trained as a masked LM (``models/spam-mlm``) and fine-tuned,
(d) all-MiniLM-L6-v2 frozen with a linear head (a logistic regression on its sentence embeddings of
each email's first ``--minilm-tokens`` WordPiece tokens, [CLS] and [SEP] included); over seeds. Writes
``benchmarks/spam_curve_results.json``, which chapters/classify_command.md reads and
``tests/test_masked_lm.py`` checks. With ``--models``, only those models run, and their runs replace
theirs in the file (the others' are kept); each run of the script adds a record of its command, machine
and time.

Usage (from the repository's root):
    python -m benchmarks.spam_curve --sizes 32 128 512 0 --seeds 0 1 2   (0: all training emails)
    python -m benchmarks.spam_curve --sizes 32 128 512 0 --seeds 0 1 2 --models "frozen MiniLM + linear"
"""

import argparse
import json
import multiprocessing
import os
import platform
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch

from transformer.interop.bert import embed_sentences, load_minilm
from transformer.tasks.baselines import bag_of_words, fit_logistic_regression, word_vocabulary
from transformer.tasks.classifier import SequenceClassifier, train_classifier
from transformer.tasks.email import read_emails, split_emails
from transformer.tasks.masked_lm import classifier_from_mlm, first_tokens, load_mlm

MODELS = ("bag of words", "encoder from scratch", "pre-trained encoder", "frozen MiniLM + linear")


def machine() -> str:
    """The CPU's model name and core count, and torch's version: where a record's time was measured."""
    names = [line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
             if line.startswith("model name")] if Path("/proc/cpuinfo").exists() else []
    return (f"{names[0] if names else platform.processor() or platform.machine()}, {os.cpu_count()} CPU cores "
            f"(shared), torch {torch.__version__}")


def _embed(texts: list[str], tokens: int, batch_size: int = 32) -> torch.Tensor:
    """all-MiniLM-L6-v2's sentence embeddings of each text's first ``tokens`` WordPiece tokens, on one thread."""
    torch.set_num_threads(1)
    model, tokenizer = load_minilm()
    tokenizer.enable_truncation(tokens)
    return torch.cat([embed_sentences(model, tokenizer, texts[start:start + batch_size])
                      for start in range(0, len(texts), batch_size)])


def minilm_features(texts: list[str], tokens: int, workers: int = 1) -> torch.Tensor:
    """all-MiniLM-L6-v2's sentence embeddings (mean-pooled, unit length) of each text's first ``tokens``
    WordPiece tokens: (M, 384). The texts, sorted by length (so that a batch holds little padding), are
    dealt round-robin to ``workers`` processes of one thread each."""
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    shares = [order[w::workers] for w in range(workers)]
    if workers == 1:
        parts = [_embed([texts[i] for i in shares[0]], tokens)]
    else:
        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
            parts = list(pool.map(_embed, [[texts[i] for i in share] for share in shares], [tokens] * workers))
    embedded = torch.zeros(len(texts), parts[0].shape[1])
    for share, part in zip(shares, parts):
        embedded[share] = part
    return embedded


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
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--minilm-tokens", type=int, default=64, help="WordPiece tokens MiniLM reads of each email")
    parser.add_argument("--workers", type=int, default=1, help="processes that compute MiniLM's embeddings")
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
    if MODELS[3] in args.models:  # once: MiniLM stays frozen, so each email's embedding is the same in every fit
        embedded = minilm_features(train_texts + test_texts, args.minilm_tokens, args.workers)
        train_e, test_e = embedded[:len(train_texts)], embedded[len(train_texts):]
        print(f"MiniLM embeddings of {len(train_e) + len(test_e)} emails: {time.perf_counter() - start:.0f} s", flush=True)
    runs = []
    for size in args.sizes:
        for seed in args.seeds:
            rows = sample(train_y, size or len(train_y), seed)
            predicted = {}
            if MODELS[0] in args.models:
                vocabulary = word_vocabulary([train_texts[i] for i in rows], min_count=1)
                bow = fit_logistic_regression(bag_of_words([train_texts[i] for i in rows], vocabulary), train_y[rows])
                predicted[MODELS[0]] = bow(bag_of_words(test_texts, vocabulary)).argmax(dim=-1)
            for name in [m for m in MODELS[1:3] if m in args.models]:
                torch.manual_seed(seed)
                model = (classifier_from_mlm(mlm) if name == MODELS[2] else
                         SequenceClassifier(mlm.settings["vocab_size"], 2, d_model=mlm.settings["d_model"],
                                            num_heads=mlm.settings["num_heads"], d_ff=mlm.settings["d_ff"],
                                            num_layers=mlm.settings["num_layers"], max_len=length, pooling="mean"))
                train_classifier(model, train_x[rows], train_y[rows], steps=args.steps,
                                 batch_size=min(32, len(rows)), lr=args.lr, warmup=15, seed=seed)
                with torch.no_grad():
                    predicted[name] = model(test_x).argmax(dim=-1)
            if MODELS[3] in args.models:  # the head: a logistic regression on the fixed embeddings
                head = fit_logistic_regression(train_e[rows], train_y[rows])
                with torch.no_grad():
                    predicted[MODELS[3]] = head(test_e).argmax(dim=-1)
            for name, guess in predicted.items():
                runs.append({"labels": len(rows), "seed": seed, "model": name, **scores(guess, test_y)})
                print(json.dumps(runs[-1]), flush=True)
    command = "python -m benchmarks.spam_curve " + " ".join(
        f'"{a}"' if " " in a else a for a in (sys.argv[1:] if argv is None else argv))
    record = {"models": list(args.models), "command": command, "seconds": round(time.perf_counter() - start, 1),
              "machine": machine()}
    if MODELS[3] in args.models:
        record["minilm_tokens"] = args.minilm_tokens
    results = {"runs": [], "records": []}
    if args.out.exists():  # keep the other models' runs, and the records of the runs that made them
        results = json.loads(args.out.read_text())
        results["runs"] = [run for run in results["runs"] if run["model"] not in args.models]
    results.update(test_emails=len(test_y), train_emails=len(train_y))
    if any(m in args.models for m in MODELS[1:3]):
        results.update(steps=args.steps, lr=args.lr)
    results["runs"] += runs
    results["records"].append(record)
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
