"""Compiled decoding against eager, in one process: greedy decoding of the same weights three ways.

- ``greedy_decode``: eager, with the key/value cache (its views grow a position every step) and
  finished rows leaving the batch;
- ``static_greedy_decode``: eager, every step the same shapes (``decode_step`` over buffers sized
  for the output limit);
- ``static_greedy_decode`` with ``step=compile_step()``: the same step compiled once
  by TorchDynamo and Inductor (generated C++ on the CPU), then replayed.

Two sizes with random weights (nothing is downloaded): the book's translator (d_model 256, 3 + 3
layers, 4 heads, d_ff 1024, 8,000 tokens), where a step is small and the time between kernels
counts, and OPUS-MT de-en (d_model 512, 6 + 6 layers, 8 heads, d_ff 2048, 58,101 tokens), where
the output layer's product dominates. Batch 1 and 32, 1 and 2 threads, 40 new tokens forced (the
end token's output bias is -1e9), the best of ``--repeats``, the three taking turns. The script
checks that the three give the same tokens and prints tokens per second, the ratio compiled /
eager ``greedy_decode``, and the compile time.

    .venv/bin/python -m benchmarks.compiled_decoding            # about 5 minutes on 2 cores
    .venv/bin/python -m benchmarks.compiled_decoding --sizes book --batches 1 --repeats 1

Results go to ``benchmarks/compiled_decoding_results.json`` (``--out``). A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch

from transformer import Transformer, greedy_decode
from transformer.nn.attention import padding_mask
from transformer.generation.compiled import compile_step, static_greedy_decode
from transformer.tasks.multi30k import BOS_ID, EOS_ID, PAD_ID
from benchmarks.generation import measure, sources
from benchmarks.machine import cpu_name

ROOT = Path(__file__).resolve().parent.parent
SIZES = {"book": dict(vocab=8000, d_model=256, num_heads=4, num_layers=3, d_ff=1024),
         "opus-mt": dict(vocab=58101, d_model=512, num_heads=8, num_layers=6, d_ff=2048)}


def build(size: dict[str, int], seed: int) -> Transformer:
    """A Transformer of ``size`` with random weights whose end token is never chosen."""
    torch.manual_seed(seed)
    model = Transformer(size["vocab"], size["vocab"], d_model=size["d_model"], num_heads=size["num_heads"],
                        num_layers=size["num_layers"], d_ff=size["d_ff"], dropout=0.0, max_len=256,
                        pad_id=PAD_ID, share_embeddings=True, tie_output=True).eval()
    with torch.no_grad():
        model.output.bias[EOS_ID] = -1e9  # every row generates exactly --new-tokens tokens
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", nargs="+", choices=sorted(SIZES), default=["book", "opus-mt"])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--new-tokens", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "compiled_decoding_results.json")
    args = parser.parse_args()
    machine = f"{cpu_name()} ({torch.backends.cpu.get_cpu_capability()}), {os.cpu_count()} cores, torch {torch.__version__}"
    print(machine)
    torch._dynamo.config.cache_size_limit = 64  # one graph per model and batch size
    compiled = compile_step()
    results = []
    for size_name in args.sizes:
        model = build(SIZES[size_name], args.seed)
        for batch in args.batches:
            src = sources(batch, SIZES[size_name]["vocab"], 12, 37, args.seed)
            mask = padding_mask(src, PAD_ID)
            runs = {  # name -> run(beam): generation.measure's form; all three are greedy (beam 1)
                "greedy_decode": lambda beam: greedy_decode(model, src, args.new_tokens + 1, BOS_ID, EOS_ID, mask),
                "static eager": lambda beam: static_greedy_decode(model, src, args.new_tokens + 1, BOS_ID, EOS_ID,
                                                                  mask),
                "static compiled": lambda beam: static_greedy_decode(model, src, args.new_tokens + 1, BOS_ID,
                                                                     EOS_ID, mask, step=compiled),
            }
            start = time.perf_counter()
            runs["static compiled"](1)  # the first call compiles
            compile_seconds = time.perf_counter() - start
            for threads in args.threads:
                torch.set_num_threads(threads)
                speed, outputs = measure(runs, 1, args.repeats, batch * args.new_tokens)  # best of, in turns
                same = all(torch.equal(outputs["greedy_decode"], out) for out in outputs.values())
                full = outputs["greedy_decode"].shape == (batch, args.new_tokens + 1)
                if not (same and full):
                    raise RuntimeError(f"{size_name}, batch {batch}: the three outputs differ or are short")
                results.append({"size": size_name, "batch": batch, "threads": threads, "tokens_per_second": speed,
                                "compile_seconds": compile_seconds, "same_tokens": same})
                print(f"{size_name:>8}, batch {batch:>2}, {threads} thread(s): " + ", ".join(
                    f"{name} {value:,.0f}" for name, value in speed.items()) + " tokens/s; compiled / eager "
                    f"{speed['static compiled'] / speed['greedy_decode']:.2f}x (compiled in {compile_seconds:.0f} s)")
    args.out.write_text(json.dumps({
        "machine": machine, "command": "python -m benchmarks.compiled_decoding", "new_tokens": args.new_tokens,
        "sizes": {name: SIZES[name] for name in args.sizes}, "results": results,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }, indent=1) + "\n")
    print(f"results in {args.out}")


if __name__ == "__main__":
    main()
