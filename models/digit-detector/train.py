"""Train the committed digit detector (chapters/32_detection.md). From the repository's root:

    OMP_NUM_THREADS=1 .venv/bin/python models/digit-detector/train.py --steps 10000 --out models/digit-detector

Writes model.pt (the weights, float32, with the settings) every 1,000 steps and at the end, and
train.log's lines on stdout.
"""

import argparse
import json
import platform
import time
from pathlib import Path

import torch

from transformer.files import save_torch_file
from transformer.nn.detector import DigitDetector
from transformer.tasks.detection import make_digit_scenes, train_detector
from transformer.tasks.digits import load_digits, stratified_split

SETTINGS = dict(image_size=32, patch_size=4, num_classes=10, num_queries=8, d_model=64, num_heads=4, d_ff=128,
                encoder_layers=2, decoder_layers=2, dropout=0.0)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10000)
    parser.add_argument("--scenes", type=int, default=20000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("models/digit-detector"))
    args = parser.parse_args()
    images, labels = load_digits()
    train_index, _ = stratified_split(labels)  # the split of chapters/29_images.md: training digits only
    scenes = make_digit_scenes(images[train_index], labels[train_index], args.scenes, seed=1)
    start = time.perf_counter()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(args.seed)
        model = DigitDetector(**SETTINGS)

    def save(step: int) -> None:
        took = time.perf_counter() - start
        save_torch_file({"settings": SETTINGS, "state_dict": model.state_dict(), "step": step,
                         "seconds": took, "command": vars(args) | {"out": str(args.out)},
                         "machine": f"{platform.processor() or platform.machine()}, torch {torch.__version__}"},
                        args.out / "model.pt")
        print(json.dumps({"step": step, "seconds": round(took), "loss": history_ref[0]}), flush=True)

    history_ref = [None]
    history = train_detector(model, scenes, args.steps, batch_size=32, lr=1e-3, warmup=200, seed=args.seed,
                             save=save, save_every=1000)
    history_ref[0] = sum(history["loss"][-100:]) / 100
    save(args.steps)


if __name__ == "__main__":
    main()
