"""Tests of ``transformer train --task translation`` (chapters/scaling_out.md): a translator trained on
the user's own parallel text files, the files it refuses, and ``transformer translate`` with the result."""

import io
import sys

import pytest

from transformer.cli.train import TRAINERS, main
from transformer.cli.translate import main as translate_main
from transformer.tasks.multi30k import load_multi30k
from transformer.tasks.subwords import train_tokenizer
from transformer.tasks.translation import load_translator, translate
from transformer.training.checkpoint import read_checkpoint

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

SMALL = ["--d-model", "32", "--num-heads", "2", "--num-layers", "1", "--d-ff", "64", "--vocab-size", "300",
         "--batch-tokens", "512", "--steps", "4", "--warmup", "2", "--eval-size", "0", "--keep-last", "2",
         "--save-every", "2", "--no-progress", "--device", "cpu"]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """English to German (the other way round from the book's model): 120 pairs to train on, 8 to validate."""
    folder = tmp_path_factory.mktemp("parallel")
    german, english = load_multi30k("val")
    for name, lines in (("train.en", english[:120]), ("train.de", german[:120]), ("valid.en", english[120:128]),
                        ("valid.de", german[120:128])):
        (folder / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return folder


def options(folder, **paths):
    names = {"train_src": "train.en", "train_tgt": "train.de", "valid_src": "valid.en", "valid_tgt": "valid.de"}
    names.update(paths)
    return ["--task", "translation"] + [item for key, name in names.items()
                                        for item in (f"--{key.replace('_', '-')}", str(folder / name))]


def test_translation_is_a_registered_task():
    assert TRAINERS["translation"].__name__ == "translation_main"


def test_trains_on_the_given_files_and_the_result_translates(files, tmp_path, monkeypatch, capsys):
    run = tmp_path / "run"
    assert main([*options(files), *SMALL, "--checkpoint-dir", str(run)]) == 0
    out = capsys.readouterr().out
    assert "validation BLEU, greedy, average of the last 2 checkpoints" in out
    assert sorted(p.name for p in run.iterdir()) == ["averaged.pt", "checkpoint.pt", "step-000002.pt", "step-000004.pt"]
    # the vocabulary was learned from these files, both sides, as train_tokenizer learns it (the reference)
    english = (files / "train.en").read_text(encoding="utf-8").splitlines()
    german = (files / "train.de").read_text(encoding="utf-8").splitlines()
    assert read_checkpoint(run / "checkpoint.pt")["tokenizer"] == train_tokenizer([*english, *german], 300).to_str()
    model, tokenizer = load_translator(run / "averaged.pt")
    assert model.src_embed.vocab_size == tokenizer.get_vocab_size() <= 300 and model.src_embed.weight.shape[1] == 32
    monkeypatch.setattr(sys, "stdin", io.StringIO("A dog runs.\n\nTwo children play.\n"))
    assert translate_main(["--checkpoint", str(run / "averaged.pt"), "--no-progress", "--device", "cpu",
                           "--extra-len", "3"]) == 0
    lines = capsys.readouterr().out.split("\n")
    assert lines == [*translate(model, tokenizer, ["A dog runs.", "", "Two children play."], extra_len=3), ""]


def _write(folder, name, data: bytes):
    (folder / name).write_bytes(data)
    return name


@pytest.mark.parametrize("case, message", [
    ("short", "short.de has 7 lines but --valid-src has 8: line i of one must be the translation of line i"),
    ("empty", "empty.de is empty: it must hold one sentence a line"),
    ("blank", "blank.de, line 2: the line is empty, and every line must hold a sentence"),
    ("latin1", "latin1.de, line 1: the bytes b'\\xfc' at byte 3 are not UTF-8"),
    ("missing", "missing.de: cannot be read: No such file or directory"),
    ("folder", "folder.de: cannot be read: Is a directory"),
])
def test_files_that_cannot_train_are_refused_with_one_line_naming_them(files, tmp_path, capsys, case, message):
    german = (files / "valid.de").read_text(encoding="utf-8").splitlines()
    made = {"short": lambda: _write(tmp_path, "short.de", "\n".join(german[:7]).encode()),
            "empty": lambda: _write(tmp_path, "empty.de", b""),
            "blank": lambda: _write(tmp_path, "blank.de", ("\n".join([german[0], " ", *german[2:]])).encode()),
            "latin1": lambda: _write(tmp_path, "latin1.de", "\n".join(["Grün", *german[1:]]).encode("latin-1")),
            "missing": lambda: "missing.de",
            "folder": lambda: (tmp_path / "folder.de").mkdir() or "folder.de"}[case]()
    argv = options(files, valid_tgt=tmp_path / made)  # an absolute path: the folder is ignored
    run = tmp_path / "run"
    with pytest.raises(SystemExit) as stop:
        main([*argv, *SMALL, "--checkpoint-dir", str(run)])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "Traceback" not in err
    assert f"--valid-tgt {tmp_path / made}" in err.splitlines()[-1] and message in err.splitlines()[-1]
    assert not run.exists()  # refused before anything started


def test_the_help_names_the_files(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["--task", "translation", "--help"])
    shown = capsys.readouterr().out
    assert stop.value.code == 0 and all(f"--{name} FILE" in shown for name in ("train-src", "train-tgt", "valid-src",
                                                                              "valid-tgt"))
    assert "(any languages)" in shown and "--vocab-size" in shown


def test_a_pair_longer_than_max_len_is_refused_in_one_line(files, tmp_path, capsys):
    long = tmp_path / "long.en"
    lines = (files / "train.en").read_text(encoding="utf-8").splitlines()
    long.write_text("\n".join([" ".join(lines[:10]), *lines[1:]]) + "\n", encoding="utf-8")  # ten sentences in one
    with pytest.raises(SystemExit) as stop:
        main([*options(files, train_src=long), *SMALL, "--max-len", "64", "--checkpoint-dir", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "Traceback" not in err
    assert "more than max_len=64: raise max_len or leave such pairs out" in err.splitlines()[-1]


def test_a_diverging_translation_run_exits_2_in_one_line_and_leaves_no_nan_checkpoint(files, tmp_path, capsys):
    run = tmp_path / "run"
    diverging = [*SMALL, "--steps", "20", "--save-every", "1", "--lr-factor", "1e6", "--clip", "none"]
    assert main([*options(files), *diverging, "--checkpoint-dir", str(run)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "error: the run diverged at step " in err and "Traceback" not in err
    for path in run.glob("*.pt"):  # the checkpoints up to the last good step, and no averaged.pt
        read_checkpoint(path)  # refuses weights that are not finite
    assert not (run / "averaged.pt").exists()
    vocab_5 = [*SMALL, "--vocab-size", "5"]
    with pytest.raises(SystemExit) as stop:
        main([*options(files), *vocab_5, "--checkpoint-dir", str(tmp_path / "small")])
    assert stop.value.code == 2 and "vocab_size 5 is too small for this text" in capsys.readouterr().err
