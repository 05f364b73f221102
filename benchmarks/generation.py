"""Generation against the field's engines, in one process: this package, Hugging Face ``generate``
and CTranslate2 (float32 and int8) on the same weights, the same sources and the same output length.

The model is a translator of the OPUS-MT de-en size (Marian: d_model 512, 6 + 6 layers, 8 heads,
d_ff 2048, SiLU, a 58,101-token shared vocabulary) with random weights, so that nothing is
downloaded. It is built as this package's ``Transformer``, written out with ``to_huggingface`` (a
``MarianMTModel`` and a tokenizer over a word-level vocabulary of that size) and converted for
CTranslate2 with ``ctranslate2_folder``: three engines, one set of weights. The end token's output
bias is set to -1e9 before the export, so that no engine ever ends a sentence: every run generates
exactly ``--new-tokens`` tokens per source (greedy) or per hypothesis (beam search), and tokens per
second compare like with like. Besides the package's default (``ours float32``), ``ours float32 packed``
runs the copy that ``prepack`` gives (linear layers multiplying by weights packed once for oneDNN).

For 1 and 2 threads, greedy and beam 4, the engines run alternately (the order rotates every
repeat, so that a change of load on a shared machine hits all of them); the best of ``--repeats`` is
kept. The script checks that the engines' outputs agree token for token and prints, with the
machine, tokens per second and the ratios of the issue's targets (issue 35):

- beam 4 and greedy: ours >= 1.0x CTranslate2 float32; beam 4: ours >= 1.5x Hugging Face;
- int8 (``quantize_int8``): ours >= 0.9x CTranslate2 int8.

It also measures the limit (``benchmarks/peak.py``): torch's own products at the step's shapes, alone,
and prints each engine's achieved GFLOP/s (the decoder step's products, 2 · rows · in · out for
each weight, per second; the encoder's are not counted) and its share of the best float32 (or int8)
GFLOP/s of those products.

    .venv/bin/python -m benchmarks.generation                  # about 10 minutes on 2 cores
    .venv/bin/python -m benchmarks.generation --repeats 1 --batch 8 --threads 1

The results go to ``benchmarks/generation_results.json`` (``--out``). It is a benchmark, not a test:
nothing fails when a target is missed; the script says so.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Callable

import torch

from transformer import LayerOptions, Transformer, beam_search, greedy_decode
from transformer.nn.attention import padding_mask
from transformer.interop.huggingface_out import ctranslate2_folder, to_huggingface
from transformer.tasks.multi30k import BOS_ID, EOS_ID, PAD_ID
from transformer.generation.packed import prepack
from transformer.generation.quantize import quantize_int8
from transformer.tasks.subwords import SPECIAL_TOKENS

from benchmarks.machine import cpu_name
from benchmarks.peak import KINDS, ceiling, step_flop, time_products

ROOT = Path(__file__).resolve().parent.parent
SIZES = {"opus-mt": dict(vocab=58101, d_model=512, num_heads=8, num_layers=6, d_ff=2048, max_len=512),
         "small": dict(vocab=1000, d_model=64, num_heads=4, num_layers=2, d_ff=128, max_len=128)}  # a smoke test
TARGETS = {  # (mode, ours, reference): the least ratio of tokens per second (issue 35)
    ("beam 4", "ours float32", "Hugging Face"): 1.5,
    ("beam 4", "ours float32", "CTranslate2 float32"): 1.0,
    ("greedy", "ours float32", "CTranslate2 float32"): 1.0,
    ("beam 4", "ours float32 packed", "CTranslate2 float32"): 1.0,
    ("greedy", "ours float32 packed", "CTranslate2 float32"): 1.0,
    ("greedy", "ours int8", "CTranslate2 int8"): 0.9,
    ("beam 4", "ours int8", "CTranslate2 int8"): 0.9,
}


def word_tokenizer(size: int, specials: tuple[str, ...] = SPECIAL_TOKENS, specials_first: bool = True):
    """A ``tokenizers`` word-level tokenizer of ``size`` tokens: ``specials`` (the book's special
    tokens, the last one standing for unknown words) first, at ids 0, 1, ... as the book's
    tokenizers number them, or last; between or after them the words w0, w1, ..."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = [f"w{i}" for i in range(size - len(specials))]
    order = [*specials, *words] if specials_first else [*words, *specials]
    tokenizer = Tokenizer(models.WordLevel({token: i for i, token in enumerate(order)}, unk_token=specials[-1]))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.add_special_tokens(list(specials))
    return tokenizer


def build_engines(size: dict[str, int], folder: Path, seed: int) -> tuple[Transformer, object, object, Path]:
    """Our model (random weights, the end token never chosen), its Hugging Face twin and the
    CTranslate2 folder converted from it."""
    torch.manual_seed(seed)
    model = Transformer(src_vocab_size=size["vocab"], tgt_vocab_size=size["vocab"], d_model=size["d_model"],
                        num_heads=size["num_heads"], num_layers=size["num_layers"], d_ff=size["d_ff"],
                        dropout=0.0, max_len=size["max_len"], pad_id=PAD_ID, share_embeddings=True,
                        tie_output=True, scale_embedding=True,
                        options=LayerOptions(activation="silu")).eval()
    with torch.no_grad():
        model.output.bias[EOS_ID] = -1e9  # no engine ends a sentence: every run has the same length
    tokenizer = word_tokenizer(size["vocab"])
    hf_model, hf_tokenizer = to_huggingface(model, tokenizer)
    hf_folder, ct2_dir = folder / "hf", folder / "ct2"
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        hf_model.save_pretrained(hf_folder)
        hf_tokenizer.save_pretrained(hf_folder)
        ctranslate2_folder(hf_folder, ct2_dir)
    return model, hf_model, tokenizer, ct2_dir


def sources(batch: int, vocab: int, shortest: int, longest: int, seed: int) -> torch.Tensor:
    """``(batch, longest)`` random token ids (no special tokens), each row ``shortest`` to ``longest``
    long, padded with PAD_ID on the right."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(shortest, longest + 1, (batch,), generator=g)
    src = torch.randint(len(SPECIAL_TOKENS), vocab, (batch, longest), generator=g)
    return src.masked_fill(torch.arange(longest) >= lengths[:, None], PAD_ID)


def engines(model: Transformer, hf_model, tokenizer, ct2_dir: Path, src: torch.Tensor, new_tokens: int,
            threads: int) -> dict[str, Callable[[int], list[list[int]]]]:
    """name -> run(beam_size) returning the generated ids of each source (start token excluded)."""
    import ctranslate2

    mask = padding_mask(src, PAD_ID)
    pieces = [[tokenizer.id_to_token(int(i)) for i in row if i != PAD_ID] for row in src]
    int8, packed = quantize_int8(model), prepack(model)

    def ours(net: Transformer) -> Callable[[int], list[list[int]]]:
        def run(beam: int) -> list[list[int]]:
            with torch.inference_mode():
                if beam == 1:
                    out = greedy_decode(net, src, new_tokens + 1, BOS_ID, EOS_ID, src_mask=mask)
                else:
                    out = beam_search(net, src, new_tokens + 1, BOS_ID, EOS_ID, beam_size=beam, src_mask=mask)
            return out[:, 1:].tolist()
        return run

    def hugging_face(beam: int) -> list[list[int]]:
        with torch.inference_mode():
            out = hf_model.generate(input_ids=src, attention_mask=src != PAD_ID, num_beams=beam, do_sample=False,
                                    max_length=new_tokens + 1, min_length=new_tokens + 1)
        return out[:, 1:].tolist()

    def ct2(compute_type: str) -> Callable[[int], list[list[int]]]:
        translator = ctranslate2.Translator(os.fspath(ct2_dir), device="cpu", compute_type=compute_type,
                                            intra_threads=threads, inter_threads=1)

        def run(beam: int) -> list[list[int]]:
            results = translator.translate_batch(pieces, beam_size=beam, max_decoding_length=new_tokens,
                                                 max_batch_size=len(pieces))
            return [[tokenizer.token_to_id(t) for t in r.hypotheses[0]] for r in results]
        return run

    return {"ours float32": ours(model), "ours float32 packed": ours(packed), "Hugging Face": hugging_face,
            "CTranslate2 float32": ct2("float32"), "ours int8": ours(int8), "CTranslate2 int8": ct2("int8")}


def measure(runs: dict[str, Callable[[int], list[list[int]]]], beam: int, repeats: int,
            tokens: int) -> tuple[dict[str, float], dict[str, list[list[int]]]]:
    """Best tokens per second of each engine over ``repeats`` rotations, and each one's output."""
    names, best, outputs = list(runs), {name: float("inf") for name in runs}, {}
    for repeat in range(repeats):
        for name in names[repeat % len(names):] + names[:repeat % len(names)]:
            start = time.perf_counter()
            outputs[name] = runs[name](beam)
            best[name] = min(best[name], time.perf_counter() - start)
    return {name: tokens / seconds for name, seconds in best.items()}, outputs


def agreement(outputs: dict[str, list[list[int]]], new_tokens: int) -> dict[str, int]:
    """Sources whose output equals ``ours float32``'s, per engine (every output must be full length)."""
    for name, rows in outputs.items():
        lengths = {len(row) for row in rows}
        if lengths != {new_tokens}:
            raise RuntimeError(f"{name} generated {sorted(lengths)} tokens, not {new_tokens}")
    ours = outputs["ours float32"]
    return {name: sum(a == b for a, b in zip(ours, rows)) for name, rows in outputs.items() if name != "ours float32"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=32, help="sources in the batch")
    parser.add_argument("--new-tokens", type=int, default=40, help="tokens generated per source")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--size", choices=sorted(SIZES), default="opus-mt")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "generation_results.json")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    logging.getLogger("transformers").setLevel(logging.ERROR)
    import ctranslate2
    import transformers

    machine = (f"{cpu_name()} ({torch.backends.cpu.get_cpu_capability()}), {os.cpu_count()} cores, torch "
               f"{torch.__version__}, transformers {transformers.__version__}, ctranslate2 {ctranslate2.__version__}")
    print(machine)
    with tempfile.TemporaryDirectory() as folder:
        start = time.perf_counter()
        model, hf_model, tokenizer, ct2_dir = build_engines(SIZES[args.size], Path(folder), args.seed)
        print(f"{args.size} size, random weights: built and converted in {time.perf_counter() - start:.0f} s")
        src = sources(args.batch, SIZES[args.size]["vocab"], 12, 37, args.seed)
        results = []
        for threads in args.threads:
            torch.set_num_threads(threads)
            runs = engines(model, hf_model, tokenizer, ct2_dir, src, args.new_tokens, threads)
            for beam in (1, 4):
                mode = "greedy" if beam == 1 else f"beam {beam}"
                speed, outputs = measure(runs, beam, args.repeats, args.batch * args.new_tokens)
                same = agreement(outputs, args.new_tokens)
                rows = args.batch * beam  # the decoder's rows at every step (no source ends early)
                timings = time_products(SIZES[args.size], rows, args.repeats)
                peak = {kind: step_flop(SIZES[args.size], rows) / rows * ceiling(SIZES[args.size], rows, timings, kind)
                        for kind in KINDS}  # GFLOP/s of the step's products alone
                # tokens are counted per source, and a step writes one for each: steps/s = tokens/s / batch
                achieved = {name: value / args.batch * step_flop(SIZES[args.size], rows) for name, value in speed.items()}
                best_float = max(peak[kind] for kind in KINDS if kind != "int8")
                results.append({"threads": threads, "mode": mode, "tokens_per_second": speed, "same_as_ours": same,
                                "step_products_gflop_per_s": {kind: value / 1e9 for kind, value in peak.items()},
                                "achieved_gflop_per_s": {name: value / 1e9 for name, value in achieved.items()}})
                print(f"\n{threads} thread(s), {mode}: tokens/s (best of {args.repeats}), sources identical to ours "
                      f"float32, the step's products in GFLOP/s and their share of the products alone")
                for name, value in speed.items():
                    agree = f"{same[name]}/{args.batch}" if name in same else "-"
                    limit = peak["int8"] if "int8" in name else best_float
                    print(f"  {name:<20} {value:8.0f}   {agree:>5}   {achieved[name] / 1e9:6.1f} GFLOP/s "
                          f"= {achieved[name] / limit:4.0%} of {limit / 1e9:.1f}")
                print("  the step's products alone, GFLOP/s: " + ", ".join(f"{kind} {peak[kind] / 1e9:.1f}" for kind in KINDS))
    print("\ntargets (issue 35), ours / reference in tokens per second:")
    met = []
    for row in results:
        for (mode, ours, reference), target in TARGETS.items():
            if row["mode"] == mode:
                ratio = row["tokens_per_second"][ours] / row["tokens_per_second"][reference]
                met.append(ratio >= target)
                print(f"  {row['threads']} thread(s), {mode}: {ours} / {reference} = {ratio:.2f} "
                      f"(target >= {target}: {'met' if ratio >= target else 'MISSED'})")
    args.out.write_text(json.dumps({
        "machine": machine,
        "command": "python -m benchmarks.generation " + " ".join(
            f"--{k.replace('_', '-')} {' '.join(map(str, v)) if isinstance(v, list) else v}"
            for k, v in vars(args).items() if k != "out"),
        "size": {"name": args.size, **SIZES[args.size]}, "batch": args.batch, "new_tokens": args.new_tokens, "results": results,
        "targets_met": sum(met), "targets": len(met), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }, indent=1) + "\n")
    print(f"{sum(met)} of {len(met)} targets met; results in {args.out}")


if __name__ == "__main__":
    main()
