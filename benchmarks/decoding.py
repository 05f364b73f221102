"""Greedy decoding with the key/value cache against without it, on one machine, in one process.

An untrained Transformer generates 128, 256 and 512 tokens for a batch of random sources, with
``eos_id=None`` so that every run goes to ``max_len``. For each length the script times
``greedy_decode(..., use_cache=True)`` and ``use_cache=False`` alternately (cache first on even
repeats, last on odd ones, so that a change of load on a shared machine hits both), checks that
both return the same tokens, and prints the fastest time of each, the time per generated token and
the ratio without / with the cache.

Target (issue 25): the cache at least 20x faster at 256 generated tokens, d_model 512.

    python benchmarks/decoding.py                       # B=8, S=32, d_model=512, 8 heads, 2 layers
    python benchmarks/decoding.py --threads 1 --clock cpu
    python benchmarks/decoding.py --device cuda
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import torch

from transformer import Transformer, greedy_decode

TARGET = 20.0  # the cache at least this much faster at 256 tokens
LENGTHS = (128, 256, 512)  # generated tokens, the start token not counted
BOS = 1


def timed(run, clock, device: torch.device) -> tuple[float, torch.Tensor]:
    """Seconds taken by ``run()`` on ``clock``, and what it returned."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = clock()
    result = run()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return clock() - start, result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--src-len", type=int, default=32, help="source length S")
    parser.add_argument("--vocab", type=int, default=1000, help="source and target vocabulary size")
    parser.add_argument("--d-model", type=int, default=512)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--d-ff", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    parser.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                        help="wall: time.perf_counter; cpu: time.process_time, the CPU time of this "
                             "process, steadier on a shared machine (use with --threads 1)")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    clock = time.process_time if args.clock == "cpu" else time.perf_counter

    torch.manual_seed(0)
    model = Transformer(args.vocab, args.vocab, d_model=args.d_model, num_heads=args.heads,
                        num_layers=args.layers, d_ff=args.d_ff, dropout=0.0, max_len=max(LENGTHS) + 1).to(device).eval()
    src = torch.randint(3, args.vocab, (args.batch, args.src_len), device=device)  # (B, S)

    name = torch.cuda.get_device_name(device) if device.type == "cuda" else (platform.processor() or platform.machine())
    print(f"torch {torch.__version__}, {device.type}: {name}, {os.cpu_count()} CPUs, "
          f"{torch.get_num_threads()} threads, load average {', '.join(f'{v:.2f}' for v in os.getloadavg())}")
    print(f"B={args.batch}, S={args.src_len}, V={args.vocab}, d_model={args.d_model}, heads={args.heads}, "
          f"layers={args.layers}, d_ff={args.d_ff}, {args.repeats} interleaved repeats, {args.clock} clock")
    greedy_decode(model, src, 9, BOS, use_cache=True), greedy_decode(model, src, 9, BOS, use_cache=False)  # warm-up

    print(f"{'tokens':>6}{'cache (s)':>11}{'no cache (s)':>14}{'cache ms/token':>16}"
          f"{'no cache ms/token':>19}{'ratio':>8}")
    ratios = {}
    for n in LENGTHS:
        runs = {True: lambda: greedy_decode(model, src, n + 1, BOS, use_cache=True),
                False: lambda: greedy_decode(model, src, n + 1, BOS, use_cache=False)}
        times, outputs = {True: [], False: []}, {}
        for r in range(args.repeats):
            for use_cache in ((True, False) if r % 2 == 0 else (False, True)):
                seconds, outputs[use_cache] = timed(runs[use_cache], clock, device)
                times[use_cache].append(seconds)
        assert outputs[True].shape == (args.batch, n + 1)
        assert torch.equal(outputs[True], outputs[False]), "the cache changed the tokens"
        cached, recomputed = min(times[True]), min(times[False])
        ratios[n] = recomputed / cached
        print(f"{n:>6}{cached:>11.3f}{recomputed:>14.3f}{cached / n * 1e3:>16.2f}"
              f"{recomputed / n * 1e3:>19.2f}{ratios[n]:>8.1f}")
    verdict = "met" if ratios[256] >= TARGET else "MISSED"
    print(f"ratio at 256 tokens: {ratios[256]:.1f}x (target >= {TARGET:.0f}x: {verdict})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
