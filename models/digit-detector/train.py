"""Train the committed digit detector (chapters/detection.md). From the repository's root:

    OMP_NUM_THREADS=1 .venv/bin/python models/digit-detector/train.py --steps 10000 --out models/digit-detector

Saves the run's state in DIR/checkpoint.pt every 1,000 steps: the same command after a kill resumes
there, losing at most 1,000 steps. At the end writes DIR/model.pt (the settings and float32 weights)
and removes the checkpoint. Bad arguments, or a checkpoint of another recipe in DIR, exit with status 2
and one line.
"""

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch

from transformer.nn.detector import DigitDetector
from transformer.tasks.detection import make_digit_scenes, train_detector
from transformer.tasks.digits import load_digits, stratified_split
from transformer.training.checkpoint import save_checkpoint

SETTINGS = dict(image_size=32, patch_size=4, num_classes=10, num_queries=8, d_model=64, num_heads=4, d_ff=128,
                encoder_layers=2, decoder_layers=2, dropout=0.0)
SAVE_EVERY = 1000


def fail(message: str) -> None:
    """One line on stderr and exit status 2, as the book's commands do for bad input."""
    print(f"train.py: {message}", file=sys.stderr)
    sys.exit(2)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10000)
    parser.add_argument("--scenes", type=int, default=20000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("models/digit-detector"))
    args = parser.parse_args()
    for name in ("steps", "scenes"):
        if getattr(args, name) < 1:
            fail(f"--{name} must be a positive number, got {getattr(args, name)}")
    if args.out.exists() and not args.out.is_dir():
        fail(f"--out must be a folder, got the file {args.out}")
    args.out.mkdir(parents=True, exist_ok=True)
    checkpoint = args.out / "checkpoint.pt"
    images, labels = load_digits()
    train_index, _ = stratified_split(labels)  # the split of chapters/images.md: training digits only
    scenes = make_digit_scenes(images[train_index], labels[train_index], args.scenes, seed=1)
    start = time.perf_counter()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(args.seed)
        model = DigitDetector(**SETTINGS)
    if checkpoint.is_file():
        print(json.dumps({"resuming from": str(checkpoint)}), flush=True)
    try:
        history = train_detector(model, scenes, args.steps, batch_size=32, lr=1e-3, warmup=200, seed=args.seed,
                                 checkpoint=checkpoint, save_every=SAVE_EVERY)
    except ValueError as error:  # a checkpoint of another recipe in --out
        fail(str(error))
    took = time.perf_counter() - start
    save_checkpoint(args.out / "model.pt", model, None, None, args.steps, history, config=SETTINGS, kind="detector",
                    extra={"seconds": took, "command": vars(args) | {"out": str(args.out)},
                           "machine": f"{platform.processor() or platform.machine()}, torch {torch.__version__}"})
    checkpoint.unlink(missing_ok=True)
    print(json.dumps({"step": args.steps, "seconds (this process)": round(took),
                      "mean loss of the last 100 steps": sum(history["loss"][-100:]) / 100}), flush=True)


if __name__ == "__main__":
    main()
