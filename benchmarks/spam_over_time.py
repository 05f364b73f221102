"""Does the spam filter hold on later mail? Train on the earlier emails of the SpamAssassin ``-1`` folders, test
on the latest, by the date in each email's ``Date:`` header, against a random split of the same sizes.

The emails are those ``split_emails(read_emails())`` keeps (near-duplicates dropped). An email whose ``Date:``
header does not parse, or whose year lies outside 2001-2003 (there are years 0102, 2020 and 2028), is dropped
and counted. A date without a time zone (``-0000``) is read as UTC. The header is the sender's word, so the
script also counts the emails whose date lies more than two days from the earliest ``Received:`` stamp (written
by a mail server). Spam and ham are split apart, each by its own dates: most spam is dated August and September
2002, most ham July to October, some as late as December, so one cut in time would leave few spam among the
later emails. Of each class the latest ``--later`` share (ties broken by
``Email.key``) is the test set, "later mail", and the rest trains. The control splits each class at random
(a permutation seeded by each of ``--seeds``) into a test set and a training set of exactly the same sizes, so
that the two differ only in how the test emails were chosen. No model here is tuned, so nothing is held out
for validation: all the earlier emails train.

Models: (a) "bag of words", the logistic regression on which words occur (``transformer.tasks.baselines``, as
``benchmarks/spam_curve.py`` fits it), on both splits; it has no randomness, so the split by date gives one
result and the control one per seed. (b) "committed classifier", ``models/spam-classifier/classifier.pt``,
read as ``transformer classify`` reads it. It was trained on ``split_emails``'s training split, which holds
emails of every date, so it is not a test of time: it is measured only on its own test split (``key % 10 ==
0``, never seen in training), divided into the emails that fall in the later set and the others. (c) "committed
recipe": a classifier trained anew as (b) was (``RECIPE``: its pre-trained encoder, window, steps; seed 0) on
the earlier emails that lie in ``split_emails``'s training split, with its validation split's earlier emails as
validation, and tested on all the later mail; the same on the first ``--recipe-controls`` random controls. Its
pre-trained encoder (``models/spam-mlm``) read the training split's text, later emails included, but never a
label. Figures:
accuracy with its 95 % percentile bootstrap interval (``bootstrap_interval``, 2,000 resamples, seed 0), spam
recall, ham called spam, spam missed and the spam class's F1. Writes ``benchmarks/spam_over_time_results.json``,
which chapters/classify_command.md reads and ``tests/test_spam_over_time.py`` checks.

Usage (from the repository's root):
    python -m benchmarks.spam_over_time --seeds 0 1 2 3 4 5 6 7 8 9
    python -m benchmarks.spam_over_time --seeds 0 --models "bag of words" --out /tmp/over_time.json
    python -m benchmarks.spam_over_time --seeds 0 --models "committed recipe" --recipe-controls 0 --out /tmp/r.json
"""

import argparse
import email
import email.utils
import json
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

from benchmarks.spam_curve import machine, scores
from transformer.cli.classify import label_rows, load_classifier
from transformer.tasks.baselines import bag_of_words, fit_logistic_regression, word_vocabulary
from transformer.tasks.email import Email, corpus_folder, read_emails, split_emails
from transformer.tasks.intervals import bootstrap_interval

MODELS = ("bag of words", "committed classifier", "committed recipe")
CLASSES = {1: "spam", 0: "ham"}
YEARS = (2001, 2003)  # the first and last year of a date that is kept
COMMITTED = Path("models/spam-classifier/classifier.pt")
#: how the committed classifier was trained (models/spam-classifier/results.json's command), less its data
RECIPE = ("--reads", "email", "--pretrained", "models/spam-mlm", "--length", "512", "--steps", "600")


def mail_date(mail: Email) -> datetime | None:
    """The date of ``mail``'s first ``Date:`` header, in UTC (a date without a zone read as UTC); None if it
    has none or it does not parse."""
    header = email.message_from_string(mail.headers).get("Date")
    try:
        date = email.utils.parsedate_to_datetime(str(header))
    except (TypeError, ValueError):
        return None
    return date.replace(tzinfo=timezone.utc) if date.tzinfo is None else date.astimezone(timezone.utc)


def first_received(mail: Email) -> datetime | None:
    """The earliest time stamp (with a zone) of ``mail``'s ``Received:`` headers, written by the servers that
    passed it on; None if none parses."""
    times = []
    for header in email.message_from_string(mail.headers).get_all("Received") or []:
        try:
            stamp = email.utils.parsedate_to_datetime(str(header).rsplit(";", 1)[1].strip())
        except (IndexError, TypeError, ValueError):
            continue
        if stamp.tzinfo is not None:
            times.append(stamp)
    return min(times, default=None)


def dated_emails(mails: list[Email]) -> tuple[list[tuple[datetime, Email]], dict[str, int]]:
    """``(date, email)`` for each email of ``mails`` with a date in ``YEARS``, in their order, and how many
    were dropped: ``{"no date": n, "year outside 2001-2003": m}``."""
    dated, dropped = [], {"no date": 0, f"year outside {YEARS[0]}-{YEARS[1]}": 0}
    for mail in mails:
        date = mail_date(mail)
        if date is None:
            dropped["no date"] += 1
        elif not YEARS[0] <= date.year <= YEARS[1]:
            dropped[f"year outside {YEARS[0]}-{YEARS[1]}"] += 1
        else:
            dated.append((date, mail))
    return dated, dropped


def split_by_date(dated: list[tuple[datetime, Email]], later: float) -> dict[str, list[tuple[datetime, Email]]]:
    """Of each class, the latest ``round(later * n)`` emails (by date, then ``Email.key``) as "test", the rest
    as "train"; spam first, then ham, each in date order."""
    parts: dict[str, list] = {"train": [], "test": []}
    for label in CLASSES:
        rows = sorted((row for row in dated if row[1].label == label), key=lambda row: (row[0], row[1].key))
        cut = len(rows) - round(later * len(rows))
        parts["train"] += rows[:cut]
        parts["test"] += rows[cut:]
    return parts


def split_at_random(dated: list[tuple[datetime, Email]], sizes: dict[int, int],
                    seed: int) -> dict[str, list[tuple[datetime, Email]]]:
    """The control: of each class, ``sizes[label]`` emails drawn at random (a permutation seeded by ``seed``)
    as "test", the rest as "train"."""
    generator = torch.Generator().manual_seed(seed)
    parts: dict[str, list] = {"train": [], "test": []}
    for label in CLASSES:
        rows = [row for row in dated if row[1].label == label]
        order = torch.randperm(len(rows), generator=generator).tolist()
        parts["test"] += [rows[i] for i in order[:sizes[label]]]
        parts["train"] += [rows[i] for i in order[sizes[label]:]]
    return parts


def describe(parts: dict[str, list[tuple[datetime, Email]]]) -> dict:
    """Per class and part: the number of emails and the first, median (the lower middle one) and last date
    (ISO 8601, UTC)."""
    described: dict[str, dict] = {}
    for label, name in CLASSES.items():
        described[name] = {}
        for part, rows in parts.items():
            dates = sorted(date for date, mail in rows if mail.label == label)
            described[name][part] = {"emails": len(dates), "first": dates[0].isoformat(),
                                     "median": dates[(len(dates) - 1) // 2].isoformat(),
                                     "last": dates[-1].isoformat()}
    return described


def figures(predicted: torch.Tensor, labels: torch.Tensor) -> dict:
    """Accuracy and its 95 % bootstrap interval, spam recall, ham called spam, spam missed, spam F1."""
    correct = predicted == labels
    spam = labels == 1
    return {"emails": len(labels), "spam": int(spam.sum()), "accuracy": int(correct.sum()) / len(labels),
            "accuracy_interval": list(bootstrap_interval(correct)), "spam_f1": scores(predicted, labels)["spam_f1"],
            "spam_recall": int(correct[spam].sum()) / int(spam.sum()),
            "ham_false_positives": int((predicted[~spam] == 1).sum()), "spam_missed": int((~correct[spam]).sum())}


def bag_of_words_predictions(train: list[Email], test: list[Email]) -> torch.Tensor:
    """The bag-of-words logistic regression fitted to ``train`` (vocabulary: every word of ``train``, as
    ``benchmarks/spam_curve.py`` has it), and its labels of ``test``."""
    vocabulary = word_vocabulary([m.text for m in train], min_count=1)
    model = fit_logistic_regression(bag_of_words([m.text for m in train], vocabulary),
                                    torch.tensor([m.label for m in train]))
    with torch.no_grad():
        return model(bag_of_words([m.text for m in test], vocabulary)).argmax(dim=-1)


def committed_predictions(test: list[Email], checkpoint_path: Path) -> torch.Tensor:
    """The committed classifier's labels (1 spam) of ``test``, given each raw email as ``transformer classify``
    is given it."""
    model, tokenizer, checkpoint = load_classifier(checkpoint_path)
    model.eval()
    folder = corpus_folder()
    rows = [{"text": (folder / m.folder / m.name).read_bytes().decode("utf-8", "surrogateescape")} for m in test]
    return torch.tensor([checkpoint["labels"].index(answer["label"])
                         for answer in label_rows(model, tokenizer, checkpoint, rows, 64)])


def recipe_predictions(train: list[Email], valid: list[Email], test: list[Email], work: Path) -> torch.Tensor:
    """A classifier trained as the committed one was (``RECIPE``, seed 0, one thread) on ``train``, with ``valid``
    as its validation set, in the folder ``work``; its labels (1 spam) of ``test``."""
    from transformer.__main__ import command  # noqa: PLC0415 (the command line, as a reader runs it)

    folder = corpus_folder()
    raw = lambda m: (folder / m.folder / m.name).read_bytes().decode("utf-8", "surrogateescape")  # noqa: E731
    for name, part in (("train", train), ("valid", valid)):
        (work / f"{name}.jsonl").write_text("".join(
            json.dumps({"text": raw(m), "label": CLASSES[m.label]}) + "\n" for m in part), encoding="utf-8")
    status = command(["train", "--task", "classify", "--train", str(work / "train.jsonl"), "--valid",
                      str(work / "valid.jsonl"), *RECIPE, "--no-progress", "--checkpoint-dir", str(work / "run")])
    if status != 0:
        raise RuntimeError(f"training by the committed recipe in {work} ended with status {status}")
    return committed_predictions(test, work / "run" / "classifier.pt")


def measure(mails: list[Email], seeds: list[int], models: list[str], later: float = 0.2,
            checkpoint_path: Path = COMMITTED, recipe_controls: int = 3) -> dict:
    """The splits and every model's figures on them (see the module's docstring), from ``mails``, all emails
    of ``read_emails()``."""
    splits = split_emails(mails)
    kept = [mail for part in splits.values() for mail in part]
    dated, dropped = dated_emails(kept)
    by_date = split_by_date(dated, later)
    sizes = {label: sum(m.label == label for _, m in by_date["test"]) for label in CLASSES}
    controls = {seed: split_at_random(dated, sizes, seed) for seed in seeds}
    received = [(date, first_received(mail)) for date, mail in dated]
    gaps = [abs((date - stamp).total_seconds()) for date, stamp in received if stamp is not None]
    results = {"later": later, "emails": {"read": len(mails), "kept": len(kept), "dated": len(dated)},
               "dropped": dropped,
               # the Date header is the sender's word: how often the first server's stamp disagrees
               "date_check": {"with a Received time": len(gaps),
                              "Date over 2 days from the first Received": sum(gap > 2 * 86400 for gap in gaps)},
               "splits": {"by date": describe(by_date)}, "runs": []}
    results["splits"].update({f"random, seed {seed}": describe(parts) for seed, parts in controls.items()})
    if MODELS[0] in models:
        for name, seed, parts in [("by date", None, by_date)] + [("random", s, p) for s, p in controls.items()]:
            train, test = [m for _, m in parts["train"]], [m for _, m in parts["test"]]
            labels = torch.tensor([m.label for m in test])
            run = {"model": MODELS[0], "split": name, "seed": seed,
                   **figures(bag_of_words_predictions(train, test), labels)}
            results["runs"].append(run)
            print(json.dumps(run), flush=True)
    if MODELS[1] in models:  # its own test split only, divided by the split by date
        unseen = {(m.folder, m.name) for m in splits["test"]}
        later_names = {(m.folder, m.name) for _, m in by_date["test"]}
        test = [m for _, m in dated if (m.folder, m.name) in unseen]
        predicted, labels = committed_predictions(test, checkpoint_path), torch.tensor([m.label for m in test])
        for name, keep in (("its test split, later part", True), ("its test split, earlier part", False)):
            rows = torch.tensor([((m.folder, m.name) in later_names) == keep for m in test])
            run = {"model": MODELS[1], "split": name, "seed": None, **figures(predicted[rows], labels[rows])}
            results["runs"].append(run)
            print(json.dumps(run), flush=True)
    if MODELS[2] in models:  # trained anew on each split's earlier (or random) part
        train_names = {(m.folder, m.name) for m in splits["train"]}
        valid_names = {(m.folder, m.name) for m in splits["valid"]}
        chosen = [("by date", None, by_date)] + [("random", s, controls[s]) for s in seeds[:recipe_controls]]
        for name, seed, parts in chosen:
            rest = [m for _, m in parts["train"]]
            test = [m for _, m in parts["test"]]
            with tempfile.TemporaryDirectory() as work:
                predicted = recipe_predictions([m for m in rest if (m.folder, m.name) in train_names],
                                               [m for m in rest if (m.folder, m.name) in valid_names], test, Path(work))
            run = {"model": MODELS[2], "split": name, "seed": seed,
                   **figures(predicted, torch.tensor([m.label for m in test]))}
            results["runs"].append(run)
            print(json.dumps(run), flush=True)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.spam_over_time", description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=list(range(10)),
                        help="seeds of the random control, one split each")
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    parser.add_argument("--later", type=float, default=0.2, help="share of each class tested as later mail")
    parser.add_argument("--checkpoint", type=Path, default=COMMITTED, help="the committed classifier")
    parser.add_argument("--recipe-controls", type=int, default=3,
                        help="random splits (the first of --seeds) on which the committed recipe is trained too")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/spam_over_time_results.json"))
    args = parser.parse_args(argv)
    if not 0 < args.later < 1:
        parser.error(f"--later must lie between 0 and 1, got {args.later}")
    start = time.perf_counter()
    if args.recipe_controls < 0:
        parser.error(f"--recipe-controls must be >= 0, got {args.recipe_controls}")
    results = measure(read_emails(), args.seeds, args.models, args.later, args.checkpoint, args.recipe_controls)
    command = "python -m benchmarks.spam_over_time " + " ".join(
        f'"{a}"' if " " in a else a for a in (sys.argv[1:] if argv is None else argv))
    results.update(command=command, machine=machine(), date=time.strftime("%Y-%m-%d", time.gmtime()),
                   seconds=round(time.perf_counter() - start, 1))
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
