"""Score the committed digit detector on the chapter's 500 test scenes and write results.json. From the
repository's root:

    OMP_NUM_THREADS=1 .venv/bin/python models/digit-detector/evaluate.py models/digit-detector
"""

import argparse
import json
import sys
from pathlib import Path

import torch

from transformer.training.checkpoint import load_checkpoint
from transformer.tasks.detection import coco_average_precision, detections, make_digit_scenes, predicted_set
from transformer.tasks.digits import load_digits, stratified_split

TEST_SCENES = {"count": 500, "seed": 2}  # chapters/detection.md's test scenes, from the held-out digits


def scores(folder: Path) -> dict:
    """AP, AP50, AP75 (pycocotools) and counting accuracy of the detector in ``folder`` on the test scenes."""
    images, labels = load_digits()
    _, test_index = stratified_split(labels)
    test = make_digit_scenes(images[test_index], labels[test_index], **TEST_SCENES)
    model = load_checkpoint(folder / "model.pt", kind="detector")  # the one format, or the older one committed
    with torch.no_grad():
        logits, boxes = model(test.images)
    counts = torch.tensor([len(c) for c in test.classes])
    return {**coco_average_precision(detections(logits, boxes), test.classes, test.boxes),
            "counting": (predicted_set(logits).sum(dim=1) == counts).float().mean().item()}


def main() -> None:
    parser = argparse.ArgumentParser(description="Score a detector folder's model.pt; write its results.json.")
    parser.add_argument("folder", type=Path, help="a folder holding model.pt, as train.py writes it")
    folder = parser.parse_args().folder
    try:
        result = {**scores(folder), "test_scenes": TEST_SCENES}
    except (FileNotFoundError, ValueError) as error:  # no model.pt, or not a detector's file
        print(f"evaluate.py: {error}", file=sys.stderr)
        sys.exit(2)
    (folder / "results.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
