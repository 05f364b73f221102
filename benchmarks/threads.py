"""Threads beside a busy process: the committed translator on the first 50 test sentences, beam 4, with
two threads (torch's default on a 2-core machine) and with one, while one other process keeps a core.

This is the measurement that chapter "Long runs" (chapters/long_runs.md, "Threads on a shared
machine") quotes. Each setting runs in a fresh child process, which loads
``models/multi30k/model.pt``, sets ``torch.set_num_threads``, translates five sentences to warm up and
then times ``translate(model, tokenizer, first 50 test sentences, beam_size=4)``: the decoding alone,
not the start-up. The other process is a Python loop (``while True: pass``), started a few seconds
before the first timing and stopped after the last. The settings alternate (two threads, one, two,
one, ...), so that a change of load on the machine hits both; the best of ``--repeats`` counts, since
interference only ever adds time.

    .venv/bin/python -m benchmarks.threads                  # about a minute on 2 cores
    .venv/bin/python -m benchmarks.threads --repeats 5

Run it on a machine that is otherwise quiet: the busy process is the load it measures. The results go
to ``benchmarks/threads_results.json`` (``--out``), with the machine, torch's version, the date and the
load average before the busy process started.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.machine import cpu_name

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / "models" / "multi30k" / "model.pt"


def time_one(threads: int, sentences: int, beam: int) -> dict:
    """In this process: the seconds ``translate`` takes for the first ``sentences`` test sentences."""
    import torch  # noqa: PLC0415 (the parent process needs no torch)

    from transformer.tasks.multi30k import load_multi30k  # noqa: PLC0415
    from transformer.tasks.translation import load_translator, translate  # noqa: PLC0415

    torch.set_num_threads(threads)
    model, tokenizer = load_translator(MODEL)
    german = load_multi30k("test")[0][:sentences]
    translate(model, tokenizer, german[:5], beam_size=beam)  # warm up: first calls allocate
    start = time.perf_counter()
    english = translate(model, tokenizer, german, beam_size=beam)
    seconds = time.perf_counter() - start
    return {"threads": torch.get_num_threads(), "seconds": seconds, "english": english}


def busy_process() -> subprocess.Popen:
    """One other process that keeps a core busy, as another user's job would."""
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def run_child(threads: int, sentences: int, beam: int) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env.pop(name, None)  # the child sets its threads itself
    done = subprocess.run([sys.executable, "-m", "benchmarks.threads", "--one", str(threads),
                           "--sentences", str(sentences), "--beam", str(beam)],
                          cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sentences", type=int, default=50, help="the first test sentences (default 50)")
    parser.add_argument("--beam", type=int, default=4, help="beam size (default 4)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each setting; the best counts")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "threads_results.json")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)  # a child: time one setting
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(time_one(args.one, args.sentences, args.beam)))
        return 0
    import torch  # noqa: PLC0415

    command = "python -m benchmarks.threads" + "".join(f" {a}" for a in (argv if argv is not None else sys.argv[1:]))
    load_before = os.getloadavg()
    uptime = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    print(f"{cpu_name()}, {os.cpu_count()} cores, torch {torch.__version__}; {uptime}", flush=True)
    busy = busy_process()
    runs: list[dict] = []
    try:
        time.sleep(3)  # the busy process is running before the first timing
        for repeat in range(args.repeats):
            for threads in (2, 1):
                run = run_child(threads, args.sentences, args.beam)
                runs.append({"repeat": repeat, **run})
                print(f"  repeat {repeat}, {threads} threads: {run['seconds']:.2f} s", flush=True)
    finally:
        busy.kill()
        busy.wait()
    best = {threads: min(r["seconds"] for r in runs if r["threads"] == threads) for threads in (2, 1)}
    same = all(r["english"] == runs[0]["english"] for r in runs)
    for run in runs:
        run.pop("english")
    results = {
        "command": command,
        "machine": cpu_name(), "cores": os.cpu_count(), "torch": torch.__version__,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "load_average_before": [round(x, 2) for x in load_before], "uptime_before": uptime,
        "model": str(MODEL.relative_to(ROOT)), "sentences": args.sentences, "beam": args.beam,
        "busy_processes": 1, "repeats": args.repeats, "same_translations": same,
        "best_seconds": {str(threads): seconds for threads, seconds in best.items()}, "runs": runs,
    }
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    print(f"best of {args.repeats}: 2 threads {best[2]:.2f} s, 1 thread {best[1]:.2f} s "
          f"({best[2] / best[1]:.1f}x); same translations: {same}; results in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
