"""The chapters that nbval executes a second time, on torch's plain CPU kernels.

``make nbval`` runs chapters under ``ATEN_CPU_CAPABILITY=default`` so that a claim which holds only
for one CPU's rounding fails on any machine. Only a claim that rests on a long chain of floating-point
arithmetic can differ between the two paths: a model trained (or a trained model measured) in the
chapter. The other chapters' checks (shapes, masks, a layer against ``torch.nn`` at a tolerance of a
few rounding errors) cannot, and they still execute in the strict book build. ``make busy-check``
executes the same chapters beside busy processes: they hold the book's long cells.

``tests/test_nbval_chapters.py`` fails when a chapter that trains, or loads a trained or pretrained
model, is missing here, so a new training chapter cannot be forgotten.

Usage: python -m tools.nbval_chapters   (prints the chapters' paths, one a line)
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: By file name, in reading order. Each trains a model, or loads a trained or pretrained one, and
#: states something about the result.
ARITHMETIC_CHAPTERS = (
    "04_why_dot_product",  # a lookup trained with additive and dot-product attention
    "05_multihead_attention",  # two attention lookups trained: one head against two
    "07_add_and_norm",  # deep stacks trained, post-norm against pre-norm
    "10_model",  # the whole model takes optimiser steps; saved and loaded
    "13_training",  # the training loop's steps, losses and schedules
    "14_training_run",  # the number-words run: accuracy, exact resume
    "15_generation",  # beam search on the trained number-words model
    "17_translation",  # the live translation run and the committed model's BLEU
    "18_reading_attention",  # the committed translator's attention
    "21_long_runs",  # averaged checkpoints, the commands' runs
    "22_scaling_out",  # data-parallel runs equal to one process
    "22_when_runs_fail",  # a killed run resumed to the unbroken run's weights
    "24_classify_command",  # the committed spam classifier's figures, a classifier trained by the command
    "24_encoder_only",  # classifiers trained
    "24_pretrained_encoder",  # MiniLM's hidden states against BertModel, its sentence similarities
    "24_pretraining",  # a masked language model pre-trained, classifiers fine-tuned on email
    "24_tagging",  # a tagger trained, scored against baselines
    "25_decoder_only",  # language models trained
    "26_sampling",  # a trained language model sampled
    "28_train_short_test_long",  # positions trained short, tested long
    "30_vision",  # a vision Transformer trained on digits
    "31_captioning",  # an image-to-text model trained
    "32_detection",  # a detector trained, the committed detector and a sliding-window baseline measured
    "32_drawing",  # a drawing model trained
    "33_pretrained",  # models copied from transformers' and compared with them at the real sizes
    "34_exporting",  # the committed translator exported, int8 quantised, BLEU
)


def arithmetic_chapters(root: Path = ROOT) -> list[Path]:
    """The chapters of ``ARITHMETIC_CHAPTERS`` as paths under ``root/chapters``."""
    return [Path(root) / "chapters" / f"{name}.md" for name in ARITHMETIC_CHAPTERS]


def main() -> int:
    paths = arithmetic_chapters()
    missing = [path for path in paths if not path.exists()]
    if missing:
        print(f"tools/nbval_chapters.py names chapters that do not exist: {missing}", file=sys.stderr)
        return 1
    for path in paths:
        print(path.relative_to(ROOT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
