"""The committed runs of models/captioner and models/drawer: their training commands, and the start
of their recipe repeated on the arithmetic path they were made on."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from transformer.training.checkpoint import read_checkpoint

ROOT = Path(__file__).resolve().parent.parent


def train_command(folder: Path) -> ModuleType:
    """``folder/train.py`` as a module, to use its functions and run its main() in this process."""
    spec = importlib.util.spec_from_file_location(f"{folder.name}_train", folder / "train.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def plain_path_history(folder: Path, steps: int, out: Path) -> dict[str, list]:
    """The loss history of ``folder/train.py --steps steps``, run in a process of its own on torch's
    plain kernels (``ATEN_CPU_CAPABILITY=default``) and one thread, as the committed runs were made.

    Within a recipe's warm-up its learning rate does not depend on the run's length, so a run of
    ``steps`` up to the warm-up's is, step for step, the start of the committed run."""
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "default", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, str(folder / "train.py"), "--steps", str(steps), "--out", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return read_checkpoint(out / "model.pt")["history"]


def assert_same_start(start: dict[str, list], committed: dict[str, list], steps: int) -> None:
    """``start`` is the first ``steps`` of the committed history: the same keys and lengths, learning
    rates equal (Python arithmetic), every other figure within 1e-3 relative. Exact on the machine that
    made the runs; the margin is for another CPU, whose plain kernels may round the last bits otherwise
    (the native path drifts by about 2e-4 in 100 steps). A changed recipe moves the losses by far more."""
    assert sorted(start) == sorted(committed)
    for key, values in start.items():
        assert len(values) == steps, key
        expected = committed[key][:steps]
        assert values == expected if key == "lr" else values == pytest.approx(expected, rel=1e-3), key
