"""The paper's Table 3, in small: the number-words model of chapters/training_run.md, shortened,
trained once per variant (one change each from the base), seed and arithmetic path; read by
chapters/what_matters.md and checked by tests/test_table3.py.

The variants follow the rows of the paper's Table 3: (A) one head, and sixteen, at equal cost
(d_k = d_v = d_model / h); (B) narrower keys and queries (d_k = 8 and 4, h and d_v kept); no 1/sqrt(d_k)
scaling (section 3.2.1); (D) no label smoothing, and the paper's P_drop = 0.1 (the base has none);
(E) learned positions instead of sinusoids. Each run records the held-out perplexity (unsmoothed
cross-entropy per target token, teacher forced), the token accuracy and the exact match of greedy
decoding on test numbers the model never saw.

Each arithmetic path runs in its own child process (``ATEN_CPU_CAPABILITY`` is read when torch is
imported), one thread each, one after the other.

Usage (from the repository's root):
    OMP_NUM_THREADS=1 python -m benchmarks.table3                  # all variants, seeds 0-3, both paths
    python -m benchmarks.table3 --variants base --seeds 0 --paths default --out -   # one row, printed
"""

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch
from torch import Tensor, nn

from transformer.generation.decoding import generated_ids, greedy_decode
from transformer.nn.model import Transformer
from transformer.nn.multihead import MultiHeadAttention
from transformer.nn.positional import LearnedPositionalEncoding
from transformer.tasks.numbers import make_batch, source_vocab, split_numbers, target_vocab
from transformer.tasks.numbers_fit import evaluate_loss, training_batches
from transformer.training.config import TrainConfig, make_model, make_optimizer
from transformer.training.loop import run_settings, run_steps
from transformer.training.losses import seq2seq_loss
from transformer.training.vocab import Vocab

RESULTS = Path(__file__).with_name("table3_results.json")
PATHS = {"native": {}, "default": {"ATEN_CPU_CAPABILITY": "default"}}  # the environment of each path

# The base: chapter "Training the model"'s configuration, shortened to 120 steps (its warm-up scaled
# with it) so that a run takes seconds; every variant changes one thing.
BASE = dict(steps=120, warmup=40)
VARIANTS: dict[str, dict] = {
    "base": {},
    "h=1": dict(num_heads=1),  # (A) one head of d_k = d_v = 64
    "h=16": dict(num_heads=16),  # (A) sixteen heads of d_k = d_v = 4
    "d_k=8": dict(d_k=8),  # (B) four heads, keys and queries 8 wide, values 16
    "d_k=4": dict(d_k=4),  # (B) keys and queries 4 wide
    "no scaling": dict(scaled=False),  # softmax(Q K^T) V, section 3.2.1
    "no smoothing": dict(label_smoothing=0.0),  # (D) epsilon_ls = 0
    "P_drop=0.1": dict(dropout=0.1),  # (D) the paper's dropout; the base has none
    "learned positions": dict(positions="learned"),  # (E)
}
MODEL_OPTIONS = ("d_k", "scaled", "positions")  # the options that TrainConfig lacks
TEST_SIZE = 2_000  # test numbers scored per run


class UnscaledMultiHeadAttention(MultiHeadAttention):
    """Multi-head attention without the paper's 1/sqrt(d_k): softmax(Q K^T) V in every
    head."""

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None,
               dropout_p: float, need_weights: bool,
               query_start: int = 0) -> tuple[Tensor, Tensor | None]:
        # attention divides the scores by sqrt(d_k): multiplying q by it first undoes
        # the division (exactly, where sqrt(d_k) is a power of two, as the base's
        # d_k = 16)
        q = q * q.shape[-1] ** 0.5
        return super().attend(q, k, v, mask, dropout_p, need_weights, query_start)


def narrow_keys(attention: MultiHeadAttention, d_k: int) -> None:
    """Make ``attention``'s queries and keys d_k wide per head (W^Q, W^K:
    d_model x h d_k), values unchanged."""
    for name in ("w_q", "w_k"):
        old = getattr(attention, name)
        linear = nn.Linear(attention.d_model, attention.num_heads * d_k,
                           bias=old.bias is not None)
        nn.init.xavier_uniform_(linear.weight)  # as MultiHeadAttention.reset_parameters
        if linear.bias is not None:
            nn.init.zeros_(linear.bias)
        setattr(attention, name, linear)
    attention.d_k = d_k


def build_model(config: TrainConfig, src_vocab: Vocab, tgt_vocab: Vocab, d_k: int | None = None,
                scaled: bool = True, positions: str = "sinusoidal") -> Transformer:
    """``make_model(config, ...)`` with the options of Table 3 that ``TrainConfig`` lacks.

    The base model is built first, so that what a variant keeps starts from the base's weights.
    """
    model = make_model(config, src_vocab, tgt_vocab)
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, MultiHeadAttention) and not scaled:
                unscaled = UnscaledMultiHeadAttention(child.d_model, child.num_heads, child.dropout,
                                                      bias=child.w_q.bias is not None)
                unscaled.load_state_dict(child.state_dict())  # the same weights; only attend differs
                setattr(parent, name, child := unscaled)
            if isinstance(child, MultiHeadAttention) and d_k is not None:
                narrow_keys(child, d_k)
    if positions == "learned":
        model.positional_encoding = LearnedPositionalEncoding(config.d_model, config.max_len, config.dropout)
    elif positions != "sinusoidal":
        raise ValueError(f"positions must be 'sinusoidal' or 'learned', got {positions!r}")
    return model


def variant_config(variant: str, seed: int) -> tuple[TrainConfig, dict]:
    """The ``TrainConfig`` of a variant's run, and the options of ``build_model`` it needs besides."""
    options = VARIANTS[variant]
    config = TrainConfig(**BASE, seed=seed, **{k: v for k, v in options.items() if k not in MODEL_OPTIONS})
    return config, {k: v for k, v in options.items() if k in MODEL_OPTIONS}


def run(variant: str, seed: int) -> dict:
    """Train one variant with one seed on this process's arithmetic path; its row of the table."""
    config, options = variant_config(variant, seed)
    src_vocab, tgt_vocab = source_vocab(), target_vocab()
    train_numbers, _, test_numbers = split_numbers(200_000, 1_000, 5_000, seed=0)  # the training_run chapter's split
    test_numbers = test_numbers[:TEST_SIZE]
    start = time.process_time()
    with run_settings(config.seed, config.num_threads):
        model = build_model(config, src_vocab, tgt_vocab, **options)
        optimizer, scheduler = make_optimizer(config, model)
        stream = training_batches(train_numbers, config.batch_size, src_vocab, tgt_vocab, config.seed)
        history: dict[str, list] = {}
        run_steps(model.train(), stream, optimizer, scheduler, seq2seq_loss(config.label_smoothing, tgt_vocab.pad_id),
                  config.steps, history, clip=config.clip)
    train_seconds = time.process_time() - start
    model.eval()
    batch = make_batch(test_numbers, src_vocab, tgt_vocab)
    with torch.no_grad():
        logits = model(batch.src, batch.tgt_in, batch.src_mask, batch.tgt_mask)  # (B, T, V)
        real = batch.tgt_out != tgt_vocab.pad_id  # (B, T)
        token_accuracy = (logits.argmax(dim=-1) == batch.tgt_out)[real].float().mean().item()
        # greedy decoding without the cache: narrower keys than values are outside the cache's shapes
        tokens = greedy_decode(model, batch.src, 10, tgt_vocab.bos_id, tgt_vocab.eos_id, src_mask=batch.src_mask,
                               use_cache=False)
    answers = ["".join(tgt_vocab.itos[i] for i in row) for row in generated_ids(tokens, tgt_vocab.eos_id)]
    nll = evaluate_loss(model, test_numbers, src_vocab, tgt_vocab, label_smoothing=0.0)  # nats per target token
    return {"variant": variant, "seed": seed, "path": os.environ.get("TABLE3_PATH", "native"),
            "capability": torch.backends.cpu.get_cpu_capability(), "steps": config.steps,
            "parameters": sum(p.numel() for p in model.parameters()),
            "train_loss": sum(history["loss"][-10:]) / 10, "test_nll": nll,
            "test_perplexity": float(torch.tensor(nll).exp()),
            "token_accuracy": token_accuracy,
            "exact_match": sum(a == str(n) for a, n in zip(answers, test_numbers)) / len(test_numbers),
            "test_numbers": len(test_numbers), "train_cpu_seconds": round(train_seconds, 2)}


def run_path(path: str, variants: list[str], seeds: list[int]) -> list[dict]:
    """Every (variant, seed) on one arithmetic path, in a child process; its rows."""
    env = {**os.environ, **PATHS[path], "TABLE3_PATH": path, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "benchmarks.table3", "--worker", "--variants", *variants,
               "--seeds", *map(str, seeds)]
    done = subprocess.run(command, env=env, check=True, capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parent.parent)
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def machine() -> dict:
    """Where the rows were measured."""
    names = [line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
             if line.startswith("model name")] if Path("/proc/cpuinfo").exists() else []
    return {"platform": platform.platform(), "cpu": names[0] if names else platform.processor() or platform.machine(),
            "cores": os.cpu_count(), "torch": torch.__version__}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3])
    parser.add_argument("--paths", nargs="+", default=list(PATHS), choices=list(PATHS))
    parser.add_argument("--out", default=str(RESULTS), help="the JSON file to write ('-': print the rows)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)  # one path, rows on stdout
    args = parser.parse_args(argv)
    if args.worker:
        for seed in args.seeds:
            for variant in args.variants:
                print(json.dumps(run(variant, seed)), flush=True)
        return 0
    wall = time.perf_counter()
    rows = [row for path in args.paths for row in run_path(path, args.variants, args.seeds)]
    if args.out == "-":
        print(json.dumps(rows, indent=1))
        return 0
    record = {"command": " ".join(["OMP_NUM_THREADS=1 python -m benchmarks.table3", *(argv or sys.argv[1:])]),
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": machine(),
              "wall_seconds": round(time.perf_counter() - wall, 1), "base": BASE, "test_numbers": TEST_SIZE,
              "variants": {name: VARIANTS[name] for name in args.variants}, "rows": rows}
    Path(args.out).write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    print(f"{len(rows)} rows in {record['wall_seconds']} s -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
