"""Pre-train the masked language model of chapters/pretraining.md longer than the book's build allows.

Reads the three ``-1`` folders of the SpamAssassin corpus (``transformer.tasks.email``), learns the
BPE tokenizer on the training emails, pre-trains a ``MaskedLanguageModel`` on their 64-token windows
and writes, under ``--out`` (default ``models/spam-mlm``): ``model.pt`` (float32 weights and
settings), ``tokenizer.json`` and ``results.json`` (the held-out masked-token accuracy, the unigram
baseline's, the time and the machine). ``tests/test_masked_lm.py`` reloads them and reproduces the
accuracy.

With ``--captions``, Multi30k's English training captions (``caption_texts``, 8 to a text) join the
training emails, for the tokenizer and the windows; their held-out figures come from Multi30k's
validation captions, never its test files, and are reported apart from the emails'. With
``--eval-every N`` the held-out accuracy of each source is measured every N steps (the learning
curve, ``results.json``'s "curve", with the CPU time and the date); ``--checkpoint PATH`` saves the
run there every N steps, so that a crash loses little.

Usage (from the repository's root):
    python -m benchmarks.pretrain_spam --steps 2000 --out models/spam-mlm
    python -m benchmarks.pretrain_spam --steps 26000 --batch-size 32 --d-model 128 --warmup 1000 \
        --captions --eval-every 1000 --out models/text-mlm
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
from transformer.tasks.masked_lm import (MASK_TOKEN, MaskedLanguageModel, caption_texts, email_tokenizer, mlm_accuracy,
                                         token_windows, train_mlm, unigram_entropy, unigram_guess)
from transformer.training.checkpoint import SaveCheckpoint, save_checkpoint
from transformer.training.loop import Callback, Evaluate

FIRST_ID = 4  # after <pad>, <bos>, <eos>, <unk>


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.pretrain_spam", description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--warmup", type=int, default=100, help="warm-up steps; the 1/sqrt decay starts after them")
    parser.add_argument("--d-model", type=int, default=64)
    parser.add_argument("--num-layers", type=int, default=2)
    parser.add_argument("--length", type=int, default=64, help="tokens per pre-training window")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--captions", action="store_true", help="add Multi30k's English training captions")
    parser.add_argument("--eval-every", type=int, default=0, help="steps between held-out measurements (0: none)")
    parser.add_argument("--checkpoint", type=Path, default=None, help="save the run here every --eval-every steps")
    parser.add_argument("--out", type=Path, default=Path("models/spam-mlm"))
    args = parser.parse_args(argv)
    if args.checkpoint is not None and args.eval_every <= 0:
        parser.error("--checkpoint needs --eval-every N, N > 0")
    clock = time.process_time()
    splits = split_emails(read_emails())
    texts = {name: [mail.text for mail in part] for name, part in splits.items()}
    captions = {"train": caption_texts("train"), "valid": caption_texts("val")} if args.captions else {}
    tokenizer = email_tokenizer(texts["train"] + captions.get("train", []))
    mask_id, vocab_size = tokenizer.token_to_id(MASK_TOKEN), tokenizer.get_vocab_size()
    windows = {name: token_windows(part, tokenizer, args.length) for name, part in texts.items()}
    caption_windows = {name: token_windows(part, tokenizer, args.length) for name, part in captions.items()}
    train_windows = torch.cat([windows["train"], caption_windows["train"]]) if captions else windows["train"]
    held_out = {"emails": windows["valid"], **({"captions": caption_windows["valid"]} if captions else {})}
    torch.manual_seed(args.seed)
    model = MaskedLanguageModel(vocab_size, d_model=args.d_model, num_heads=4, d_ff=4 * args.d_model,
                                num_layers=args.num_layers, dropout=0.0, max_len=args.length)
    curve: dict[str, list] = {"step": [], **{f"valid_{name}": [] for name in held_out}}

    def measure(step: int) -> dict[str, str]:
        curve["step"].append(step)
        for name, part in held_out.items():
            curve[f"valid_{name}"].append(mlm_accuracy(model, part, mask_id, FIRST_ID))
        model.train()  # mlm_accuracy leaves it as it found it; training goes on
        return {name: f"{curve[f'valid_{name}'][-1]:.3f}" for name in held_out}

    callbacks: list[Callback] = [Evaluate(measure, args.eval_every)] if args.eval_every > 0 else []
    if args.checkpoint is not None:
        callbacks.append(SaveCheckpoint(args.checkpoint, args.eval_every))
    start = time.perf_counter()
    history = train_mlm(model, train_windows, mask_id, FIRST_ID, steps=args.steps, batch_size=args.batch_size,
                        lr=args.lr, warmup=args.warmup, seed=args.seed, num_threads=args.threads, progress=True, callbacks=callbacks)
    seconds = time.perf_counter() - start
    unigram, unigram_accuracy = unigram_guess(windows["train"], windows["valid"], mask_id, FIRST_ID, vocab_size)
    results = {
        "valid_mlm_accuracy": mlm_accuracy(model, windows["valid"], mask_id, FIRST_ID),
        "valid_unigram_accuracy": unigram_accuracy,
        "unigram_token": tokenizer.id_to_token(unigram),
        "final_train_loss": sum(history["loss"][-50:]) / 50,
        "windows": {name: len(part) for name, part in windows.items()},
        "train_seconds": round(seconds, 1),
        "settings": model.settings, "length": args.length, "steps": args.steps, "batch_size": args.batch_size, "lr": args.lr,
        "warmup": args.warmup, "seed": args.seed, "threads": args.threads,
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPU cores (shared), "
                   f"torch {torch.__version__}",
        "command": "python -m benchmarks.pretrain_spam " + " ".join(sys.argv[1:] if argv is None else argv),
    }
    if captions:
        results["valid_caption_accuracy"] = mlm_accuracy(model, caption_windows["valid"], mask_id, FIRST_ID)
        caption_unigram, results["valid_caption_unigram_accuracy"] = unigram_guess(
            caption_windows["train"], caption_windows["valid"], mask_id, FIRST_ID, vocab_size)
        results["caption_unigram_token"] = tokenizer.id_to_token(caption_unigram)
        results["caption_windows"] = {name: len(part) for name, part in caption_windows.items()}
    if args.eval_every > 0:
        # the mean training loss over each stretch of --eval-every steps, beside the held-out accuracies
        results["curve"] = {**curve, "train_loss": [
            sum(history["loss"][max(0, step - args.eval_every):step]) / (step - max(0, step - args.eval_every))
            for step in curve["step"]]}
        results["unigram_nats"] = unigram_entropy(train_windows, vocab_size)
        results["cpu_seconds"] = round(time.process_time() - clock, 1)
        results["date"] = time.strftime("%Y-%m-%d", time.gmtime())
    args.out.mkdir(parents=True, exist_ok=True)
    save_checkpoint(args.out / "model.pt", model, None, None, args.steps, history, config=model.settings,
                    kind="masked_lm")
    tokenizer.save(str(args.out / "tokenizer.json"))
    (args.out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
