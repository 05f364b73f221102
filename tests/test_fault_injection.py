"""Fault injection: a run of the number words killed with SIGKILL at random moments, again and again,
and resumed each time, ends with the weights of a run that was never stopped, bit for bit (issue 32).

A kill gives the process no chance to clean up: it may land in a training step, between two steps,
or in the middle of a save. Saves are atomic (``transformer.training.checkpoint.save_torch_file``), so the folder
always holds a whole checkpoint or none, and the book's resume is exact. The runs are the command's
own ``main`` (what ``python -m transformer train`` runs) in processes forked from this one, which has
imported the package and trained once already, so that a start costs milliseconds instead of the
seconds of importing torch; the first kill goes to the real ``python -m transformer train``.
"""

import multiprocessing
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import transformer
from transformer.cli.train import main
from transformer.training.checkpoint import read_checkpoint

ROOT = Path(transformer.__file__).resolve().parent.parent
# A model small enough that a step takes milliseconds; 120 steps, a checkpoint after every one, and
# dropout on, so that the random state a checkpoint carries matters.
RUN = ["--d-model", "16", "--num-heads", "2", "--num-layers", "1", "--d-ff", "32", "--dropout", "0.1",
       "--warmup", "4", "--batch-size", "8", "--train-size", "64", "--valid-size", "8", "--eval-every", "40",
       "--eval-size", "8", "--steps", "120", "--save-every", "1", "--num-threads", "1", "--no-progress",
       "--device", "cpu"]
KILLS = 24  # random kills of the command's main, besides the one of the real command
TIMEOUT = 120  # seconds for one uninterrupted run; a healthy one takes a few


def _start(folder: Path, context) -> multiprocessing.Process:
    """The command, as ``transformer train RUN --checkpoint-dir folder`` runs it, resuming when the folder is there."""
    argv = [*RUN, "--checkpoint-dir", str(folder), *(["--resume"] if folder.is_dir() else [])]
    process = context.Process(target=main, args=(argv, "transformer train"))
    process.start()
    return process


def _version(path: Path) -> tuple[int, int] | None:
    """Which save ``path`` holds: every save renames a new file over it."""
    try:
        stat = path.stat()
    except FileNotFoundError:
        return None
    return stat.st_ino, stat.st_mtime_ns


def _kill_at_a_random_moment(process: multiprocessing.Process, checkpoint: Path, rng: random.Random) -> bool:
    """SIGKILL the run: in its start-up, or after one to three more saves, somewhere in the step or save
    that follows; return whether it was killed (False: it ended first)."""
    if rng.random() < 0.2:
        process.join(rng.uniform(0.0, 0.05))  # before its first save
    else:
        saves, last, seen, interval = rng.randint(1, 3), _version(checkpoint), time.monotonic(), 0.05
        while saves and process.is_alive():
            if _version(checkpoint) != last:
                saves, last = saves - 1, _version(checkpoint)
                seen, interval = time.monotonic(), time.monotonic() - seen
            time.sleep(0.001)
        process.join(rng.uniform(0.0, interval))  # about one step and save long
    if not process.is_alive():
        return False
    process.kill()  # SIGKILL
    process.join()
    return True


def _partial_files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.glob(".*.partial")) if folder.is_dir() else []


def _same(a: dict, b: dict) -> bool:
    """Every tensor and value of two checkpoints equal, exactly."""
    if a.keys() != b.keys():
        return False
    for key in a:
        x, y = a[key], b[key]
        if isinstance(x, dict) and isinstance(y, dict):
            if not _same(x, y):
                return False
        elif isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
            if not (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) and torch.equal(x, y)):
                return False
        elif x != y:
            return False
    return True


def _kill_the_real_command(folder: Path) -> None:
    """Start ``python -m transformer train``, SIGKILL it at a random moment after its first save."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen([sys.executable, "-m", "transformer", "train", *RUN, "--checkpoint-dir", str(folder)],
                               env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + TIMEOUT
    while not (folder / "checkpoint.pt").is_file():
        assert process.poll() is None, process.stderr.read().decode() if process.stderr else ""
        assert time.monotonic() < deadline, "the command saved no checkpoint"
        time.sleep(0.01)
    time.sleep(random.Random(1).uniform(0.0, 0.3))
    process.send_signal(signal.SIGKILL)
    process.wait()


@pytest.fixture
def one_thread():
    """One torch thread in this process while it forks: a child never meets a thread pool it cannot use."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "fork"), reason="forks the runs")
def test_a_run_killed_at_random_moments_and_resumed_ends_bit_identical(tmp_path, capsys, one_thread):
    assert main([*RUN, "--checkpoint-dir", str(tmp_path / "straight")]) == 0  # here: the first run imports lazily
    reference = read_checkpoint(tmp_path / "straight" / "checkpoint.pt")
    assert reference["step"] == 120

    folder = tmp_path / "killed"
    _kill_the_real_command(folder)
    context, rng = multiprocessing.get_context("fork"), random.Random(0)  # forks start warm, in milliseconds
    kills, in_a_save, steps_at_kill = 1, 0, []
    while kills <= KILLS:
        process = _start(folder, context)
        if not _kill_at_a_random_moment(process, folder / "checkpoint.pt", rng):
            pytest.fail(f"the run ended before it was killed, after {kills} kills")
        kills += 1
        in_a_save += (folder / f".checkpoint.pt.{process.pid}.partial").exists()  # between a save's first byte and its rename
        steps_at_kill.append(read_checkpoint(folder / "checkpoint.pt")["step"])
    last = _start(folder, context)
    last.join(TIMEOUT)
    assert last.exitcode == 0
    resumed = read_checkpoint(folder / "checkpoint.pt")
    with capsys.disabled():
        print(f"\n{kills} kills survived ({in_a_save} in the middle of a save); the checkpoint's step after each "
              f"kill: {steps_at_kill}")
    assert steps_at_kill[-1] < 120  # the last kill still had steps to go
    assert _same(resumed, reference)  # weights, Adam's state, schedule, random state, history: all
    assert _partial_files(folder) == []  # the saves of the last run removed what the kills left
