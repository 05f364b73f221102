"""The entities chapter's MiniLM fine-tuned end to end, run outside the book: ``fine_tune_tagger`` on the
chapter's 1,674 training tweets, read as the chapter reads them (``WordsApart`` of MiniLM's WordPiece), at
each seed the robustness table runs; a seed takes about ten minutes of one core. Writes
``benchmarks/entities_fine_tune_results.json``: the command, machine, date, and per seed the CPU seconds, the
history of every step, the validation F1s, and the tags predicted for each test tweet (as indices into
``BIO_TAGS``, the tweets in the chapter's order). No tweet text: the tweets are third-party data, fetched by
``make setup``.

chapters/entities.md reads the run of its seed, repeats the first steps and checks them against it;
tests/test_entities.py recomputes every recorded F1 from the recorded tags with seqeval.

Usage (from the repository's root, on the plain path and one thread, as the committed file was made):
    ATEN_CPU_CAPABILITY=default OMP_NUM_THREADS=1 python -m benchmarks.entities_fine_tune --seeds 0 1
    ... --seeds 2 3    (a second process: each run replaces only its own seeds' records in --out)
    ... --steps 4 --out /tmp/start.json    (the first 4 steps only, without validation or test)
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
from transformer.interop.bert import BertTagger, load_minilm
from transformer.tasks.entities import (
    BIO_TAGS,
    SPLITS,
    WordsApart,
    fine_tune_tagger,
    read_wnut16,
    span_counts,
    span_f1,
    tweet_split,
    word_tags,
)
from transformer.tasks.tagging import tagging_tensors

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "entities_fine_tune_results.json"


def tweets_by_split() -> dict[str, list[tuple[list[str], list[str]]]]:
    """The chapter's split of the WNUT 2016 training tweets (``tweet_split``), in file order."""
    tweets = read_wnut16()
    return {name: [tweet for tweet in tweets if tweet_split(tweet[0]) == name] for name in SPLITS}


def run(seed: int, steps: int | None) -> dict:
    """The chapter's fine-tuning at ``seed`` (``steps``: stop after that many, None: the whole run) and
    what the results file records of it."""
    splits = tweets_by_split()
    gold = {name: [tags for _, tags in splits[name]] for name in SPLITS}
    _, wordpiece = load_minilm()
    wordpiece.no_padding()  # tagging_tensors pads
    data = {
        name: tagging_tensors(WordsApart(wordpiece), [(words, [BIO_TAGS.index(t) for t in tags])
                                                      for words, tags in splits[name]])
        for name in SPLITS
    }
    torch.manual_seed(seed)  # the head's initial weights, as in the chapter
    tagger = BertTagger(load_minilm()[0], num_classes=len(BIO_TAGS))
    tick = time.process_time()
    history = fine_tune_tagger(tagger, data["train"], data["valid"], gold["valid"], seed=seed, stop=steps)
    record: dict = {"seed": seed, "capability": torch.backends.cpu.get_cpu_capability(), "steps": len(history["loss"])}
    if steps is None:
        tags = word_tags(tagger, *data["test"])
        record |= {"test_tweets": len(tags),
                   "test_f1": float(span_f1(span_counts(gold["test"], tags).sum(dim=(0, 1)))),
                   "test_tags": [" ".join(str(BIO_TAGS.index(t)) for t in row) for row in tags]}
    record["cpu_seconds"] = round(time.process_time() - tick, 1)
    record["history"] = history
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3])
    parser.add_argument("--steps", type=int, default=None, help="stop after this many steps (default: the whole run)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.steps is not None and args.steps < 1:
        print(f"entities_fine_tune: --steps must be an int >= 1, got {args.steps}", file=sys.stderr)
        return 2
    if any(seed < 0 for seed in args.seeds):
        print(f"entities_fine_tune: --seeds must be ints >= 0, got {args.seeds}", file=sys.stderr)
        return 2
    if not args.out.parent.is_dir():
        print(f"entities_fine_tune: --out must be in an existing folder, got {args.out}", file=sys.stderr)
        return 2
    torch.set_num_threads(1)  # as the chapter runs
    try:
        records = [run(seed, args.steps) for seed in args.seeds]
    except KeyboardInterrupt:
        print("entities_fine_tune: interrupted; nothing written", file=sys.stderr)
        return 130
    about = {
        "command": "ATEN_CPU_CAPABILITY=default OMP_NUM_THREADS=1 python -m benchmarks.entities_fine_tune --seeds "
        + " ".join(map(str, args.seeds)) + ("" if args.steps is None else f" --steps {args.steps}"),
        "machine": f"{cpu_name()}, {platform.machine()}, {os.cpu_count()} cores, shared",
        "date": datetime.date.today().isoformat(),
        "torch": torch.__version__,
        "capability": torch.backends.cpu.get_cpu_capability(),
        "threads": torch.get_num_threads(),
    }
    # the other seeds' runs stay as they were (read now, not at the start: another process may have
    # written its seeds meanwhile)
    kept = json.loads(args.out.read_text())["runs"] if args.out.exists() else []
    runs = sorted([r for r in kept if r["seed"] not in args.seeds] + records, key=lambda r: r["seed"])
    # one run a line
    args.out.write_text("{\n" + ",\n".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in about.items())
                        + ',\n"runs": [\n' + ",\n".join(json.dumps(r) for r in runs) + "\n]\n}\n")
    for r in records:
        print(f"seed {r['seed']}: {r['steps']} steps in {r['cpu_seconds']:.0f} s of CPU"
              + (f"; test micro F1 {r['test_f1']:.3f}" if "test_f1" in r else ""))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
