"""The machine's limit for a decoding step: how fast torch's own matrix products run at the step's
shapes, float32 and int8, and so how many tokens per second a step made of nothing but its products
could reach.

A decoder step of a Transformer with ``rows`` live rows (the sources for greedy decoding, sources ×
beams for beam search) multiplies a ``(rows, d_model)`` input by every weight of the decoder: per
layer the self-attention's W^Q, W^K, W^V, W^O, the cross-attention's W^Q and W^O (its keys and
values are the memory's, projected once per source), and the feed-forward network's two matrices,
then the output layer's ``(d_model, V)``. This script times each of those products alone with
``torch.nn.functional.linear`` (the ``addmm`` that ``nn.Linear`` calls, a weight ``(out, in)``, the
layout the model stores), with ``torch.mm`` on the weight stored ``(in, out)``, with ``PackedLinear``
(``prepack``: the weight packed once for oneDNN), and int8 with the dynamically quantized linear layer
that ``quantize_int8`` uses (fbgemm). For each shape it prints
GFLOP/s (2 · rows · in · out floating-point operations a call), best of ``--repeats`` timings of
``--calls`` calls each, and for the whole step the time its products take and the tokens per second
that bounds: a ceiling for any engine with this arithmetic, since the rest of a step (attention,
normalisation, the search itself) only adds time.

    .venv/bin/python -m benchmarks.peak                     # OPUS-MT size, rows 32 and 128, 1 and 2 threads
    .venv/bin/python -m benchmarks.peak --rows 8 --threads 1

``benchmarks/generation.py`` calls ``step_products`` and ``ceiling`` to print each engine's share.
It is a measurement, not a test.
"""

from __future__ import annotations

import argparse
import time
import warnings

import torch
from torch import nn
from torch.nn import functional as F

from transformer.generation.packed import prepack

KINDS = ("linear", "mm", "packed", "int8")
OPUS_MT = dict(vocab=58101, d_model=512, num_layers=6, d_ff=2048)


def step_products(vocab: int, d_model: int, num_layers: int, d_ff: int, **_: object) -> list[tuple[str, int, int, int]]:
    """The products of one decoder step per row: (name, in, out, how many per step)."""
    return [("attention projection", d_model, d_model, 6 * num_layers),  # self Q, K, V, O; cross Q, O
            ("feed-forward, first", d_model, d_ff, num_layers),
            ("feed-forward, second", d_ff, d_model, num_layers),
            ("output layer", d_model, vocab, 1)]


def step_flop(size: dict, rows: int) -> int:
    """Floating-point operations of the products of one decoder step with ``rows`` rows."""
    return sum(2 * rows * n_in * n_out * count for _, n_in, n_out, count in step_products(**size))


def _best(run, calls: int, repeats: int) -> float:
    """Seconds per call of ``run()``: the best of ``repeats`` timings of ``calls`` calls."""
    run()  # warm-up: packing, allocation
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            run()
        best = min(best, (time.perf_counter() - start) / calls)
    return best


def time_products(size: dict, rows: int, repeats: int = 3, calls: int = 20, seed: int = 0) -> dict[str, dict]:
    """Seconds per call of each step product at ``rows`` rows: ``{name: {"linear", "mm", "packed", "int8", "flop"}}``."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch 2.13 announces that dynamic quantization moves to torchao
        layers = {name: nn.Linear(n_in, n_out).requires_grad_(False) for name, n_in, n_out, _ in step_products(**size)}
        int8 = {name: torch.ao.quantization.quantize_dynamic(nn.Sequential(layer), {nn.Linear}, dtype=torch.qint8)
                for name, layer in layers.items()}
    with torch.inference_mode():  # the layers are made outside: PackedLinear packs no inference tensor
        for name, n_in, n_out, _ in step_products(**size):
            x, layer, packed = torch.randn(rows, n_in, generator=g), layers[name], prepack(layers[name])
            weight, bias, weight_t = layer.weight, layer.bias, layer.weight.t().contiguous()
            n = max(1, calls * 512 * 512 // (n_in * n_out))  # fewer calls of the large products
            out[name] = {"linear": _best(lambda: F.linear(x, weight, bias), n, repeats),
                         "mm": _best(lambda: torch.mm(x, weight_t), n, repeats),
                         "packed": _best(lambda: packed(x), n, repeats),
                         "int8": _best(lambda: int8[name](x), n, repeats),
                         "flop": 2 * rows * n_in * n_out}
    return out


def ceiling(size: dict, rows: int, timings: dict[str, dict], kind: str = "linear") -> float:
    """Tokens per second of a step that is nothing but its products (``kind``: linear, mm, packed or int8), each
    step adding ``rows`` tokens."""
    seconds = sum(timings[name][kind] * count for name, _, _, count in step_products(**size))
    return rows / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[32, 128], help="live rows: B (greedy), B·k (beam)")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.backends.cpu.get_cpu_capability()}; OPUS-MT size {OPUS_MT}")
    for threads in args.threads:
        torch.set_num_threads(threads)
        for rows in args.rows:
            timings = time_products(OPUS_MT, rows, args.repeats)
            print(f"\n{threads} thread(s), {rows} rows: GFLOP/s per product (linear = addmm on the (out, in) weight; "
                  f"mm on (in, out); packed = prepack's oneDNN weight; int8 = quantized dynamic linear)")
            for name, t in timings.items():
                print(f"  {name:<22} " + "  ".join(f"{kind} {t['flop'] / t[kind] / 1e9:6.1f}" for kind in KINDS))
            flop = step_flop(OPUS_MT, rows)
            print(f"  a step's products: {flop / 1e9:.2f} GFLOP; ceiling " + ", ".join(
                f"{kind} {ceiling(OPUS_MT, rows, timings, kind):,.0f} tokens/s ({flop * ceiling(OPUS_MT, rows, timings, kind) / rows / 1e9:.0f} GFLOP/s)"
                for kind in KINDS))


if __name__ == "__main__":
    main()
