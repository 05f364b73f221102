"""Pre-train the masked language model of chapters/pretraining.md longer than the book's build allows.

Reads the three ``-1`` folders of the SpamAssassin corpus (``transformer.tasks.email``), learns the
BPE tokenizer on the training emails, pre-trains a ``MaskedLanguageModel`` on their 64-token windows
and writes, under ``--out`` (default ``models/spam-mlm``): ``model.pt`` (float32 weights and
settings), ``tokenizer.json`` and ``results.json`` (the held-out masked-token accuracy, the unigram
baseline's, the time and the machine). ``tests/test_masked_lm.py`` reloads them and reproduces the
accuracy.

Usage (from the repository's root):
    python -m benchmarks.pretrain_spam --steps 2000 --out models/spam-mlm
"""

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import torch

from transformer.tasks.email import read_emails, split_emails
from transformer.tasks.masked_lm import (IGNORE, MASK_TOKEN, MaskedLanguageModel, email_tokenizer, mask_tokens,
                                         mlm_accuracy, token_windows, train_mlm)
from transformer.training.checkpoint import save_checkpoint

FIRST_ID = 4  # after <pad>, <bos>, <eos>, <unk>


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.pretrain_spam", description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--d-model", type=int, default=64)
    parser.add_argument("--num-layers", type=int, default=2)
    parser.add_argument("--length", type=int, default=64, help="tokens per pre-training window")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("models/spam-mlm"))
    args = parser.parse_args(argv)
    splits = split_emails(read_emails())
    texts = {name: [mail.text for mail in part] for name, part in splits.items()}
    tokenizer = email_tokenizer(texts["train"])
    mask_id, vocab_size = tokenizer.token_to_id(MASK_TOKEN), tokenizer.get_vocab_size()
    windows = {name: token_windows(part, tokenizer, args.length) for name, part in texts.items()}
    torch.manual_seed(args.seed)
    model = MaskedLanguageModel(vocab_size, d_model=args.d_model, num_heads=4, d_ff=4 * args.d_model,
                                num_layers=args.num_layers, dropout=0.0, max_len=args.length)
    start = time.perf_counter()
    history = train_mlm(model, windows["train"], mask_id, FIRST_ID, steps=args.steps, batch_size=args.batch_size,
                        lr=args.lr, seed=args.seed, num_threads=args.threads, progress=True)
    seconds = time.perf_counter() - start
    counts = torch.bincount(windows["train"][windows["train"] != 0], minlength=vocab_size)
    unigram = int(counts.argmax())
    _, targets = mask_tokens(windows["valid"], mask_id, FIRST_ID, vocab_size, generator=torch.Generator().manual_seed(0))
    results = {
        "valid_mlm_accuracy": mlm_accuracy(model, windows["valid"], mask_id, FIRST_ID),
        "valid_unigram_accuracy": (targets[targets != IGNORE] == unigram).float().mean().item(),
        "unigram_token": tokenizer.id_to_token(unigram),
        "final_train_loss": sum(history["loss"][-50:]) / 50,
        "windows": {name: len(part) for name, part in windows.items()},
        "train_seconds": round(seconds, 1),
        "settings": model.settings, "length": args.length, "steps": args.steps, "batch_size": args.batch_size, "lr": args.lr,
        "seed": args.seed, "threads": args.threads,
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPU cores (shared), "
                   f"torch {torch.__version__}",
        "command": "python -m benchmarks.pretrain_spam " + " ".join(sys.argv[1:] if argv is None else argv),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    save_checkpoint(args.out / "model.pt", model, None, None, args.steps, history, config=model.settings,
                    kind="masked_lm")
    tokenizer.save(str(args.out / "tokenizer.json"))
    (args.out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
