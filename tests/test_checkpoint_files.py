"""Checkpoint files (issue 32): written whole or not at all, and every bad file refused in one line that
names it and says what it is, in Python and through the commands (exit 2, no traceback, never torch's
advice to load with weights_only=False)."""

import os
import pickle
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import transformer
from transformer.__main__ import command
from transformer.training.checkpoint import read_torch_file, save_torch_file
from transformer.tasks.numbers import source_vocab, target_vocab
from transformer.tasks.numbers_fit import fit
from transformer.tasks.translation import load_translator, translate
from transformer.training.checkpoint import (Resume, SaveCheckpoint, average_checkpoints, check_resume, load_checkpoint, read_checkpoint,
                                             save_checkpoint)
from transformer.training.config import TrainConfig, make_model
from transformer.training.loop import DivergedError

ROOT = Path(transformer.__file__).resolve().parent.parent
MODEL = ROOT / "models" / "multi30k" / "model.pt"  # the committed translator
SMALL = TrainConfig(d_model=16, num_heads=2, num_layers=1, d_ff=32, batch_size=8, steps=2, warmup=2, eval_size=0)
TINY = ["--d-model", "16", "--num-heads", "2", "--num-layers", "1", "--d-ff", "32", "--warmup", "2",
        "--batch-size", "8", "--train-size", "16", "--valid-size", "8", "--steps", "2", "--no-progress",
        "--device", "cpu"]
TORCH_ADVICE = ("weights_only", "Weights only", "Traceback")


class Code:
    """Unpickling this makes a folder: what a checkpoint with code in it could do instead."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (str(self.marker),))


def _numbers_checkpoint(path: Path, step: int = 1) -> Path:
    model = make_model(SMALL, source_vocab(), target_vocab())
    save_checkpoint(path, model, None, None, step, config=SMALL, src_vocab=source_vocab(), tgt_vocab=target_vocab())
    return path


# (file name, how to write it into a folder, what the message says it is)
BAD_FILES = [
    ("empty.pt", lambda p: p.write_bytes(b""), "it is empty (0 bytes)"),
    ("truncated.pt", lambda p: p.write_bytes(_numbers_checkpoint(p.with_name("whole.pt")).read_bytes()[:5000]),
     "it is truncated or corrupt"),
    ("cut-at-the-end.pt", lambda p: p.write_bytes(_numbers_checkpoint(p.with_name("whole.pt")).read_bytes()[:-20]),
     "it is truncated or corrupt"),
    ("random.pt", lambda p: p.write_bytes(random.Random(0).randbytes(2000)), "it is not a torch file"),
    ("text.pt", lambda p: p.write_text("step: 3\nmodel: weights\n"), "it is not a torch file"),
    ("folder.pt", lambda p: p.mkdir(), "it is a directory"),
    ("code.pt", lambda p: torch.save({"model": Code(p.with_name("ran")), "step": 0}, p),
     "it holds pickled code (posix.mkdir), which loading would run: refused"),
    ("code.pkl", lambda p: p.write_bytes(pickle.dumps(Code(p.with_name("ran")), protocol=2)),
     "it holds pickled code (posix.mkdir)"),
    ("code4.pkl", lambda p: p.write_bytes(pickle.dumps(Code(p.with_name("ran")))),
     "it is a Python pickle, not a torch file: refused"),
]
IDS = [name for name, _, _ in BAD_FILES]


def _one_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    assert not any(word in text for word in TORCH_ADVICE), text
    return lines[-1]


# --- writing ------------------------------------------------------------------------------------

def test_a_save_leaves_the_file_and_nothing_else(tmp_path):
    save_torch_file({"a": torch.arange(3)}, tmp_path / "deep" / "x.pt")
    assert [p.name for p in (tmp_path / "deep").iterdir()] == ["x.pt"]
    assert torch.equal(read_torch_file(tmp_path / "deep" / "x.pt")["a"], torch.arange(3))


def test_a_save_that_fails_midway_keeps_the_last_checkpoint_and_leaves_no_partial_file(tmp_path, monkeypatch):
    path = _numbers_checkpoint(tmp_path / "checkpoint.pt", step=1)
    before = path.read_bytes()

    def full_disk(obj, file):
        file.write(b"PK\x03\x04 half a file")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", full_disk)
    with pytest.raises(OSError, match="No space left"):
        _numbers_checkpoint(path, step=2)
    assert path.read_bytes() == before and read_checkpoint(path)["step"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.pt"]


def test_ctrl_c_during_a_save_waits_for_the_whole_file_then_stops(tmp_path, monkeypatch):
    """CI saw it: a Ctrl-C inside torch.save left the zip writer half done, its close failed with a
    RuntimeError, and the command printed that traceback instead of its one line (exit 1, not 130)."""
    real_save = torch.save

    def interrupted_save(obj, file):
        file.write(b"")  # the save has begun when the Ctrl-C comes
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)  # Python runs the handler between bytecodes: here, inside the save
        real_save(obj, file)

    monkeypatch.setattr(torch, "save", interrupted_save)
    path = tmp_path / "x.pt"
    before = signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal
    try:
        with pytest.raises(KeyboardInterrupt):
            save_torch_file({"a": torch.arange(5)}, path)
        assert torch.equal(read_torch_file(path)["a"], torch.arange(5))  # saved whole, then stopped
        assert [p.name for p in tmp_path.iterdir()] == ["x.pt"]
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the handler is put back
        # a process that ignores SIGINT (started in the background) saves and goes on
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        save_torch_file({"a": torch.arange(6)}, path)
        assert torch.equal(read_torch_file(path)["a"], torch.arange(6))
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, before)


def test_a_save_removes_the_partial_files_of_killed_saves_but_not_those_of_running_ones(tmp_path):
    finished = subprocess.Popen([sys.executable, "-c", "pass"])
    finished.wait()  # its process id is free now: the file stands for a killed save
    dead = tmp_path / f".checkpoint.pt.{finished.pid}.partial"
    alive = tmp_path / f".checkpoint.pt.{os.getppid()}.partial"  # our parent still runs
    other = tmp_path / f".other.pt.{finished.pid}.partial"  # another file's: not this save's business
    for leftover in (dead, alive, other):
        leftover.write_bytes(b"PK\x03\x04 cut short")
    _numbers_checkpoint(tmp_path / "checkpoint.pt")
    assert not dead.exists() and alive.exists() and other.exists()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_save_killed_before_its_rename_leaves_the_last_checkpoint_whole(tmp_path):
    path = _numbers_checkpoint(tmp_path / "checkpoint.pt", step=1)
    before = path.read_bytes()
    # Built here: a forked child must not run torch's operations, whose thread pool (started by earlier
    # tests in this process) does not survive a fork and would hang it before it saves.
    model = make_model(SMALL, source_vocab(), target_vocab())
    pid = os.fork()
    if pid == 0:  # the child: its save hangs where a kill is most likely to hurt, after the bytes, before the rename
        os.fsync = lambda fd: time.sleep(600)
        try:
            save_checkpoint(path, model, None, None, 2, config=SMALL, src_vocab=source_vocab(), tgt_vocab=target_vocab())
        finally:
            os._exit(1)
    partial = tmp_path / f".checkpoint.pt.{pid}.partial"
    deadline = time.monotonic() + 60
    while not (partial.exists() and partial.stat().st_size > 1000) and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.1)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    assert partial.exists() and path.read_bytes() == before  # the kill left half a save beside a whole file
    assert read_checkpoint(path)["step"] == 1
    _numbers_checkpoint(path, step=3)  # the next save removes what the killed one left
    assert read_checkpoint(path)["step"] == 3 and not partial.exists()


# --- reading, in Python -------------------------------------------------------------------------

@pytest.mark.parametrize("name, write, what", BAD_FILES, ids=IDS)
def test_every_loader_names_a_bad_file_and_says_what_it_is(tmp_path, name, write, what):
    path = tmp_path / name
    write(path)
    message = f"{path} cannot be read as a torch checkpoint: {what}"
    loaders = [read_checkpoint, load_checkpoint, load_translator, lambda p: average_checkpoints([p]),
               lambda p: fit(SMALL, [1, 2, 3], progress=False, callbacks=[Resume(p)])]
    for load in loaders:
        with pytest.raises(ValueError) as err:
            load(path)
        assert str(err.value).startswith(message), str(err.value)
        assert "\n" not in str(err.value) and not any(word in str(err.value) for word in TORCH_ADVICE)
    assert not (tmp_path / "ran").exists()  # no code of the file ran


def test_a_missing_file_is_a_file_not_found_error(tmp_path):
    for load in (read_checkpoint, load_checkpoint, load_translator):
        with pytest.raises(FileNotFoundError, match=f"^no checkpoint at {tmp_path / 'none.pt'}$"):
            load(tmp_path / "none.pt")


def test_another_tasks_checkpoint_names_the_task_and_its_loader(tmp_path):
    model, _ = load_translator(MODEL)  # load_checkpoint reads any kind: the translator too, the same weights
    loaded = load_checkpoint(MODEL)
    assert type(loaded) is type(model) and not loaded.training
    assert all(torch.equal(a, b) for a, b in zip(loaded.state_dict().values(), model.state_dict().values(), strict=True))
    numbers = _numbers_checkpoint(tmp_path / "numbers.pt")
    with pytest.raises(ValueError, match="numbers.pt is the number words' checkpoint, not a translator's: "
                                         r"load_checkpoint\(path\) loads any kind$"):
        load_translator(numbers)
    translator = read_checkpoint(MODEL)
    with pytest.raises(ValueError, match=r"cannot resume from .*model.pt: it is a translator's checkpoint, not of "
                                         r"this task \(TrainConfig; settings of one task only: .*vocab_size"):
        check_resume(translator, SMALL, MODEL)


def test_translate_names_extra_len():
    model, tokenizer = load_translator(MODEL)
    with pytest.raises(ValueError, match="^extra_len must be an int >= 0, got -5$"):
        translate(model, tokenizer, ["Ein Hund."], extra_len=-5)


# --- reading, through the commands ----------------------------------------------------------------

def _run(argv: list[str], capsys) -> tuple[int, str]:
    """The exit status of ``transformer ARGV`` and its last line on stderr (checked to hold no traceback)."""
    try:
        code = command(argv)
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else 1
    return code, _one_line(capsys.readouterr().err)


@pytest.mark.parametrize("name, write, what", BAD_FILES, ids=IDS)
def test_the_commands_refuse_a_bad_checkpoint_in_one_line(tmp_path, capsys, monkeypatch, name, write, what):
    folder = tmp_path / "run"
    folder.mkdir()
    write(folder / "checkpoint.pt")
    for resume in (["--resume"], []):  # resumed, or found in a folder that holds a run
        code, line = _run(["train", *TINY, "--checkpoint-dir", str(folder), *resume], capsys)
        assert code == 2 and f"{folder / 'checkpoint.pt'} cannot be read as a torch checkpoint: {what}" in line, line
    code, line = _run(["train", "--task", "multi30k", "--checkpoint-dir", str(folder), "--resume"], capsys)
    assert code == 2 and what in line and str(folder / "checkpoint.pt") in line, line
    monkeypatch.setattr(sys, "stdin", open(os.devnull))
    code, line = _run(["translate", "--checkpoint", str(folder / "checkpoint.pt"), "--no-progress"], capsys)
    assert code == 2 and what in line and str(folder / "checkpoint.pt") in line, line
    code, line = _run(["export", "huggingface", "--checkpoint", str(folder / "checkpoint.pt"),
                       "--out", str(tmp_path / "out")], capsys)
    assert code == 2 and what in line and str(folder / "checkpoint.pt") in line, line
    assert not (tmp_path / "out").exists() and not (tmp_path / "run" / "ran").exists()


def test_the_commands_name_another_tasks_checkpoint(tmp_path, capsys):
    translator = tmp_path / "translator"
    translator.mkdir()
    shutil.copy(MODEL, translator / "checkpoint.pt")  # what `train --task multi30k` leaves in its folder
    code, line = _run(["train", *TINY, "--checkpoint-dir", str(translator), "--resume"], capsys)
    assert code == 2 and "it is a translator's checkpoint, not of this task" in line, line
    numbers = tmp_path / "numbers"
    _numbers_checkpoint(numbers / "checkpoint.pt")
    code, line = _run(["train", "--task", "multi30k", "--checkpoint-dir", str(numbers), "--resume"], capsys)
    assert code == 2 and "it is the number words' checkpoint, not of this task" in line, line
    for argv in (["translate", "--checkpoint", str(numbers / "checkpoint.pt")],
                 ["export", "huggingface", "--checkpoint", str(numbers / "checkpoint.pt"), "--out", str(tmp_path / "o")]):
        code, line = _run(argv, capsys)
        assert code == 2 and "checkpoint.pt is the number words' checkpoint, not a translator's" in line, line


# --- resuming, through the command ----------------------------------------------------------------

def test_resume_refuses_a_folder_that_does_not_exist_and_starts_an_empty_one_from_step_0(tmp_path, capsys):
    code, line = _run(["train", *TINY, "--checkpoint-dir", str(tmp_path / "typo"), "--resume"], capsys)
    assert code == 2 and line.endswith(f"--resume: --checkpoint-dir {tmp_path / 'typo'} does not exist, so there "
                                       "is no run to continue (leave out --resume to start one)")
    assert not (tmp_path / "typo").exists()
    (tmp_path / "killed").mkdir()  # a run killed before its first save leaves its folder, and no checkpoint
    (tmp_path / "killed" / f".checkpoint.pt.{2 ** 22 + 1}.partial").write_bytes(b"PK\x03\x04")  # and maybe this
    assert command(["train", *TINY, "--checkpoint-dir", str(tmp_path / "killed"), "--resume"]) == 0
    out = capsys.readouterr()
    assert out.out.splitlines()[0] == f"no checkpoint in {tmp_path / 'killed'} yet: starting from step 0"
    assert out.out.splitlines()[-1] == f"checkpoint written to {tmp_path / 'killed' / 'checkpoint.pt'}"
    assert read_checkpoint(tmp_path / "killed" / "checkpoint.pt")["step"] == 2
    assert [p.name for p in (tmp_path / "killed").iterdir()] == ["checkpoint.pt"]


def test_a_finished_run_resumed_shows_no_progress_bar_and_names_its_checkpoint(tmp_path, capsys):
    folder = tmp_path / "run"
    argv = ["train", *[a for a in TINY if a != "--no-progress"], "--checkpoint-dir", str(folder)]
    assert command(argv) == 0
    first = capsys.readouterr()
    assert "training" in first.err  # the bar of a run that takes steps
    assert command([*argv, "--resume"]) == 0
    again = capsys.readouterr()
    assert again.err == ""  # no bar of zero steps
    assert again.out.splitlines()[0] == f"resuming from {folder / 'checkpoint.pt'}: the run is already complete, step 2 of 2"
    assert again.out.splitlines()[-1] == f"checkpoint written to {folder / 'checkpoint.pt'}"



# --- weights that are not finite (issue 47) ----------------------------------------------------

def _nan_model():
    model = make_model(SMALL, source_vocab(), target_vocab())
    with torch.no_grad():
        model.decoder.layers[0].norm3.weight[3] = float("nan")
    return model


def test_a_model_with_a_weight_that_is_not_finite_is_never_saved(tmp_path):
    with pytest.raises(DivergedError, match=r"at step 7: the weight 'decoder.layers.0.norm3.weight' is not finite .* was not written"):
        save_checkpoint(tmp_path / "run.pt", _nan_model(), None, None, 7)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow  # ends with a process
def test_loaders_refuse_a_checkpoint_with_a_weight_that_is_not_finite_naming_file_and_tensor(tmp_path):
    path = tmp_path / "nan.pt"
    checkpoint = {"model": _nan_model().state_dict(), "step": 3}
    torch.save(checkpoint, path)  # what an older version, or another program, could have written
    expected = rf"{path}: the weight 'decoder.layers.0.norm3.weight' is not finite \(nan or inf\): refused"
    for load in (read_checkpoint, load_checkpoint, lambda p: average_checkpoints([p])):
        with pytest.raises(ValueError, match=expected):
            load(path)
    translator = read_checkpoint(MODEL)
    name = next(iter(translator["model"]))
    translator["model"][name] = translator["model"][name].clone().fill_(float("inf"))
    torch.save(translator, tmp_path / "inf.pt")
    with pytest.raises(ValueError, match=rf"inf.pt: the weight '{name}' is not finite"):
        load_translator(tmp_path / "inf.pt")
    refused = subprocess.run([sys.executable, "-m", "transformer", "translate", "--checkpoint", str(tmp_path / "inf.pt")],
                             input="Ein Hund.\n", capture_output=True, text=True, timeout=120,
                             env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"})
    assert refused.returncode == 2 and refused.stdout == "" and "is not finite" in refused.stderr
    assert "Traceback" not in refused.stderr


def test_a_run_resumes_with_a_lower_rate_from_its_first_step_on(tmp_path):
    config = TrainConfig(**{**vars(SMALL), "steps": 4, "eval_size": 0})
    numbers, checks = list(range(1, 40)), list(range(40, 48))
    fit(TrainConfig(**{**vars(config), "steps": 2}), numbers, checks, progress=False,
        callbacks=[SaveCheckpoint(tmp_path / "run.pt")])
    lower = TrainConfig(**{**vars(config), "lr_factor": config.lr_factor / 10, "clip": None})
    _, resumed = fit(lower, numbers, checks, progress=False, callbacks=[Resume(tmp_path / "run.pt")])
    _, straight = fit(lower, numbers, checks, progress=False)  # the lower rate's schedule from step 1
    assert resumed["step"] == [1, 2, 3, 4]
    assert resumed["lr"][2:] == straight["lr"][2:] and resumed["lr"][2] < resumed["lr"][1]


def test_saving_onto_a_folder_is_refused_naming_it_before_anything_is_written(tmp_path):
    (tmp_path / "adir").mkdir()
    with pytest.raises(ValueError, match=rf"path {tmp_path / 'adir'} is a folder: name a file to save to, such as "
                                         rf"{tmp_path / 'adir' / 'checkpoint.pt'}"):
        save_checkpoint(tmp_path / "adir", make_model(SMALL, source_vocab(), target_vocab()), None, None, 0)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["adir"] and not any((tmp_path / "adir").iterdir())
