"""The learning curve of chapters/classify_command.md: spam-vs-ham test accuracy and spam F1 against the
number of labelled training emails, for (a) a bag-of-words logistic regression, (b) the encoder
trained from scratch, (c) the encoder pre-trained as a masked LM (``models/spam-mlm``) and fine-tuned,
(d) all-MiniLM-L6-v2 frozen with a linear head (a logistic regression on its sentence embeddings of
each email's first ``--minilm-tokens`` WordPiece tokens, [CLS] and [SEP] included), and (e) MiniLM
fine-tuned end to end on the same tokens (``fine_tune`` of chapters/sentiment.md: the mean of its
output vectors, dropout and a linear layer, trained as one model); over seeds. (e) costs far more than
the others: about eleven minutes a run on one core of the project's idle 2-core machine, half an hour
beside other work.

Every model gets the same budget and stops early on the validation emails (all of them, whatever the
number of labelled training emails): (b) and (c) train for at most ``--steps`` steps and keep the weights
of their best validation accuracy, measured every ``--eval-every`` steps; (e) sees as many emails,
``--steps`` times 32 to the nearest whole pass, in batches of 16, validated as often
(``--steps`` / ``--eval-every`` times in all, at every size), and keeps its best weights too; (a) and (d),
convex fits, keep the weight decay of their best validation accuracy among ``WEIGHT_DECAYS``. Each run records its
test accuracy with a 95 % bootstrap interval over the test emails, the spam class's F1, what validation
chose, and its prediction for every test email (a string of 0s and 1s, in the test split's order).

Writes ``benchmarks/spam_curve_results.json``, which chapters/classify_command.md reads and
``tests/test_masked_lm.py`` checks. With ``--models`` and ``--sizes``, only those models run at those
sizes, and their runs replace theirs in the file (the others' are kept); each run of the script adds a
record of its command, machine and time, and drops the records whose runs have all been replaced.

Usage (from the repository's root):
    python -m benchmarks.spam_curve --sizes 32 128 512 0 --seeds 0 1 2   (0: all training emails)
    python -m benchmarks.spam_curve --sizes 32 128 512 0 --seeds 0 1 2 --models "frozen MiniLM + linear"
    python -m benchmarks.spam_curve --sizes 32 128 512 0 --seeds 0 1 2 --models "fine-tuned MiniLM"
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

from transformer.interop.bert import BertClassifier, embed_sentences, load_minilm
from transformer.tasks.baselines import bag_of_words, fit_logistic_regression, word_vocabulary
from transformer.tasks.classifier import SequenceClassifier, train_classifier
from transformer.tasks.email import read_emails, split_emails
from transformer.tasks.fine_tuning import class_scores, fine_tune, wordpieces
from transformer.tasks.intervals import bootstrap_interval
from transformer.tasks.masked_lm import classifier_from_mlm, first_tokens, load_mlm

MODELS = ("bag of words", "encoder from scratch", "pre-trained encoder", "frozen MiniLM + linear",
          "fine-tuned MiniLM")
#: the weight decays among which (a) and (d) choose on validation
WEIGHT_DECAYS = (1e-4, 1e-3, 1e-2)


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


def fit_on_validation(train: tuple[torch.Tensor, torch.Tensor], valid: tuple[torch.Tensor, torch.Tensor]
                      ) -> tuple[torch.nn.Linear, float, float]:
    """(a) and (d)'s early stopping: a logistic regression on the features ``train`` (x, y) for each weight
    decay in ``WEIGHT_DECAYS``, and the one with the best accuracy on ``valid`` (ties: the stronger decay).
    Returns the head, its weight decay and its validation accuracy."""
    best = None
    for decay in sorted(WEIGHT_DECAYS, reverse=True):
        head = fit_logistic_regression(*train, weight_decay=decay)
        with torch.no_grad():
            score = (head(valid[0]).argmax(dim=-1) == valid[1]).float().mean().item()
        if best is None or score > best[2]:
            best = (head, decay, score)
    assert best is not None
    return best


def train_on_validation(model: torch.nn.Module, train: tuple[torch.Tensor, torch.Tensor],
                        valid: tuple[torch.Tensor, torch.Tensor], steps: int, eval_every: int, lr: float,
                        seed: int) -> tuple[int, float]:
    """(b) and (c)'s early stopping: train ``model`` for ``steps`` steps, measure its validation accuracy
    every ``eval_every`` steps and at the last, and leave it with the weights of the best (ties: the
    earliest). Returns that step and its validation accuracy."""
    best: dict = {"accuracy": -1.0}

    def keep_best(step: int, optimizer, scheduler, history: dict) -> None:  # the loop's save hook
        if history["valid_step"] and history["valid_step"][-1] == step:
            if history["valid_accuracy"][-1] > best["accuracy"]:
                best.update(step=step, accuracy=history["valid_accuracy"][-1],
                            weights={k: v.detach().clone() for k, v in model.state_dict().items()})

    train_classifier(model, *train, steps=steps, batch_size=min(32, len(train[1])), lr=lr, warmup=15,
                     seed=seed, valid=valid, eval_every=eval_every, save=keep_best, save_every=eval_every)
    model.load_state_dict(best["weights"])
    return best["step"], best["accuracy"]


def fine_tune_minilm(rows: list[list[int]], labels: torch.Tensor, valid: tuple[list[list[int]], torch.Tensor],
                     emails: int, checks: int, seed: int, stop: int | None = None) -> tuple[BertClassifier, dict]:
    """(e): MiniLM with a classifier head fine-tuned on ``rows`` (WordPiece ids) and ``labels`` until it has
    seen about ``emails`` emails (whole epochs, batches of 16), its validation accuracy measured ``checks``
    times in all, the best weights kept. Returns the model and ``fine_tune``'s history; ``stop`` ends the
    run after that many steps (a check of the start of a recorded run)."""
    torch.manual_seed(seed)  # the head's initial weights
    model = BertClassifier(load_minilm()[0], num_classes=2)
    epochs = max(1, round(emails / len(rows)))
    # checks / epochs a pass: the same number of validations at every size (once in several passes when
    # there are few labels); with all the labels, 3 a pass, as the committed runs were made
    history = fine_tune(model, rows, labels, valid, epochs=epochs, batch_size=16, checks=checks / epochs,
                        seed=seed, stop=stop)
    return model, history


def kept(history: dict) -> dict:
    """What validation chose in a run of (e), of how many steps, and every step's loss."""
    best = max(range(len(history["valid_accuracy"])), key=lambda i: (history["valid_accuracy"][i], -i))
    return {"step": history["valid_step"][best], "valid_accuracy": history["valid_accuracy"][best],
            "of_steps": len(history["loss"]), "loss": [float(f"{v:.7g}") for v in history["loss"]]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.spam_curve", description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[32, 128, 512, 0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    parser.add_argument("--steps", type=int, default=150, help="(b) and (c)'s most training steps")
    parser.add_argument("--eval-every", type=int, default=25, help="(b) and (c)'s steps between validations")
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
    texts = {name: [m.text for m in emails] for name, emails in splits.items()}
    x = {name: first_tokens(texts[name], tokenizer, length) for name in splits}
    y = {name: torch.tensor([m.label for m in emails]) for name, emails in splits.items()}
    if MODELS[3] in args.models:  # once: MiniLM stays frozen, so each email's embedding is the same in every fit
        order = ("train", "valid", "test")
        embedded = minilm_features([t for name in order for t in texts[name]], args.minilm_tokens, args.workers)
        e = dict(zip(order, embedded.split([len(texts[name]) for name in order])))
        print(f"MiniLM embeddings of {len(embedded)} emails: {time.perf_counter() - start:.0f} s", flush=True)
    if MODELS[4] in args.models:  # each email's first --minilm-tokens WordPieces, as (d) reads them
        wordpiece = load_minilm()[1]
        wordpiece.enable_truncation(args.minilm_tokens)
        pieces = {name: wordpieces(wordpiece, texts[name]) for name in splits}
    runs = []
    for size in args.sizes:
        for seed in args.seeds:
            rows = sample(y["train"], size or len(y["train"]), seed)
            predicted, chosen = {}, {}
            if MODELS[0] in args.models:
                vocabulary = word_vocabulary([texts["train"][i] for i in rows], min_count=1)
                bow = {name: bag_of_words(texts[name], vocabulary) for name in ("valid", "test")}
                head, decay, score = fit_on_validation(
                    (bag_of_words([texts["train"][i] for i in rows], vocabulary), y["train"][rows]),
                    (bow["valid"], y["valid"]))
                predicted[MODELS[0]], chosen[MODELS[0]] = head(bow["test"]).argmax(dim=-1), {
                    "weight_decay": decay, "valid_accuracy": score}
            for name in [m for m in MODELS[1:3] if m in args.models]:
                torch.manual_seed(seed)
                model = (classifier_from_mlm(mlm) if name == MODELS[2] else
                         SequenceClassifier(mlm.settings["vocab_size"], 2, d_model=mlm.settings["d_model"],
                                            num_heads=mlm.settings["num_heads"], d_ff=mlm.settings["d_ff"],
                                            num_layers=mlm.settings["num_layers"], max_len=length, pooling="mean"))
                step, score = train_on_validation(model, (x["train"][rows], y["train"][rows]),
                                                  (x["valid"], y["valid"]), args.steps, args.eval_every,
                                                  args.lr, seed)
                with torch.no_grad():
                    predicted[name] = model(x["test"]).argmax(dim=-1)
                chosen[name] = {"step": step, "valid_accuracy": score}
            if MODELS[4] in args.models:  # MiniLM and a head, trained as one model
                model, history = fine_tune_minilm(
                    [pieces["train"][i] for i in rows], y["train"][rows], (pieces["valid"], y["valid"]),
                    32 * args.steps, args.steps // args.eval_every, seed)
                predicted[MODELS[4]], chosen[MODELS[4]] = class_scores(model, pieces["test"]).argmax(dim=-1), kept(history)
            if MODELS[3] in args.models:  # the head: a logistic regression on the fixed embeddings
                head, decay, score = fit_on_validation((e["train"][rows], y["train"][rows]), (e["valid"], y["valid"]))
                with torch.no_grad():
                    predicted[MODELS[3]] = head(e["test"]).argmax(dim=-1)
                chosen[MODELS[3]] = {"weight_decay": decay, "valid_accuracy": score}
            for name, guess in predicted.items():
                low, high = bootstrap_interval(guess == y["test"])
                runs.append({"labels": len(rows), "seed": seed, "model": name, **scores(guess, y["test"]),
                             "accuracy_interval": [low, high], **chosen[name],
                             "predicted": "".join(str(int(v)) for v in guess)})
                print(json.dumps({k: v for k, v in runs[-1].items() if k not in ("predicted", "loss")}), flush=True)
    given = sys.argv[1:] if argv is None else argv
    given = [a for i, a in enumerate(given) if "--out" not in (a, given[i - 1] if i else "")]  # where, not what
    command = "python -m benchmarks.spam_curve " + " ".join(f'"{a}"' if " " in a else a for a in given)
    ran = sorted({run["labels"] for run in runs})  # the numbers of labelled emails this command trained on
    record = {"models": list(args.models), "labels": ran, "command": command,
              "seconds": round(time.perf_counter() - start, 1), "machine": machine()}
    if MODELS[3] in args.models or MODELS[4] in args.models:
        record["minilm_tokens"] = args.minilm_tokens
    results = {"runs": [], "records": []}
    if args.out.exists():  # keep the other models' runs, and the records of the runs that made them
        results = json.loads(args.out.read_text())
        results["runs"] = [run for run in results["runs"]
                           if run["model"] not in args.models or run["labels"] not in ran]
        results["records"] = [r for r in results["records"]  # those that made a run still in the file
                              if set(r["models"]) - set(args.models) or set(r["labels"]) - set(ran)]
    results.update(test_emails=len(y["test"]), valid_emails=len(y["valid"]), train_emails=len(y["train"]),
                   weight_decays=list(WEIGHT_DECAYS))
    if any(m in args.models for m in MODELS[1:3]):
        results.update(steps=args.steps, eval_every=args.eval_every, lr=args.lr)
    results["runs"] += runs
    results["records"].append(record)
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
