"""Write the files of the translator page (chapters/exporting.md) into a folder of the built site:
the committed model's two ONNX graphs and its BPE tokenizer as ``tokenizer.json``.

Run by `make assets` (so by `make book` and `make html`):
    python -m tools.demo_model --checkpoint models/multi30k/model.pt --out _build/assets/demo
"""

import argparse
import contextlib
import io
import logging
import warnings
from pathlib import Path

from transformer.interop.onnx import export_onnx
from transformer.tasks.translation import load_translator


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", default="models/multi30k/model.pt")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model, tokenizer = load_translator(args.checkpoint)
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)  # "torchvision is not installed" notes
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        export_onnx(model, out)
    (out / "tokenizer.json").write_text(tokenizer.to_str())


if __name__ == "__main__":
    main()
