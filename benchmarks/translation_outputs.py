"""The committed translator's translations of test2016, written beside it for the book to score.

Decoding the 1,000 test sentences twice (greedy and beam 4) is the longest part of the chapter
"Translating German"; the chapter reads these files instead, translates the first ``SAMPLE`` sentences
again live and checks that it gets the same lines, and ``tests/test_translate.py`` translates 100
more, spread over the rest of the file, and checks those lines and the scores.

For each decoding it translates the German side of test2016 with ``translate`` (the function of the
translate command, with the command's defaults: length penalty 0.6, input length + 50 tokens,
batches of 4,096 tokens) on one thread, and writes one line per sentence. The record
``test2016.json`` holds the command, the machine, torch, the arithmetic path, the seconds each
decoding took (wall and CPU) and the sacreBLEU scores of each file.

    .venv/bin/python -m benchmarks.translation_outputs            # into models/multi30k/
    .venv/bin/python -m benchmarks.translation_outputs --out DIR
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch

from benchmarks.machine import cpu_name
from transformer.tasks.metrics import corpus_scores
from transformer.tasks.multi30k import load_multi30k
from transformer.tasks.translation import load_translator, translate

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / "models" / "multi30k" / "model.pt"
DECODINGS = {"greedy": 1, "beam4": 4}  # file suffix: beam size
SAMPLE = 100  # the first sentences the chapter translates again live


def output_file(folder: Path, decoding: str) -> Path:
    """Where the translations of one decoding ("greedy" or "beam4") are written."""
    return folder / f"test2016-{decoding}.en"


def read_outputs(folder: Path, decoding: str) -> list[str]:
    """The committed lines of one decoding, one per test sentence (split at "\\n" only:
    a translation may hold any other character)."""
    text = output_file(folder, decoding).read_text(encoding="utf-8")
    return text.split("\n")[:-1]  # every line ends with "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=MODEL.parent, help="folder of the files")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    model, tokenizer = load_translator(MODEL)
    german, english = load_multi30k("test")
    record: dict = {
        "command": "python -m benchmarks.translation_outputs",
        "model": str(MODEL.relative_to(ROOT)),
        "machine": f"{cpu_name()}, {os.cpu_count()} cores",
        "threads": 1,
        "arithmetic": os.environ.get("ATEN_CPU_CAPABILITY", "native"),
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d"),
        "sample": SAMPLE,
        "note": "seconds: wall time, which other jobs on the machine lengthen; cpu_seconds: "
        "the process's CPU time, about the wall time of an idle core",
        "decodings": {},
    }
    for decoding, beam in DECODINGS.items():
        wall, cpu = time.perf_counter(), time.process_time()
        lines = translate(model, tokenizer, german, beam_size=beam)
        seconds = time.perf_counter() - wall
        cpu_seconds = time.process_time() - cpu
        if any("\n" in line for line in lines):
            raise ValueError(f"a {decoding} translation holds a line break")
        output_file(args.out, decoding).write_text(
            "".join(line + "\n" for line in lines), encoding="utf-8"
        )
        record["decodings"][decoding] = {
            "beam_size": beam,
            "seconds": round(seconds, 2),
            "cpu_seconds": round(cpu_seconds, 2),
            **corpus_scores(lines, english),
        }
    (args.out / "test2016.json").write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps(record["decodings"], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
