"""The translate command on test2016, as a user runs it: sentences per second and BLEU, against the
package as it was before the fast-generation work (a git revision, measured in the same run).

For each setting it pipes the 1,000 German sentences of test2016 through
``python -m transformer.translate --checkpoint models/multi30k/model.pt`` and times the whole command
(start-up and model loading included), then scores the output with sacreBLEU. The settings:

- greedy and beam 4 at 2 threads, today's package and the baseline revision: the speed-up, and
  whether the translations are identical;
- the same beside one other busy process (a Python loop that keeps one core), with 1 and 2 threads
  and with the command's default (``free_cores()``, the cores the load average leaves idle);
- ``--int8`` (int8 linear layers) against float32: the speed-up and the BLEU difference.

    .venv/bin/python -m benchmarks.translate_command                       # baseline cb9bd37^
    .venv/bin/python -m benchmarks.translate_command --baseline REV --repeats 3

Run it on a machine that is otherwise idle: the "busy" settings add their own load. The results go
to ``benchmarks/translate_command_results.json`` (``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tarfile
import tempfile
import time
from contextlib import contextmanager
from io import BytesIO
from pathlib import Path

import torch

from transformer.tasks.metrics import corpus_scores
from transformer.tasks.multi30k import load_multi30k

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / "models" / "multi30k" / "model.pt"
BASELINE = "cb9bd37^"  # the last revision before the preallocated cache and the engine-like batching


def baseline_package(revision: str, folder: Path) -> Path:
    """The ``transformer`` package of ``revision``, unpacked into ``folder`` (for PYTHONPATH)."""
    archive = subprocess.run(["git", "archive", "--format=tar", revision, "transformer"], cwd=ROOT,
                             capture_output=True, check=True).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(folder, filter="data")
    return folder


@contextmanager
def busy_process(on: bool):
    """One other process that keeps a core busy, as another user's job would."""
    if not on:
        yield
        return
    loop = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    time.sleep(65)  # the one-minute load average needs about a minute to see it
    try:
        yield
    finally:
        loop.kill()
        loop.wait()


def run_command(package: Path, options: list[str], german: list[str], repeats: int) -> tuple[float, list[str]]:
    """Best wall time of ``repeats`` runs of the command, and its output lines. It runs in ``package``'s
    folder, since ``python -m`` puts the working directory first on the import path."""
    env = {**os.environ, "PYTHONPATH": str(package)}
    env.pop("OMP_NUM_THREADS", None)
    best, lines = float("inf"), []
    for _ in range(repeats):
        start = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "transformer.translate", "--checkpoint", str(MODEL),
                               "--no-progress", "--device", "cpu", *options], input="\n".join(german) + "\n",
                              capture_output=True, text=True, env=env, cwd=package, check=True)
        best = min(best, time.perf_counter() - start)
        lines = done.stdout.splitlines()
    return best, lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default=BASELINE, help="git revision to compare with (default: %(default)s)")
    parser.add_argument("--repeats", type=int, default=2, help="runs of each setting; the best counts")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "translate_command_results.json")
    args = parser.parse_args()
    german, english = load_multi30k("test")
    print(f"{platform.processor() or platform.machine()}, {len(os.sched_getaffinity(0))} cores, "
          f"torch {torch.__version__}; test2016, {len(german)} sentences; best of {args.repeats}")
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        packages = {"today": ROOT, "baseline": baseline_package(args.baseline, Path(tmp))}
        settings = []
        for busy in (False, True):
            for beam in (1, 4):
                beam_options = ["--beam", str(beam)]
                threads = (["2"], ["1"], []) if busy else (["2"],)
                for n in threads:
                    thread_options = ["--threads", *n] if n else []
                    settings.append((busy, "today", beam, thread_options, beam_options + thread_options))
                # the baseline has no --threads: torch's default, 2 threads on this machine
                settings.append((busy, "baseline", beam, [], beam_options))
                if not busy:
                    settings.append((busy, "today --int8", beam, ["--threads", "2"],
                                     beam_options + ["--threads", "2", "--int8"]))
        for busy in (False, True):
            with busy_process(busy):
                for setting_busy, name, beam, thread_options, options in settings:
                    if setting_busy != busy:
                        continue
                    package = packages["baseline" if name == "baseline" else "today"]
                    seconds, lines = run_command(package, options, german, args.repeats)
                    bleu = corpus_scores(lines, english)["bleu"]
                    rows.append({"busy": busy, "package": name, "beam": beam,
                                 "threads": " ".join(thread_options[1:]) or "default", "seconds": seconds,
                                 "sentences_per_s": len(german) / seconds, "bleu": bleu, "lines": lines})
                    print(f"{'busy' if busy else 'idle':>5} {name:>13} beam {beam} threads "
                          f"{rows[-1]['threads']:>7}: {seconds:6.1f} s, {len(german) / seconds:6.0f} sentences/s, "
                          f"BLEU {bleu:.2f}", flush=True)

    def find(**keys):
        return next(r for r in rows if all(r[k] == v for k, v in keys.items()))

    print()
    for beam in (1, 4):
        today, before = find(busy=False, package="today", beam=beam), find(busy=False, package="baseline", beam=beam)
        int8 = find(busy=False, package="today --int8", beam=beam)
        print(f"beam {beam}, idle, 2 threads: {today['sentences_per_s'] / before['sentences_per_s']:.2f}x the baseline's "
              f"sentences/s, translations identical: {today['lines'] == before['lines']}; int8 "
              f"{int8['sentences_per_s'] / today['sentences_per_s']:.2f}x float32, BLEU {int8['bleu'] - today['bleu']:+.2f}")
        busy_default = find(busy=True, package="today", beam=beam, threads="default")
        busy_before = find(busy=True, package="baseline", beam=beam)
        print(f"beam {beam}, beside a busy process: default threads {busy_default['sentences_per_s']:.0f} "
              f"sentences/s against the baseline's {busy_before['sentences_per_s']:.0f} "
              f"({busy_default['sentences_per_s'] / busy_before['sentences_per_s']:.2f}x)")
    for row in rows:
        row.pop("lines")
    args.out.write_text(json.dumps({"machine": platform.processor() or platform.machine(),
                                    "cores": len(os.sched_getaffinity(0)), "torch": torch.__version__,
                                    "baseline": args.baseline, "repeats": args.repeats, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
