"""Speed of the package's Encoder and Decoder against torch.nn's, on one machine, in one process.

For each of four workloads (encoder and decoder; a training step, forward + backward, and
inference, forward in eval mode without gradients) the script builds our stack and the torch.nn
stack with the same configuration, copies our weights into torch's (so both compute the same
function), and times the two alternately: ours then torch's on even repeats, torch's then ours on
odd ones, so that a change of load on a shared machine hits both. It prints the minimum and the
median time of each and the ratio ours / torch (< 1 means ours is faster).

Targets: ratio <= 1.05 for the training step, <= 1.10 for inference.

    python benchmarks/speed.py                    # B=8, S=T=128, d_model=256, 4 heads, 2 layers
    python benchmarks/speed.py --threads 2 --repeats 30
    python benchmarks/speed.py --profile          # also the top operators of each side
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

from transformer.nn.decoder import Decoder
from transformer.nn.encoder import Encoder, LayerOptions

# torch.nn's counterparts of our modules, holding our weights: the reference of the tests as well.
sys.path.append(str(Path(__file__).resolve().parent.parent / "tests"))
from torch_reference import torch_counterpart  # noqa: E402

TARGETS = {"train": 1.05, "infer": 1.10}


def build(kind: str, args) -> tuple[nn.Module, nn.Module]:
    """Our Encoder or Decoder and torch's, with the same configuration and weights."""
    torch.manual_seed(0)
    stack = Encoder if kind == "encoder" else Decoder
    ours = stack(args.layers, args.d_model, args.heads, args.d_ff, args.dropout,
                 options=LayerOptions(norm_first=args.norm_first))
    return ours, torch_counterpart(ours, args.d_model, args.heads, args.d_ff, dropout=args.dropout)


def workloads(kind: str, mode: str, ours: nn.Module, ref: nn.Module, args):
    """Two functions of no arguments, one step of ours and one of torch's, and a check that they agree."""
    B, S, d = args.batch, args.length, args.d_model
    x = torch.randn(B, S, d)
    memory = torch.randn(B, S, d)
    causal = nn.Transformer.generate_square_subsequent_mask(S, dtype=torch.bool)  # True = masked
    if kind == "encoder":
        run_ours = lambda: ours(x)  # noqa: E731
        run_ref = lambda: ref(x)  # noqa: E731
    else:  # our decoder is always causal; torch's needs the mask (and may use is_causal)
        run_ours = lambda: ours(x, memory)  # noqa: E731
        run_ref = lambda: ref(x, memory, tgt_mask=causal, tgt_is_causal=True)  # noqa: E731
    if mode == "train":
        ours.train(), ref.train()

        def step(run, module):
            module.zero_grad(set_to_none=True)
            run().sum().backward()

        return (lambda: step(run_ours, ours)), (lambda: step(run_ref, ref))

    ours.eval(), ref.eval()
    with torch.no_grad():  # same weights, same function (dropout is off in eval)
        torch.testing.assert_close(run_ours(), run_ref(), atol=1e-4, rtol=1e-4)

    def infer(run):
        with torch.no_grad():
            run()

    return (lambda: infer(run_ours)), (lambda: infer(run_ref))


def interleaved(step_ours, step_ref, repeats: int, warmup: int, clock=time.perf_counter):
    """Seconds per call of each, ``(ours, torch)``, alternating which runs first."""
    for _ in range(warmup):
        step_ours(), step_ref()
    times = {"ours": [], "torch": []}
    for r in range(repeats):
        order = [("ours", step_ours), ("torch", step_ref)]
        for name, step in order if r % 2 == 0 else reversed(order):
            start = clock()
            step()
            times[name].append(clock() - start)
    return times["ours"], times["torch"]


def profile(name: str, step, rows: int) -> None:
    """Print the operators that take the most self CPU time in a few calls of ``step``."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    step()
    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(5):
            step()
    print(f"\n--- {name}: top operators by self CPU time (5 calls) ---")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--length", type=int, default=128, help="source and target length (S = T)")
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--d-ff", type=int, default=1024)
    parser.add_argument("--dropout", type=float, default=0.1)
    parser.add_argument("--norm-first", action="store_true", help="pre-LN instead of the paper's post-LN")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    parser.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                        help="wall: time.perf_counter; cpu: time.process_time, the CPU time of this "
                             "process, steadier on a shared machine (use with --threads 1)")
    parser.add_argument("--only", choices=["encoder", "decoder"], default=None)
    parser.add_argument("--profile", action="store_true", help="print torch.profiler's top operators")
    parser.add_argument("--profile-rows", type=int, default=15)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    print(f"torch {torch.__version__}, {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} CPUs, {torch.get_num_threads()} threads, "
          f"load average {', '.join(f'{v:.2f}' for v in os.getloadavg())}")
    print(f"B={args.batch}, S=T={args.length}, d_model={args.d_model}, heads={args.heads}, "
          f"layers={args.layers}, d_ff={args.d_ff}, dropout={args.dropout}, "
          f"{'pre' if args.norm_first else 'post'}-LN, {args.repeats} interleaved repeats, "
          f"{args.clock} clock")
    print(f"{'workload':<18}{'ours min':>10}{'torch min':>11}{'ratio min':>11}"
          f"{'ratio med':>11}{'target':>8}")
    missed = []
    kinds = [args.only] if args.only else ["encoder", "decoder"]
    for kind in kinds:
        ours, ref = build(kind, args)
        for mode in ("train", "infer"):
            step_ours, step_ref = workloads(kind, mode, ours, ref, args)
            clock = time.process_time if args.clock == "cpu" else time.perf_counter
            t_ours, t_ref = interleaved(step_ours, step_ref, args.repeats, args.warmup, clock)
            ratio_min = min(t_ours) / min(t_ref)
            ratio_med = statistics.median(t_ours) / statistics.median(t_ref)
            target = TARGETS[mode]
            flag = "" if ratio_min <= target else "  MISSED"
            print(f"{kind + ' ' + mode:<18}{min(t_ours) * 1e3:>8.2f}ms{min(t_ref) * 1e3:>9.2f}ms"
                  f"{ratio_min:>11.3f}{ratio_med:>11.3f}{target:>8.2f}{flag}")
            if flag:
                missed.append(f"{kind} {mode}")
            if args.profile:
                profile(f"{kind} {mode}, ours", step_ours, args.profile_rows)
                profile(f"{kind} {mode}, torch", step_ref, args.profile_rows)
    if missed:
        print(f"targets missed: {', '.join(missed)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
