"""Score a finished run of ``python -m transformer.train --task multi30k`` on Multi30k.

For the last model (``checkpoint.pt``) and the average of the last checkpoints (``averaged.pt``),
greedy decoding and beam search (beam 4, length penalty 0.6, at most input + 50 tokens: the paper's
settings), on the validation set and on test2016: sacreBLEU's BLEU (with its signature) and chrF.
Also the greedy BLEU of the averaged model on the first ``SAMPLE`` test sentences, which
``tests/test_translate.py`` reproduces on the CPU.

    python -m benchmarks.translation RUN_DIR --out results.json [--device cuda]
"""

import argparse
import json
import platform
import time

import torch

from transformer.tasks.multi30k import load_multi30k
from transformer.tasks.metrics import corpus_scores
from transformer.tasks.translation import load_translator, translate

SAMPLE = 100  # test sentences of the committed model's reproducibility check


def score(path, device, sets) -> dict:
    """Greedy and beam-4 scores of the model in ``path`` on each (name, (german, english)) of ``sets``."""
    model, tokenizer = load_translator(path, device)
    result: dict = {}
    for name, (german, english) in sets:
        for decoding, beam in (("greedy", 1), ("beam", 4)):
            start = time.perf_counter()
            scores = corpus_scores(translate(model, tokenizer, german, beam_size=beam), english)
            scores["seconds"] = round(time.perf_counter() - start, 2)
            result[f"{name}_{decoding}"] = scores
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir")
    parser.add_argument("--out", required=True)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    sets = [("valid", load_multi30k("val")), ("test", load_multi30k("test"))]
    results = {"last": score(f"{args.run_dir}/checkpoint.pt", args.device, sets),
               "averaged": score(f"{args.run_dir}/averaged.pt", args.device, sets)}
    model, tokenizer = load_translator(f"{args.run_dir}/averaged.pt", args.device)
    german, english = (lines[:SAMPLE] for lines in load_multi30k("test"))
    results["sample"] = {"sentences": SAMPLE, "decoding": "greedy",
                         **corpus_scores(translate(model, tokenizer, german), english)}
    results["machine"] = {"device": torch.cuda.get_device_name() if args.device == "cuda" else platform.processor(),
                          "torch": torch.__version__, "python": platform.python_version()}
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)
    print(json.dumps({k: v for k, v in results.items() if k in ("last", "averaged")}, indent=1))


if __name__ == "__main__":
    main()
