"""Fuzz tests of the commands and the configuration classes (issue 32, item 8).

Random and mutated inputs -- flags drawn from each command's real flag list with random values,
mutated JSON configurations, files of random bytes -- must end in exit status 0 or 2, never a
traceback, and change no file outside the output the command was named. The commands run in this
process (``command(argv)``, as ``transformer ...`` does), in a temporary folder, with fixed seeds so
that a failure names its arguments and can be replayed; a few run as real processes to check that
stderr holds no traceback.
"""

import argparse
import contextlib
import hashlib
import io
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import transformer
from transformer.__main__ import command
from transformer.interrupts import run_command
from transformer.tasks.multi30k import TranslationConfig
from transformer.training.config import TrainConfig

ROOT = Path(transformer.__file__).resolve().parent.parent
MODEL = ROOT / "models" / "multi30k" / "model.pt"  # the committed translator
# A model that trains a step in milliseconds; the random flags come after it and override it.
TINY = ["--d-model", "16", "--num-layers", "1", "--num-heads", "2", "--d-ff", "32", "--warmup", "2",
        "--steps", "2", "--batch-size", "4", "--train-size", "8", "--valid-size", "4", "--eval-every", "1",
        "--eval-size", "4", "--no-progress", "--device", "cpu"]
# Values a flag may get: the edges of every type, text that is no number, and small numbers only, so
# that a run that starts also ends fast (huge sizes are refused up front; tests/test_train_cli.py).
VALUES = ["0", "-1", "1", "2", "3", "1.5", "0.5", "nan", "inf", "-inf", "none", "None", "x", "", " ", "1e3",
          "\u0663", "true", "--", "-", "0x10", "1_0", "\x00", "é", "{}", "[0.9, 0.98]", "cuda", "cpu", "numbers",
          "multi30k", "huggingface", "out", "out/inner", "run.json", "random.bin", "folder", "env://"]
# The random JSON values of a mutated configuration.
JSON_VALUES = [None, True, False, 0, -1, 1, 2, 0.5, 1.5, -0.5, 1e308, 10**30, "x", "", [], {}, [0.9], [0.9, 0.98],
               [0.9, "x"], [[0.1, 0.2]], {"a": 1}, "none", float("nan")]


def snapshot(folder: Path) -> dict[str, str]:
    """Every path under ``folder``: its SHA-256 (a file) or "dir"."""
    found = {}
    for path in sorted(folder.rglob("*")):
        found[str(path.relative_to(folder))] = "dir" if path.is_dir() else hashlib.sha256(path.read_bytes()).hexdigest()
    return found


def outputs(argv: list[str]) -> list[str]:
    """The outputs ``argv`` names (``--checkpoint-dir``, ``--out``), relative to the working folder."""
    named = []
    for i, arg in enumerate(argv[:-1]):
        if arg in ("--checkpoint-dir", "--out"):
            named.append(os.path.normpath(argv[i + 1]) if argv[i + 1] else ".")
    for arg in argv:  # --out=DIR
        if arg.startswith(("--checkpoint-dir=", "--out=")):
            named.append(os.path.normpath(arg.split("=", 1)[1] or "."))
    return named


def changed_outside(before: dict[str, str], after: dict[str, str], allowed: list[str]) -> list[str]:
    """The paths added, removed or changed that lie outside every allowed output."""
    def inside(path: str) -> bool:
        return any(a == "." or path == a or path.startswith(a + os.sep) for a in allowed)
    changed = {p for p in before.keys() | after.keys() if before.get(p) != after.get(p)}
    return sorted(p for p in changed if not inside(p))


def run_in_process(argv: list[str], stdin: bytes = b"") -> tuple[int, str]:
    """``transformer ARGV`` in this process: (exit status, stderr). Any exception but SystemExit fails the test."""
    err, out = io.StringIO(), io.StringIO()
    stdin_stream = io.TextIOWrapper(io.BytesIO(stdin), encoding="utf-8")
    saved = sys.stdin, torch.get_num_threads()
    sys.stdin = stdin_stream
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            try:
                code = command(argv)
            except SystemExit as stop:
                code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    except Exception as error:  # noqa: BLE001 -- the point of the test: name the arguments that raised
        raise AssertionError(f"transformer {argv!r} raised {type(error).__name__}: {error}") from error
    finally:
        sys.stdin = saved[0]
        torch.set_num_threads(saved[1])
    return code, err.getvalue()


def flags_of(argv: list[str]) -> list[str]:
    """The flags that ``transformer ARGV --help`` lists: the command's real flag list."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        command([*argv, "--help"])
    options = [line.strip().split("  ")[0] for line in out.getvalue().splitlines() if line.startswith("  -")]
    return sorted({flag for option in options for flag in re.findall(r"--[a-z][a-z0-9-]*", option)} - {"--help"})


@pytest.fixture
def playground(tmp_path, monkeypatch):
    """A working folder with the files the random values name: a JSON configuration, random bytes, a folder."""
    monkeypatch.chdir(tmp_path)
    rng = random.Random(7)
    (tmp_path / "run.json").write_text(json.dumps({"steps": 2, "d_model": 16}))
    (tmp_path / "random.bin").write_bytes(rng.randbytes(512))
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "keep.txt").write_text("not to be touched\n")
    return tmp_path


def random_argv(rng: random.Random, command_: list[str], flags: list[str], base: list[str],
                good: dict[str, list[str]] | None = None, good_share: float = 0.9) -> list[str]:
    """``command_``, then ``base``, then one to four random flags with random values (some without one);
    a flag in ``good`` gets one of its good values with probability ``good_share``, so that some runs start."""
    argv = [*command_, *base]
    for _ in range(rng.randint(1, 4)):
        flag = rng.choice(flags)
        if good and flag in good and rng.random() < good_share:
            argv += [flag, *([rng.choice(good[flag])] if good[flag] else [])]
            continue
        values = [rng.choice(VALUES) for _ in range(rng.choice((0, 1, 1, 1, 2)))]
        argv += [flag, *values] if rng.random() < 0.9 or not values else [f"{flag}={values[0]}"]
    return argv


def check_run(argv: list[str], folder: Path, stdin: bytes = b"") -> tuple[int, str]:
    """Run ``argv`` in ``folder``; check its exit status, stderr and the files outside its output."""
    before = snapshot(folder)
    code, err = run_in_process(argv, stdin)
    assert code in (0, 2), f"transformer {argv!r} exited {code}: {err[-2000:]}"
    assert "Traceback" not in err, f"transformer {argv!r}: {err[-2000:]}"
    diverged = code == 2 and "the run diverged at step" in err  # a run that started, then diverged: one line
    if code == 2 and not diverged:  # a usage error is two lines: the usage's first line and the message
        lines = err.splitlines()
        assert lines[-2].startswith("usage: ") and ": error: " in lines[-1], f"transformer {argv!r}: {err}"
    if diverged:
        assert ": error: the run diverged at step " in err.splitlines()[-1], f"transformer {argv!r}: {err}"
    after = snapshot(folder)
    outside = changed_outside(before, after, outputs(argv))
    assert outside == [], f"transformer {argv!r} changed {outside}"
    if code == 2 and not diverged:  # a refused run leaves no folder behind, not even the one it was named
        assert changed_outside(before, after, []) == [], f"the refused transformer {argv!r} left files"
    return code, err


def test_random_flags_of_train(playground):
    rng = random.Random(32)
    flags = flags_of(["train"])
    assert {"--d-model", "--betas", "--config", "--checkpoint-dir", "--task"} <= set(flags)
    codes = [check_run(random_argv(rng, ["train"], flags, TINY), playground)[0] for _ in range(40)]
    assert codes.count(0) >= 3 and codes.count(2) >= 10  # both paths were taken


def test_random_flags_of_train_multi30k(playground):
    # The working folder holds no book, so a run that passes every check stops at the missing data
    # (a usage error too): what is fuzzed is everything before it.
    rng = random.Random(33)
    flags = flags_of(["train", "--task", "multi30k"])
    assert {"--vocab-size", "--bf16", "--keep-last"} <= set(flags)
    for _ in range(25):
        check_run(random_argv(rng, ["train"], flags, ["--task", "multi30k", *TINY[:-2]]), playground)


def test_random_flags_of_translate_and_export(playground):
    rng = random.Random(34)
    translate, export = flags_of(["translate"]), flags_of(["export"])
    assert {"--checkpoint", "--beam", "--device"} <= set(translate) and {"--checkpoint", "--out"} <= set(export)
    for _ in range(20):
        check_run(random_argv(rng, ["translate"], translate, ["--checkpoint", rng.choice(["random.bin", "folder",
                                                                                          "run.json", "nowhere"])]),
                  playground, stdin=b"Ein Hund.\n")
        check_run(random_argv(rng, ["export", rng.choice(["huggingface", "onnx", ""])], export,
                              ["--checkpoint", rng.choice(["random.bin", "folder", "run.json"])]), playground)


def test_random_flags_of_generate(playground):
    # --model names a file that is no GGUF model (the flags may name another): every run ends in a
    # refusal or in --version, before any model is built.
    rng = random.Random(39)
    flags = flags_of(["generate"])
    assert {"--prompt", "--model", "--temperature", "--top-k", "--top-p", "--seed", "--no-chat"} <= set(flags)
    codes = [check_run(random_argv(rng, ["generate"], flags, ["--model", rng.choice(["random.bin", "folder", "run.json",
                                                                                      "nowhere"]), "--prompt", "Hi"]),
                       playground, stdin=rng.choice([b"Hallo.\n", b"", b"\xff\xfe"]))[0] for _ in range(40)]
    assert codes.count(2) >= 30


def test_translate_with_random_flags_and_text(playground):
    rng = random.Random(35)
    good = {"--beam": ["1", "2", "3"], "--length-penalty": ["0", "0.6", "2"], "--extra-len": ["0", "3", "50"],
            "--batch-tokens": ["1", "16", "4096"], "--int8": [], "--progress": [], "--no-progress": []}
    flags = sorted(good)
    assert set(flags) <= set(flags_of(["translate"]))
    codes = []
    words = ["Ein", "Mann", "fährt", "Fahrrad", ".", ",", "!", "Zwei", "Kinder", "spielen", "am", "Strand", "?", "ß",
             "\u200b", "\t", "😀", "Ω", "123"]
    for _ in range(8):
        text = "\n".join(" ".join(rng.choice(words) for _ in range(rng.randint(0, 12))) for _ in range(rng.randint(0, 3)))
        argv = random_argv(rng, ["translate"], flags, ["--checkpoint", str(MODEL), "--no-progress", "--device", "cpu",
                                                       "--threads", "1"], good)
        codes.append(check_run(argv, playground, stdin=text.encode("utf-8"))[0])
    assert codes.count(0) >= 2, codes


def mutated_config(rng: random.Random, config_class: type) -> dict:
    """The default configuration as JSON, with one to three fields given random values, removed or misspelled."""
    values = json.loads(json.dumps({k: v for k, v in vars(config_class()).items()}))
    for _ in range(rng.randint(1, 3)):
        field = rng.choice(sorted(values))
        roll = rng.random()
        if roll < 0.8:
            values[field] = rng.choice(JSON_VALUES)
        elif roll < 0.9:
            del values[field]
        else:
            values[field[::-1]] = values.pop(field)
    return values


@pytest.mark.parametrize("config_class", [TrainConfig, TranslationConfig])
def test_mutated_configurations_raise_only_type_or_value_errors_naming_a_field(config_class):
    rng = random.Random(36)
    names = [field for field in vars(config_class())]
    for _ in range(300):
        values = mutated_config(rng, config_class)
        try:
            config_class(**values)
        except TypeError as error:  # a wrong type, or an unknown field (the dataclass's own message)
            assert any(name in str(error) for name in names) or "unexpected keyword" in str(error), (values, error)
        except ValueError as error:
            assert any(name in str(error) for name in names), (values, error)


def test_mutated_config_files_are_usage_errors_naming_the_file(playground):
    rng = random.Random(37)
    for i in range(25):
        path = playground / f"mutated-{i}.json"
        text = json.dumps(mutated_config(rng, TrainConfig))
        if rng.random() < 0.3:  # bytes cut, doubled or flipped
            cut = rng.randrange(len(text))
            text = rng.choice([text[:cut], text[:cut] + text[cut:] * 2, text[:cut] + chr(rng.randrange(1, 0x2FF)) + text[cut + 1:]])
        path.write_text(text, encoding="utf-8")
        code, err = check_run(["train", *TINY, "--config", path.name, "--steps", "1"], playground)
        assert code == 0 or f"--config {path.name}" in err.splitlines()[-1], err


def test_random_bytes_as_files(playground):
    rng = random.Random(38)
    for i in range(10):
        path = playground / f"bytes-{i}"
        path.write_bytes(rng.randbytes(rng.choice([0, 1, 10, 1000, 100_000])))
        check_run(["train", *TINY, "--config", path.name], playground)
        check_run(["translate", "--checkpoint", path.name], playground, stdin=b"Hallo.\n")
        check_run(["export", "huggingface", "--checkpoint", path.name, "--out", "hf"], playground)


@pytest.mark.slow
@pytest.mark.parametrize("argv, stdin", [
    (["train", "--task", "multi30k", "--vocab-size", "0x10", "--bf16", "--checkpoint-dir", "folder/keep.txt"], b""),
    (["translate", "--checkpoint", "random.bin", "--beam", "2"], b"\xff\xfe\n"),
])
def test_commands_as_processes_print_no_traceback(playground, argv, stdin):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    before = snapshot(playground)
    done = subprocess.run([sys.executable, "-m", "transformer", *argv], input=stdin, capture_output=True,
                          cwd=playground, env=env, timeout=120)
    err = done.stderr.decode("utf-8", "replace")
    assert done.returncode == 2 and "Traceback" not in err and len(err.splitlines()) == 2, err
    assert changed_outside(before, snapshot(playground), []) == []


def damaged_files(folder: Path, rng: random.Random) -> list[Path]:
    """Files a loader may be given: random bytes, nothing, the committed model cut short or with flipped
    bytes, JSON, a folder, and a path with nothing there."""
    real = MODEL.read_bytes()
    contents = [rng.randbytes(n) for n in (1, 64, 5000)] + [b"", b'{"step": 1}', real[:100]]
    for _ in range(3):
        cut = rng.randrange(len(real))
        contents.append(real[:cut])
        flipped = bytearray(real)
        for i in rng.sample(range(len(real)), 3):
            flipped[i] ^= 0xFF
        contents.append(bytes(flipped))
    paths = []
    for i, content in enumerate(contents):
        path = folder / f"damaged-{i}.pt"
        path.write_bytes(content)
        paths.append(path)
    (folder / "a-folder.pt").mkdir()
    return paths + [folder / "a-folder.pt", folder / "nothing-here.pt"]


@pytest.mark.parametrize("loader", ["read_checkpoint", "load_checkpoint", "load_translator",
                                    pytest.param("train --resume", marks=pytest.mark.slow)])  # trains
def test_loaders_refuse_damaged_files_with_one_clear_error(tmp_path, monkeypatch, loader):
    from transformer.tasks.translation import load_translator
    from transformer.training.checkpoint import load_checkpoint, read_checkpoint

    monkeypatch.chdir(tmp_path)
    for path in damaged_files(tmp_path, random.Random(39)):
        if loader == "train --resume":  # the damaged file as the checkpoint of a run to resume
            run = tmp_path / f"run-{path.stem}"
            run.mkdir()
            if path.is_file():
                (run / "checkpoint.pt").write_bytes(path.read_bytes())
            check_run(["train", *TINY, "--checkpoint-dir", run.name, "--resume"], tmp_path)
            continue
        load = {"read_checkpoint": read_checkpoint, "load_checkpoint": load_checkpoint,
                "load_translator": load_translator}[loader]
        try:
            load(path)
        except (ValueError, OSError) as error:  # FileNotFoundError and IsADirectoryError are OSErrors
            assert path.name in str(error) and "weights_only" not in str(error), (path.name, error)
        except Exception as error:  # noqa: BLE001
            raise AssertionError(f"{loader}({path.name}) raised {type(error).__name__}: {error}") from error


@pytest.mark.parametrize("errors", ["strict", "replace"])
def test_translate_with_random_bytes_on_stdin(playground, errors):
    rng = random.Random(40)
    for _ in range(3):
        text = b"Ein Hund.\n" + rng.randbytes(rng.choice((1, 30))) + b"\nZwei Kinder.\n"
        check_run(["translate", "--checkpoint", str(MODEL), "--no-progress", "--device", "cpu", "--threads", "1",
                   "--errors", errors], playground, stdin=text)


# 1e6 with a checkpoint at every step: diverges after a step or two on every arithmetic path tried (1e5
# ran its 20 steps out on an AVX2 machine's kernels)
@pytest.mark.parametrize("extra", [["--lr-factor", "1e8"], ["--lr-factor", "1e6", "--save-every", "1"]])
def test_a_diverging_run_exits_2_in_one_line_and_leaves_no_nan_checkpoint(playground, extra):
    code, err = check_run(["train", *TINY, "--steps", "20", "--clip", "none", *extra, "--checkpoint-dir", "diverged"],
                          playground)
    assert code == 2 and "the run diverged at step" in err
    for path in (playground / "diverged").glob("*.pt"):
        state = torch.load(path, weights_only=True)["model"]
        assert all(torch.isfinite(tensor).all() for tensor in state.values()), path


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1e999"])
def test_non_finite_numbers_of_translate_are_usage_errors(playground, value):
    code, err = check_run(["translate", "--checkpoint", str(MODEL), "--beam", "2", f"--length-penalty={value}"],
                          playground, stdin=b"Ein Hund.\n")
    assert code == 2 and "--length-penalty must be a number >= 0 and finite" in err


# Every flag of every command (issue 47, item 5). The parsers are found by running each command up to its
# ``parse_args``: a flag a chapter adds is fuzzed here without editing this file; a command or task a chapter
# adds needs its required arguments in ``FLAG_BASES`` (the test says so).
#: Values for every flag that takes one: not a number, the infinities' edge, negative, zero, empty, huge.
EDGE_VALUES = ["nan", "inf", "-1", "0", "", "1e9", str(10**12)]
PARALLEL = {"--train-src": "src.txt", "--train-tgt": "tgt.txt", "--valid-src": "src.txt", "--valid-tgt": "tgt.txt"}
#: (command, task) -> the arguments a run needs, before the fuzzed flag (which overrides them), and its stdin.
FLAG_BASES: dict[tuple[str, str | None], tuple[list[str], bytes]] = {
    ("train", "numbers"): (["train", "--task", "numbers", *TINY, "--checkpoint-dir", "out"], b""),
    ("train", "multi30k"): (["train", "--task", "multi30k", *TINY, "--checkpoint-dir", "out"], b""),
    ("train", "translation"): (["train", "--task", "translation", *TINY, "--vocab-size", "40", "--max-len", "16",
                                "--checkpoint-dir", "out", *[x for pair in PARALLEL.items() for x in pair]], b""),
    ("train", "classify"): (["train", "--task", "classify", "--train", "labels.jsonl", "--valid", "labels.jsonl",
                             "--steps", "2", "--batch-size", "4", "--vocab-size", "40", "--length", "8",
                             "--no-progress", "--device", "cpu", "--checkpoint-dir", "out"], b""),
    ("translate", None): (["translate", "--checkpoint", str(MODEL), "--no-progress", "--device", "cpu",
                           "--threads", "1"], b"Ein Hund.\n"),
    ("classify", None): (["classify", "--checkpoint", str(ROOT / "models" / "spam-classifier" / "classifier.pt"),
                          "--input", "labels.jsonl"], b""),
    ("export", None): (["export", "huggingface", "--checkpoint", str(MODEL), "--out", "out"], b""),
    ("generate", None): (["generate", "--prompt", "Hello", "--max-new-tokens", "2", "--seed", "0",
                          "--num-threads", "1"], b""),
}


class _Parsed(Exception):
    """Raised in place of ``parse_args``: carries the parser a command built."""


def parser_of(argv: list[str]) -> argparse.ArgumentParser:
    """The parser that ``transformer ARGV`` parses its options with (the command stops before it parses)."""
    def caught(self, *args, **kwargs):
        raise _Parsed(self)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(argparse.ArgumentParser, "parse_args", caught)
        try:
            command(argv)
        except _Parsed as found:
            return found.args[0]
    raise AssertionError(f"transformer {argv!r} parsed no options")


def commands_and_tasks() -> list[tuple[str, str | None]]:
    """Every command of ``COMMANDS``, and every task of ``transformer train``."""
    from transformer.__main__ import COMMANDS
    from transformer.cli.train import TRAINERS

    return [("train", task) for task in TRAINERS] + [(name, None) for name in COMMANDS if name != "train"]


def flags_with_values(parser: argparse.ArgumentParser) -> list[tuple[str, int]]:
    """The flags of ``parser`` that take values: (flag, how many)."""
    found = []
    for action in parser._actions:
        if not action.option_strings or action.nargs == 0 or isinstance(action, (argparse._HelpAction,
                                                                                    argparse._VersionAction)):
            continue
        count = action.nargs if isinstance(action.nargs, int) else 1
        found.append((max(action.option_strings, key=len), count))
    return found


def flag_playground(folder: Path) -> None:
    """The files the bases name: JSON lines of labelled texts, and a parallel text."""
    rows = [{"text": f"{word} {i}", "label": "spam" if i % 2 else "ham"} for i, word in enumerate("abcdefgh")]
    (folder / "labels.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    (folder / "src.txt").write_text("ein hund .\nzwei katzen .\n" * 4, encoding="utf-8")
    (folder / "tgt.txt").write_text("a dog .\ntwo cats .\n" * 4, encoding="utf-8")


def ctrl_c_in_the_command(signum, frame) -> None:
    """SIGALRM's handler: a Ctrl-C as the command would get one, and only while it runs. One that came
    after the command returned (the test checking its files, on a busy machine) would stop the test
    run itself; and while the command holds Ctrl-C (``ctrl_c_held``, during an import) it gets a real
    SIGINT, which it takes when the import is done."""
    while frame is not None and frame.f_code is not run_command.__code__:
        frame = frame.f_back
    if frame is None:
        return  # the command has returned: the alarm came too late to stop it
    holder = signal.getsignal(signal.SIGINT)
    if callable(holder) and holder is not signal.default_int_handler:
        signal.raise_signal(signal.SIGINT)
    else:
        raise KeyboardInterrupt


def check_edge_run(argv: list[str], folder: Path, stdin: bytes, seconds: float = 5.0) -> int:
    """``check_run``, with Ctrl-C (SIGINT's KeyboardInterrupt) sent after ``seconds``: a value the command
    accepts (``--steps 10**12``) may mean a long run; stopped, it must end with 130 and one line."""
    before = snapshot(folder)
    saved = signal.signal(signal.SIGALRM, ctrl_c_in_the_command)  # the alarm is a Ctrl-C
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        return check_run(argv, folder, stdin)[0]
    except AssertionError as error:
        if "exited 130: " not in str(error):
            raise
        signal.setitimer(signal.ITIMER_REAL, 0)
        said = str(error).split("exited 130: ", 1)[1].splitlines()  # stderr, then pytest's "assert 130 in (0, 2)"
        lines = [line for line in said if line.strip() and not line.startswith("assert ")]
        assert len(lines) == 1 and "interrupted (Ctrl-C)" in lines[0], f"transformer {argv!r}: {lines}"
        outside = changed_outside(before, snapshot(folder), outputs(argv))
        assert outside == [], f"the interrupted transformer {argv!r} changed {outside}"
        return 130
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, saved)


@pytest.mark.slow  # runs every command once per flag
@pytest.mark.parametrize("where", commands_and_tasks(), ids=lambda w: "-".join(x for x in w if x))
def test_every_flag_with_edge_values(tmp_path, monkeypatch, where):
    assert where in FLAG_BASES, f"{where}: a new command or task: add the arguments a run needs to FLAG_BASES"
    base, stdin = FLAG_BASES[where]
    monkeypatch.chdir(tmp_path)
    flag_playground(tmp_path)
    flags = flags_with_values(parser_of(base[:3] if where[0] == "train" else base[:1]))
    assert len(flags) >= 2, flags
    # The base run first, without a Ctrl-C, so that every module the command imports is imported: a
    # Ctrl-C that lands inside a first import leaves the module half made, and importing it again in
    # this process can crash it (numpy's C core, re-initialised, segfaults). A command ends its process
    # after a Ctrl-C, so only this in-process test would import it again.
    check_run(base, tmp_path, stdin)
    shutil.rmtree(tmp_path / "out", ignore_errors=True)
    failures = []
    for flag, count in flags:
        for value in EDGE_VALUES:
            argv = [*base, flag, *[value] * count]
            try:
                check_edge_run(argv, tmp_path, stdin)
            except AssertionError as error:
                failures.append(f"{flag} {value!r}: {str(error)[-300:]}")
            for path in tmp_path.glob("out/**/*.pt"):  # no checkpoint with a non-finite weight
                state = torch.load(path, weights_only=True)
                model = state.get("model", {}) if isinstance(state, dict) else {}
                bad = [k for k, t in model.items() if torch.is_tensor(t) and t.is_floating_point()
                       and not torch.isfinite(t).all()]
                if bad:
                    failures.append(f"{flag} {value!r}: {path} holds non-finite {bad[:3]}")
            shutil.rmtree(tmp_path / "out", ignore_errors=True)
    assert not failures, "\n".join(failures)
