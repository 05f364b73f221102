"""Train the committed captioner (chapters/captioning.md) and score it. From the repository's root:

    ATEN_CPU_CAPABILITY=default OMP_NUM_THREADS=1 .venv/bin/python models/captioner/train.py --out models/captioner

The run is the chapter's: ``train_captioner`` on its 20,000 training scenes, 4,000 steps, seed 0.
Writes DIR/model.pt (the weights, the step, the loss history, the seed and the seconds, in the
package's checkpoint format) and DIR/results.json (greedy exact match and word accuracy on the
chapter's test and composition scenes, which tests/test_captioning.py recomputes from model.pt).
Bad arguments exit with status 2 and one line.
"""

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch

from transformer.generation.decoding import generated_ids, greedy_decode
from transformer.tasks.captioning import ImageCaptioner, caption_scores, train_captioner
from transformer.tasks.digits import load_digits, stratified_split
from transformer.tasks.scenes import CaptionVocab, Scenes, make_scenes, pixel_tokens
from transformer.training.checkpoint import save_checkpoint

MAX_LEN = 6  # <bos>, four words at most, <eos>: the chapter's


def fail(message: str) -> None:
    """One line on stderr and exit status 2, as the book's commands do for bad input."""
    print(f"train.py: {message}", file=sys.stderr)
    sys.exit(2)


def chapter_scenes() -> dict[str, Scenes]:
    """The chapter's scenes: 20,000 for training (training digits), 1,000 test and 1,000
    composition scenes (held-out digits; the latter with the held-out wordings)."""
    images, labels = load_digits()
    train_index, test_index = stratified_split(labels)  # the split of chapters/images.md
    return {
        "train": make_scenes(images[train_index], labels[train_index], 20_000, seed=1),
        "test": make_scenes(images[test_index], labels[test_index], 1_000, seed=2),
        "composition": make_scenes(images[test_index], labels[test_index], 1_000, seed=3, held_out=True),
    }


def scores(model: ImageCaptioner, scenes: dict[str, Scenes]) -> dict[str, float]:
    """Greedy exact match and word accuracy on the test and the composition scenes."""
    vocab, found = CaptionVocab(), {}
    for name in ("test", "composition"):
        out = greedy_decode(model, pixel_tokens(scenes[name].images), MAX_LEN, vocab.bos_id, vocab.eos_id)
        written = [vocab.decode(ids) for ids in generated_ids(out, vocab.eos_id)]
        found[f"{name}_exact"], found[f"{name}_words"] = caption_scores(written, scenes[name].captions)
    return found


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=4000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("models/captioner"))
    args = parser.parse_args()
    if args.steps < 1:
        fail(f"--steps must be a positive number, got {args.steps}")
    if args.out.exists() and not args.out.is_dir():
        fail(f"--out must be a folder, got the file {args.out}")
    args.out.mkdir(parents=True, exist_ok=True)
    scenes, vocab = chapter_scenes(), CaptionVocab()
    start = time.perf_counter()
    model, history = train_captioner(pixel_tokens(scenes["train"].images),
                                     vocab.encode(scenes["train"].captions, MAX_LEN), args.steps, args.seed,
                                     len(vocab))
    seconds = time.perf_counter() - start
    save_checkpoint(args.out / "model.pt", model, None, None, args.steps, history,
                    extra={"seed": args.seed, "seconds": seconds})
    results = {**scores(model, scenes), "steps": args.steps, "seed": args.seed, "seconds": round(seconds, 1),
               "torch": torch.__version__, "capability": torch.backends.cpu.get_cpu_capability(),
               "machine": platform.machine()}
    (args.out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
