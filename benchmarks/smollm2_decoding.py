"""SmolLM2-135M-Instruct writing at engine speed: the book's cached decoding against transformers'
``LlamaForCausalLM.generate`` and CTranslate2 (float32), on the same weights (issue 45, item 4).

One GGUF file, three engines: the book's ``LlamaLM`` (``load_smollm2``), transformers' Llama read from
the same file by transformers' own GGUF loader, and a CTranslate2 ``Generator`` converted from that
transformers model (saved to a temporary folder, then ``TransformersConverter``). The prompts are
windows of ``--prompt-tokens`` tokens of the held-out tenth of the book's Shakespeare, one per row of
the batch (different rows, the same length: no padding), each continued greedily by ``--new-tokens``
tokens; no engine stops at the end-of-text token, so every run writes the same number of tokens.
``ours`` is ``LlamaLM`` as ``load_smollm2`` builds it, its linear layers packed for oneDNN
(``PackedLinear``, ``llama_from_gguf``'s default); ``ours unpacked`` is the same model with plain ``nn.Linear`` layers.

For each batch size and number of threads the engines run alternately (the order rotates on every
repeat, so a change of load on the shared machine hits all of them) and the best of ``--repeats`` is
kept: tokens per second are new tokens (batch x new tokens) over the whole call, prompt included. The
script asserts that transformers writes exactly our tokens, counts the rows where the others do, prints
the ratios of the issue's targets (ours >= 1.5x ``generate``, >= 1.0x CTranslate2 float32) and, with
``--profile``, at batch 1 on one thread: torch.profiler's top operators of our decoding, and each
engine's milliseconds per token split into the matrix products and the rest, beside the floor that
reading every weight once sets (the weights' bytes over a bandwidth measured on this machine). Each
row records the load average of the machine (1 minute) after it ran: the machine is shared.

    nice .venv/bin/python -m benchmarks.smollm2_decoding                 # about 5 minutes on 2 cores
    nice .venv/bin/python -m benchmarks.smollm2_decoding --batch 1 --threads 1 --repeats 1

The results go to ``benchmarks/smollm2_decoding_results.json`` (``--out``). It is a benchmark, not a
test: nothing fails when a target is missed; the script says so.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
import json
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from benchmarks.machine import cpu_name

ROOT = Path(__file__).resolve().parent.parent
TARGETS = {("ours", "Hugging Face"): 1.5, ("ours", "CTranslate2 float32"): 1.0}  # least ratios (issue 45)


def prompts(tokenizer, batch: int, length: int) -> torch.Tensor:
    """``(batch, length)`` token ids: windows of the held-out tenth of the book's Shakespeare (the split of
    chapters/decoder_only.md), evenly spaced through it."""
    from transformer.paths import data_file

    text = data_file("shakespeare.txt").read_text(encoding="utf-8")
    ids = tokenizer.encode(text[int(0.9 * len(text)):]).ids
    step = (len(ids) - length) // batch
    return torch.tensor([ids[i * step:i * step + length] for i in range(batch)])  # (batch, length)


def load_engines(folder: Path, threads: list[int]):
    """(ours, ours unpacked, transformers' model, {threads: CTranslate2 generator}, tokenizer)."""
    import ctranslate2
    import transformers
    from ctranslate2.converters import TransformersConverter

    from transformer.generation.packed import PackedLinear
    from transformer.interop.gguf import load_smollm2, smollm2_path

    model, tokenizer = load_smollm2()
    unpacked = copy.deepcopy(model)  # the same weights through nn.Linear's F.linear
    for module in unpacked.modules():
        if type(module) is PackedLinear:
            module.__class__ = torch.nn.Linear
    path = smollm2_path()
    with contextlib.redirect_stderr(io.StringIO()):  # the progress bars of transformers' GGUF reader
        reference = transformers.LlamaForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                                  dtype=torch.float32).eval()
        hf_tokenizer = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    reference.generation_config.eos_token_id = None  # write every token asked for, as the others do
    reference.generation_config.pad_token_id = tokenizer.token_to_id("<|im_end|>")
    # transformers will not save a model read from GGUF; a plain copy of it (float32) it will, for the converter
    config = reference.config
    config.__dict__.pop("quantization_config", None)
    plain = transformers.LlamaForCausalLM(config)
    plain.load_state_dict(reference.state_dict())
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        plain.save_pretrained(folder / "hf")
        hf_tokenizer.save_pretrained(folder / "hf")
        TransformersConverter(os.fspath(folder / "hf")).convert(os.fspath(folder / "ct2"), force=True)
    del plain
    generators = {n: ctranslate2.Generator(os.fspath(folder / "ct2"), device="cpu", compute_type="float32",
                                           intra_threads=n, inter_threads=1) for n in threads}
    return model, unpacked, reference, generators, tokenizer


def engines(model, unpacked, reference, generator, tokenizer, new_tokens: int) -> dict[str, Callable]:
    """name -> run(prompt (B, P)) returning the new token ids of each row, ``new_tokens`` of them."""
    from transformer.generation.sampling import sample

    def ours(net) -> Callable:
        def run(prompt: torch.Tensor) -> list[list[int]]:
            with torch.inference_mode():
                return sample(net, prompt, new_tokens, top_k=1)[:, prompt.shape[1]:].tolist()  # top_k=1: greedy
        return run

    def hugging_face(prompt: torch.Tensor) -> list[list[int]]:
        with torch.inference_mode():
            out = reference.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new_tokens,
                                     do_sample=False)
        return out[:, prompt.shape[1]:].tolist()

    def ctranslate(prompt: torch.Tensor) -> list[list[int]]:
        pieces = [[tokenizer.id_to_token(int(i)) for i in row] for row in prompt]
        results = generator.generate_batch(pieces, max_length=new_tokens, min_length=new_tokens, sampling_topk=1,
                                           include_prompt_in_result=False, max_batch_size=len(pieces))
        return [r.sequences_ids[0] for r in results]

    return {"ours": ours(model), "ours unpacked": ours(unpacked), "Hugging Face": hugging_face,
            "CTranslate2 float32": ctranslate}


def measure(runs: dict[str, Callable], prompt: torch.Tensor, repeats: int,
            tokens: int) -> tuple[dict[str, float], dict[str, list[list[int]]]]:
    """Best tokens per second of each engine over ``repeats`` rotations, and each one's output."""
    names, best, outputs = list(runs), {name: float("inf") for name in runs}, {}
    for repeat in range(repeats):
        for name in names[repeat % len(names):] + names[:repeat % len(names)]:
            start = time.perf_counter()
            outputs[name] = runs[name](prompt)
            best[name] = min(best[name], time.perf_counter() - start)
    return {name: tokens / seconds for name, seconds in best.items()}, outputs


#: torch's matrix products, and oneDNN's on packed weights: the self CPU time of these is "the products"
PRODUCT_OPS = ("aten::mm", "aten::addmm", "aten::mv", "mkldnn::_linear_pointwise")


def products_ms(run: Callable, prompt: torch.Tensor) -> tuple[float, int]:
    """Milliseconds ``run(prompt)`` spends in the matrix products (torch.profiler's self CPU time of
    ``PRODUCT_OPS``), and the operators it calls (torch.profiler's count, nested ones included)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as profiler

    with profiler(activities=[ProfilerActivity.CPU]) as prof:
        run(prompt)
    events = prof.key_averages()
    return (sum(e.self_cpu_time_total for e in events if e.key in PRODUCT_OPS) / 1e3,
            sum(e.count for e in events))


def weight_floor(model, repeats: int = 5) -> dict:
    """What reading the weights costs: the bytes of ``model``'s parameters (each once: the tied
    embedding is the output layer), the bandwidth of this machine on the current thread count, measured
    two ways (one row through every weight matrix, ``F.linear`` as a decoding step has it, and a copy of
    256 MB, read and written), and the least milliseconds per token that reading every weight once
    takes at the products' bandwidth: the floor of a step at batch 1, whatever the engine."""
    matrices = [p.detach() for p in model.parameters() if p.dim() == 2]
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    matrix_bytes = sum(w.numel() * w.element_size() for w in matrices)
    rows = [torch.randn(1, w.shape[1]) for w in matrices]  # one row per matrix, (1, in)

    def best(step: Callable) -> float:
        seconds = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            step()
            seconds = min(seconds, time.perf_counter() - start)
        return seconds

    with torch.inference_mode():
        # (1, in) @ W^T -> (1, out), every matrix once: the weights streamed from memory
        products = best(lambda: [torch.nn.functional.linear(x, w) for x, w in zip(rows, matrices)])
        source = torch.randn(64 * 2**20)  # 256 MB
        target = torch.empty_like(source)
        copy = best(lambda: target.copy_(source))
    bandwidth = matrix_bytes / products
    return {"weight_mb": weight_bytes / 1e6, "products_gb_per_s": bandwidth / 1e9,
            "copy_gb_per_s": 2 * source.numel() * source.element_size() / copy / 1e9,
            "floor_ms_per_token": 1e3 * weight_bytes / bandwidth}


def breakdown(runs: dict[str, Callable], prompt: torch.Tensor, new_tokens: int, repeats: int) -> dict:
    """Milliseconds per new token of each engine on ``prompt`` (batch 1, the thread count set; the
    prompt's pass included, as in the tokens per second): in all (best of ``repeats``, the engines
    taking turns), and for the engines torch.profiler sees (not CTranslate2), in the matrix products and
    in the rest of the step, and the operators called per token."""
    total = {name: float("inf") for name in runs}
    for repeat in range(repeats):
        for name in list(runs)[repeat % len(runs):] + list(runs)[:repeat % len(runs)]:
            start = time.perf_counter()
            runs[name](prompt)
            total[name] = min(total[name], 1e3 * (time.perf_counter() - start) / new_tokens)
    rows = {}
    for name, ms in total.items():
        rows[name] = {"total_ms": ms}
        if name != "CTranslate2 float32":
            product, calls = products_ms(runs[name], prompt)
            rows[name] |= {"products_ms": product / new_tokens, "rest_ms": ms - product / new_tokens,
                           "operators": calls / new_tokens}
    return rows


def profile(model, prompt: torch.Tensor, new_tokens: int, top: int = 8) -> list[dict]:
    """torch.profiler's ``top`` operators by self CPU time in our greedy decoding of ``prompt``."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as profiler

    from transformer.generation.sampling import sample

    with profiler(activities=[ProfilerActivity.CPU]) as prof, torch.inference_mode():
        sample(model, prompt, new_tokens, top_k=1)
    events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total = sum(e.self_cpu_time_total for e in events)
    return [{"op": e.key, "calls": e.count, "self_ms": e.self_cpu_time_total / 1e3,
             "share": e.self_cpu_time_total / total} for e in events[:top]]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8], help="prompts decoded together")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--profile", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "smollm2_decoding_results.json")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import ctranslate2
    import transformers

    transformers.logging.set_verbosity_error()
    machine = (f"{cpu_name()} ({torch.backends.cpu.get_cpu_capability()}), {os.cpu_count()} cores, torch "
               f"{torch.__version__}, transformers {transformers.__version__}, ctranslate2 {ctranslate2.__version__}")
    print(machine, flush=True)
    results, profiled = [], []
    with tempfile.TemporaryDirectory() as folder:
        start = time.perf_counter()
        model, unpacked, reference, generators, tokenizer = load_engines(Path(folder), args.threads)
        print(f"three engines from one GGUF file in {time.perf_counter() - start:.0f} s", flush=True)
        for threads in args.threads:
            torch.set_num_threads(threads)
            runs = engines(model, unpacked, reference, generators[threads], tokenizer, args.new_tokens)
            for batch in args.batch:
                prompt = prompts(tokenizer, batch, args.prompt_tokens)  # (batch, P)
                speed, outputs = measure(runs, prompt, args.repeats, batch * args.new_tokens)
                for name, rows in outputs.items():
                    if {len(row) for row in rows} != {args.new_tokens}:
                        raise RuntimeError(f"{name} wrote {sorted({len(row) for row in rows})} tokens, "
                                           f"not {args.new_tokens}")
                if outputs["Hugging Face"] != outputs["ours"]:
                    raise AssertionError(f"{threads} thread(s), batch {batch}: transformers' greedy tokens "
                                         "differ from ours")
                same = {name: sum(a == b for a, b in zip(outputs["ours"], rows))
                        for name, rows in outputs.items() if name != "ours"}
                results.append({"threads": threads, "batch": batch, "tokens_per_second": speed,
                                "rows_identical_to_ours": same, "load_average": os.getloadavg()[0]})
                print(f"\n{threads} thread(s), batch {batch}: tokens/s (best of {args.repeats}), rows identical "
                      "to ours", flush=True)
                for name, value in speed.items():
                    print(f"  {name:<20} {value:7.1f}   {same.get(name, batch)}/{batch}", flush=True)
    print("\ntargets (issue 45), tokens per second, measured in this run:")
    met = []
    for row in results:
        for (ours, reference_name), target in TARGETS.items():
            ratio = row["tokens_per_second"][ours] / row["tokens_per_second"][reference_name]
            met.append(ratio >= target)
            print(f"  {row['threads']} thread(s), batch {row['batch']}: {ours} / {reference_name} = {ratio:.2f} "
                  f"(target >= {target}: {'met' if ratio >= target else 'MISSED'})")
    per_token: dict = {}
    if args.profile and 1 in args.threads:
        torch.set_num_threads(1)
        prompt = prompts(tokenizer, 1, args.prompt_tokens)  # (1, P)
        profiled = profile(model, prompt, args.new_tokens)
        print("\nour decoding, batch 1, 1 thread: torch.profiler's top operators by self CPU time")
        for row in profiled:
            print(f"  {row['op']:<28} {row['calls']:6d} calls {row['self_ms']:8.0f} ms  {row['share']:5.1%}")
        per_token = weight_floor(model)
        per_token["engines"] = breakdown(engines(model, unpacked, reference, generators[1], tokenizer,
                                                 args.new_tokens), prompt, args.new_tokens, args.repeats)
        print(f"\nbatch 1, 1 thread, per new token: {per_token['weight_mb']:.0f} MB of weights read at "
              f"{per_token['products_gb_per_s']:.1f} GB/s (one row through every matrix; a copy: "
              f"{per_token['copy_gb_per_s']:.1f} GB/s): a floor of {per_token['floor_ms_per_token']:.1f} ms")
        for name, row in per_token["engines"].items():
            split = (f" = products {row['products_ms']:6.1f} + the rest {row['rest_ms']:6.1f}"
                     if "products_ms" in row else "")
            print(f"  {name:<20} {row['total_ms']:6.1f} ms{split}, "
                  f"{row['total_ms'] / per_token['floor_ms_per_token']:.2f} x the floor")
    args.out.write_text(json.dumps({
        "machine": machine,
        "command": "nice python -m benchmarks.smollm2_decoding " + " ".join(
            f"--{k.replace('_', '-')} {' '.join(map(str, v)) if isinstance(v, list) else v}"
            for k, v in vars(args).items() if k not in ("out", "profile")) + ("" if args.profile else " --no-profile"),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "prompt_tokens": args.prompt_tokens, "new_tokens": args.new_tokens, "results": results,
        "targets": [{"ours": o, "reference": r, "least_ratio": t} for (o, r), t in TARGETS.items()],
        "targets_met": sum(met), "targets_tried": len(met), "profile": profiled, "per_token": per_token,
    }, indent=1) + "\n")
    print(f"\n{sum(met)} of {len(met)} targets met; results in {args.out}")


if __name__ == "__main__":
    main()
