"""Compiled against eager: the package's Transformer under torch.compile, on one machine, in one process.

Two workloads on one small Transformer: a training step (forward, label-smoothed loss, backward,
Adam step) and an inference pass (eval mode, no gradients). For each, the eager model and the
model compiled with torch.compile (default backend, inductor: generated C++ on the CPU) are first
checked to agree, then timed alternately (eager first on even repeats, compiled first on odd ones)
so that a change of load on a shared machine hits both. The script prints the compile time, the
minimum and median time of each side and the ratio compiled / eager (< 1: compiled is faster).

There is no target: it reports what compiling buys on this machine.

    python benchmarks/compile.py                 # B=8, S=T=32, d_model=128, 4 heads, 2 layers
    python benchmarks/compile.py --threads 1 --repeats 30
"""

from __future__ import annotations

import argparse
import copy
import platform
import statistics
import time

import torch

from transformer import Transformer, label_smoothed_cross_entropy


def build(args) -> tuple[Transformer, tuple[torch.Tensor, ...]]:
    """The model and one batch: (src, tgt_in, tgt_out, src_mask)."""
    torch.manual_seed(0)
    model = Transformer(args.vocab, args.vocab, d_model=args.d_model, num_heads=args.heads, num_layers=args.layers,
                       d_ff=4 * args.d_model, dropout=0.0, max_len=max(args.length, 64) + 1, pad_id=0)
    src = torch.randint(1, args.vocab, (args.batch, args.length))
    tgt = torch.randint(1, args.vocab, (args.batch, args.length + 1))
    return model, (src, tgt[:, :-1], tgt[:, 1:], (src == 0)[:, None, None, :])


def train_step(model, optimizer, src, tgt_in, tgt_out, src_mask) -> torch.Tensor:
    logits = model(src, tgt_in, src_mask)  # (B, T, V)
    loss = label_smoothed_cross_entropy(logits, tgt_out, 0.1)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return loss.detach()


@torch.no_grad()
def infer(model, src, tgt_in, tgt_out, src_mask) -> torch.Tensor:
    return model(src, tgt_in, src_mask)  # (B, T, V)


def workloads(args):
    """For "train" and "infer": (eager callable, compiled callable, seconds spent compiling)."""
    model, batch = build(args)
    result = {}
    eager_train, compiled_train = copy.deepcopy(model).train(), copy.deepcopy(model).train()
    opt_eager = torch.optim.Adam(eager_train.parameters(), lr=1e-4)
    opt_compiled = torch.optim.Adam(compiled_train.parameters(), lr=1e-4)
    net = torch.compile(compiled_train)
    start = time.perf_counter()
    first_compiled = train_step(net, opt_compiled, *batch)  # compiles forward and backward
    compile_s = time.perf_counter() - start
    torch.testing.assert_close(first_compiled, train_step(eager_train, opt_eager, *batch), rtol=1e-4, atol=1e-4)
    result["train"] = (lambda: train_step(eager_train, opt_eager, *batch),
                       lambda: train_step(net, opt_compiled, *batch), compile_s)
    eager_infer = copy.deepcopy(model).eval()
    compiled_infer = torch.compile(copy.deepcopy(model).eval())
    start = time.perf_counter()
    first = infer(compiled_infer, *batch)
    compile_s = time.perf_counter() - start
    torch.testing.assert_close(first, infer(eager_infer, *batch), rtol=1e-4, atol=1e-4)
    result["infer"] = (lambda: infer(eager_infer, *batch), lambda: infer(compiled_infer, *batch), compile_s)
    return result


def time_pair(eager, compiled, repeats: int, warmup: int) -> tuple[list[float], list[float]]:
    for _ in range(warmup):
        eager(), compiled()
    times = {"eager": [], "compiled": []}
    for i in range(repeats):
        order = [("eager", eager), ("compiled", compiled)]
        for name, fn in order if i % 2 == 0 else order[::-1]:
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return times["eager"], times["compiled"]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--length", type=int, default=32, help="source and target length")
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {platform.machine()}, {torch.get_num_threads()} threads; B={args.batch}, "
          f"S=T={args.length}, d_model={args.d_model}, {args.heads} heads, {args.layers} layers, V={args.vocab}")
    print(f"{'workload':<8} {'compile s':>9} {'eager min ms':>12} {'compiled min ms':>15} "
          f"{'eager med ms':>12} {'compiled med ms':>15} {'ratio min':>9} {'ratio med':>9}")
    for name, (eager, compiled, compile_s) in workloads(args).items():
        e, c = time_pair(eager, compiled, args.repeats, args.warmup)
        print(f"{name:<8} {compile_s:>9.1f} {min(e) * 1e3:>12.2f} {min(c) * 1e3:>15.2f} "
              f"{statistics.median(e) * 1e3:>12.2f} {statistics.median(c) * 1e3:>15.2f} "
              f"{min(c) / min(e):>9.3f} {statistics.median(c) / statistics.median(e):>9.3f}")


if __name__ == "__main__":
    main()
