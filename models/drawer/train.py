"""Train the committed drawer (chapters/drawing.md) and score it. From the repository's root:

    ATEN_CPU_CAPABILITY=default OMP_NUM_THREADS=1 .venv/bin/python models/drawer/train.py --out models/drawer

The run is the chapter's: ``train_drawer`` on the training digits' sequences, 1,500 steps, seed 0.
Writes DIR/model.pt (the weights, the step, the loss history, the seed and the seconds, in the
package's checkpoint format) and DIR/results.json (the loss in eval mode on the held-out and the
training digits, which tests/test_drawing.py recomputes from model.pt). Bad arguments exit with
status 2 and one line.
"""

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch

from transformer.nn.decoder_only import DecoderOnlyLM
from transformer.tasks.digits import load_digits, stratified_split
from transformer.tasks.drawing import digit_sequences, train_drawer
from transformer.tasks.language_model import next_token_loss
from transformer.training.checkpoint import save_checkpoint


def fail(message: str) -> None:
    """One line on stderr and exit status 2, as the book's commands do for bad input."""
    print(f"train.py: {message}", file=sys.stderr)
    sys.exit(2)


def chapter_sequences() -> dict[str, torch.Tensor]:
    """The chapter's sequences (M, 65): a prompt word and a digit's 64 grey levels, for the
    training and the held-out digits of the images chapter's split."""
    images, labels = load_digits()
    train_index, test_index = stratified_split(labels)
    return {"train": digit_sequences(images[train_index], labels[train_index]),
            "held_out": digit_sequences(images[test_index], labels[test_index])}


def scores(model: DecoderOnlyLM, sequences: dict[str, torch.Tensor]) -> dict[str, float]:
    """The mean next-token loss (nats per pixel), eval mode, on the held-out and the training digits."""
    with torch.no_grad():
        return {f"{name}_loss": next_token_loss(model.eval(), (rows[:, :-1], rows[:, 1:]))[0].item()
                for name, rows in sequences.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("models/drawer"))
    args = parser.parse_args()
    if args.steps < 1:
        fail(f"--steps must be a positive number, got {args.steps}")
    if args.out.exists() and not args.out.is_dir():
        fail(f"--out must be a folder, got the file {args.out}")
    args.out.mkdir(parents=True, exist_ok=True)
    sequences = chapter_sequences()
    start = time.perf_counter()
    model, history = train_drawer(sequences["train"], args.steps, args.seed)
    seconds = time.perf_counter() - start
    save_checkpoint(args.out / "model.pt", model, None, None, args.steps, history,
                    extra={"seed": args.seed, "seconds": seconds})
    results = {**scores(model, sequences), "steps": args.steps, "seed": args.seed, "seconds": round(seconds, 1),
               "torch": torch.__version__, "capability": torch.backends.cpu.get_cpu_capability(),
               "machine": platform.machine()}
    (args.out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
