"""Tests for transformer/cli/classify.py (chapters/classify_command.md): ``transformer train --task
classify``, ``transformer classify`` and the committed spam classifier, models/spam-classifier."""

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from transformer.__main__ import command
from transformer.cli.classify import load_classifier, read_jsonl, classifier_input

pytestmark = pytest.mark.usefixtures("one_thread")
ROOT = Path(__file__).resolve().parent.parent
TRANSLATOR = ROOT / "models" / "multi30k" / "model.pt"  # a checkpoint of another kind


def write_lines(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def toy_rows(n, seed):
    """Texts whose label is whether the word "refund" occurs in them."""
    rng = random.Random(seed)
    words = "the a meeting notes lunch plan code review friday office".split()
    rows = []
    for _ in range(n):
        label = rng.random() < 0.5
        text = rng.choices(words, k=8) + (["refund"] if label else [])
        rng.shuffle(text)
        rows.append({"text": " ".join(text), "label": "yes" if label else "no"})
    return rows


def test_read_jsonl_reads_objects_and_names_the_file_and_line_of_a_bad_one(tmp_path):
    good = tmp_path / "good.jsonl"
    good.write_text('{"text": "a", "label": 1}\n\n{"text": "b", "label": "x", "more": 2}\n', encoding="utf-8")
    assert read_jsonl(good, ("text", "label")) == [{"text": "a", "label": "1"}, {"text": "b", "label": "x", "more": 2}]
    cases = {'{"text": "a"}\n': "line 1: expected a JSON object", '{"text": "a", "label": "b"}\nnot json\n': "line 2: not JSON",
             '{"text": 3, "label": "b"}\n': "field 'text' must be a string", "\n": "no examples", "[1]\n": "line 1: expected"}
    for i, (content, message) in enumerate(cases.items()):
        path = tmp_path / f"bad{i}.jsonl"
        path.write_text(content, encoding="utf-8")
        with pytest.raises(ValueError, match=message) as error:
            read_jsonl(path, ("text", "label"))
        assert str(path) in str(error.value)
    (tmp_path / "latin.jsonl").write_bytes(b'{"text": "caf\xe9", "label": "a"}\n')
    with pytest.raises(ValueError, match="not UTF-8"):
        read_jsonl(tmp_path / "latin.jsonl", ("text",))
    with pytest.raises(FileNotFoundError, match="a directory"):
        read_jsonl(tmp_path, ("text",))


def test_a_raw_email_is_read_as_a_reader_reads_it():
    raw = "Subject: Cheap\nX-Spam-Status: Yes\nContent-Type: text/plain\n\nBuy now\n"
    assert classifier_input(raw, "email") == "Cheap\nBuy now"
    assert classifier_input(raw, "text") == raw
    undecodable = b"Subject: x\n\ncaf\xe9\n".decode("utf-8", "surrogateescape")  # Latin-1 bytes carried through JSON
    assert classifier_input(json.loads(json.dumps(undecodable)), "email").startswith("x\ncaf")


@pytest.mark.slow
def test_train_then_classify_learns_a_toy_task_and_keeps_the_order(tmp_path, capsys):
    train = write_lines(tmp_path / "train.jsonl", toy_rows(256, 0))
    valid = write_lines(tmp_path / "valid.jsonl", toy_rows(64, 1))
    test_rows = toy_rows(64, 2)
    test = write_lines(tmp_path / "test.jsonl", test_rows)
    out = tmp_path / "run"
    assert command(["train", "--task", "classify", "--train", str(train), "--valid", str(valid), "--steps", "150",
                    "--vocab-size", "60", "--length", "16", "--lr", "3e-3", "--checkpoint-dir", str(out)]) == 0
    assert f"checkpoint written to {out / 'classifier.pt'}" in capsys.readouterr().out
    assert command(["classify", "--checkpoint", str(out / "classifier.pt"), "--input", str(test)]) == 0
    answers = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(answers) == len(test_rows) and all(set(a) == {"label", "score"} for a in answers)
    right = sum(a["label"] == row["label"] for a, row in zip(answers, test_rows))
    assert right / len(test_rows) > 0.9  # in order: each answer is its own line's
    model, tokenizer, checkpoint = load_classifier(out / "classifier.pt")
    assert checkpoint["labels"] == ["no", "yes"] and checkpoint["reads"] == "text"
    assert not list(out.glob(".*tmp"))  # no temporary file left


def test_bad_files_are_refused_with_one_line_and_status_2(tmp_path, capsys):
    good = write_lines(tmp_path / "good.jsonl", toy_rows(8, 0))
    one_label = write_lines(tmp_path / "one.jsonl", [{"text": "a", "label": "x"}] * 3)
    not_a_checkpoint = tmp_path / "model.pt"
    torch.save({"task": "multi30k", "weights": 1}, not_a_checkpoint)
    cases = [
        (["classify", "--checkpoint", str(tmp_path / "none.pt"), "--input", str(good)], "no checkpoint at " + str(tmp_path / "none.pt")),
        (["classify", "--checkpoint", str(good), "--input", str(good)], "good.jsonl cannot be read as a torch checkpoint: it is not a torch file"),
        (["classify", "--checkpoint", str(not_a_checkpoint), "--input", str(good)],
         "model.pt is not a checkpoint of save_checkpoint (no 'model' and 'step' entries)"),
        (["classify", "--checkpoint", str(TRANSLATOR), "--input", str(good)],
         "model.pt is a translator's checkpoint, not a classifier's: load_checkpoint(path) loads any kind"),
        (["train", "--task", "classify", "--train", str(tmp_path / "x.jsonl"), "--valid", str(good)], "x.jsonl: no such file"),
        (["train", "--task", "classify", "--train", str(one_label), "--valid", str(good)], "two or more"),
    ]
    for argv, message in cases:
        with pytest.raises(SystemExit) as exit_:
            command(argv + ["--checkpoint-dir", str(tmp_path / "never")] if argv[0] == "train" else argv)
        err = capsys.readouterr().err.strip().splitlines()
        # the usage's first line (CommandParser), then one line naming the file
        assert exit_.value.code == 2 and message in err[-1] and err[-1].startswith("transformer"), (argv, err)
        assert err[0].startswith("usage:") and not any("Traceback" in line for line in err)
    assert not (tmp_path / "never").exists()  # a refused run leaves no folder


@pytest.mark.slow  # the command classifies the test emails (15 s on the busy 2-core machine)
def test_the_committed_spam_classifier_reproduces_its_figures(tmp_path, capsys):
    from transformer.tasks.email import write_spam_jsonl

    folder = ROOT / "models" / "spam-classifier"
    recorded = json.loads((folder / "results.json").read_text())
    files = write_spam_jsonl(tmp_path)
    assert command(["classify", "--checkpoint", str(folder / "classifier.pt"), "--input", str(files["test"])]) == 0
    answers = [json.loads(line)["label"] for line in capsys.readouterr().out.splitlines()]
    truth = [json.loads(line)["label"] for line in files["test"].open()]
    tp = sum(a == t == "spam" for a, t in zip(answers, truth))
    fp = sum(a == "spam" != t for a, t in zip(answers, truth))
    fn = sum(t == "spam" != a for a, t in zip(answers, truth))
    assert sum(a == t for a, t in zip(answers, truth)) / len(truth) == pytest.approx(recorded["test_accuracy"], abs=1e-9)
    assert 2 * tp / (2 * tp + fp + fn) == pytest.approx(recorded["test_spam_f1"], abs=1e-9)
    assert recorded["test_accuracy"] >= 0.95


def test_a_vocab_size_below_the_texts_characters_is_one_line_naming_the_flag(tmp_path, capsys):
    train = write_lines(tmp_path / "train.jsonl", toy_rows(32, 0))
    valid = write_lines(tmp_path / "valid.jsonl", toy_rows(8, 1))
    with pytest.raises(SystemExit) as stop:
        command(["train", "--task", "classify", "--train", str(train), "--valid", str(valid), "--vocab-size", "5",
                 "--checkpoint-dir", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "error: --vocab-size 5: vocab_size 5 is too small for this text" in err
    assert "Traceback" not in err and not (tmp_path / "run").exists()


def test_ctrl_c_stops_classify_and_its_trainer_with_130_and_one_line(tmp_path, capsys, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    rows = write_lines(tmp_path / "rows.jsonl", toy_rows(32, 0))
    monkeypatch.setattr("transformer.cli.classify.load_classifier", interrupted)
    assert command(["classify", "--checkpoint", "any.pt", "--input", str(rows)]) == 130
    assert capsys.readouterr().err == "transformer classify: interrupted (Ctrl-C)\n"
    monkeypatch.setattr("transformer.cli.classify.train_classifier", interrupted)
    assert command(["train", "--task", "classify", "--train", str(rows), "--valid", str(rows), "--vocab-size", "60",
                    "--checkpoint-dir", str(tmp_path / "run")]) == 130
    assert capsys.readouterr().err == "transformer train --task classify: interrupted (Ctrl-C); no checkpoint was saved\n"
    assert not (tmp_path / "run").exists()


def test_a_classifier_with_a_weight_that_is_not_finite_is_refused_naming_file_and_tensor(tmp_path):
    from transformer.training.checkpoint import read_torch_file, save_torch_file

    checkpoint = read_torch_file(Path(__file__).resolve().parents[1] / "models" / "spam-classifier" / "classifier.pt")
    name = next(iter(checkpoint["model"]))
    checkpoint["model"][name] = checkpoint["model"][name].clone().fill_(float("nan"))
    save_torch_file(checkpoint, tmp_path / "nan.pt")
    with pytest.raises(ValueError, match=rf"nan.pt: the weight '{name}' is not finite \(nan or inf\): refused"):
        load_classifier(tmp_path / "nan.pt")


# --- the manners of the other tasks (issue 46, item 5) ---------------------------------------------

TINY = ["--steps", "2", "--batch-size", "8", "--vocab-size", "60", "--length", "16", "--no-progress"]


def transformer(*argv: str, stdin: str | None = None, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """``python -m transformer ARGV`` as a reader runs it, one thread, output captured."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "transformer", *argv], input=stdin, cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def one_line_refusal(run: subprocess.CompletedProcess) -> str:
    """The error line of a command refused with status 2: the usage's first line, then it, and no more."""
    lines = run.stderr.strip().splitlines()
    assert run.returncode == 2 and len(lines) == 2 and lines[0].startswith("usage:"), run.stderr
    assert "error: " in lines[1] and "Traceback" not in run.stderr, run.stderr
    return lines[1]


@pytest.mark.slow  # trains a classifier
def test_a_finished_run_is_refused_and_resume_continues_it(tmp_path, capsys):
    train = write_lines(tmp_path / "train.jsonl", toy_rows(32, 0))
    valid = write_lines(tmp_path / "valid.jsonl", toy_rows(8, 1))
    run = ["train", "--task", "classify", "--train", str(train), "--valid", str(valid), *TINY,
           "--checkpoint-dir", str(tmp_path / "run")]
    first = transformer(*run)
    assert first.returncode == 0, first.stderr
    written = (tmp_path / "run" / "classifier.pt").read_bytes()
    line = one_line_refusal(transformer(*run))  # the same command again: refused, nothing replaced
    assert "holds a run already (checkpoint.pt, at step 2): pass --resume to continue it" in line
    assert (tmp_path / "run" / "classifier.pt").read_bytes() == written
    with pytest.raises(SystemExit) as stop:  # another run than the one saved
        command([*run, "--resume", "--seed", "1"])
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert stop.value.code == 2 and "cannot resume from" in line and "seed=0 there, 1 here" in line
    resumed = transformer(*run, "--resume", "--steps", "4", "--progress")
    assert resumed.returncode == 0, resumed.stderr
    assert f"resuming from {tmp_path / 'run' / 'checkpoint.pt'} at step 2 of 4" in resumed.stdout
    assert "training: " in resumed.stderr and "2/2" in resumed.stderr  # the progress bar, over the two new steps
    assert torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=True)["step"] == 4
    (tmp_path / "only").mkdir()  # a classifier without its run's state, as in models/: never replaced
    (tmp_path / "only" / "classifier.pt").write_bytes(written)
    with pytest.raises(SystemExit) as stop:
        command([*run[:-1], str(tmp_path / "only")])
    assert stop.value.code == 2 and "holds a classifier already (classifier.pt" in capsys.readouterr().err


def test_a_pretrained_encoder_reads_the_length_asked_for_past_its_own_positions(tmp_path):
    """models/spam-mlm was pre-trained on 64-token windows; --length 96 is read whole, not cut to 64."""
    words = "the a meeting notes lunch plan code review friday office".split()
    rows = [{"text": " ".join(words * 8), "label": label} for label in ("ham", "spam")]
    train, valid = write_lines(tmp_path / "train.jsonl", rows), write_lines(tmp_path / "valid.jsonl", rows)
    assert command(["train", "--task", "classify", "--train", str(train), "--valid", str(valid),
                    "--pretrained", str(ROOT / "models" / "spam-mlm"), "--length", "96", "--steps", "1",
                    "--batch-size", "2", "--no-progress", "--checkpoint-dir", str(tmp_path / "run")]) == 0
    model, tokenizer, checkpoint = load_classifier(tmp_path / "run" / "classifier.pt")
    assert checkpoint["length"] == 96 and model.positional_encoding.max_len == 96
    ids = torch.tensor([tokenizer.encode(rows[0]["text"]).ids[:96]])
    assert ids.shape == (1, 96)  # the text is longer than 96 tokens
    changed = ids.clone()
    changed[0, 90] = ids[0, 3] if ids[0, 3] != ids[0, 90] else ids[0, 4]  # one token past the 64th
    model.eval()
    with torch.no_grad():
        assert not torch.allclose(model(ids), model(changed))  # the model reads it


def test_a_pretrained_run_is_the_same_whatever_the_random_state_before_it(tmp_path):
    """--seed fixes the new head on a pre-trained encoder too: two runs that start from different global
    random states (as two processes do) end with the same weights. The head used to be drawn unseeded."""
    rows = toy_rows(24, 0)
    train, valid = write_lines(tmp_path / "train.jsonl", rows), write_lines(tmp_path / "valid.jsonl", rows[:8])
    weights = []
    for before in (1, 2):
        torch.manual_seed(before)
        assert command(["train", "--task", "classify", "--train", str(train), "--valid", str(valid),
                        "--pretrained", str(ROOT / "models" / "spam-mlm"), "--steps", "2", "--batch-size", "8",
                        "--seed", "7", "--no-progress", "--checkpoint-dir", str(tmp_path / f"run{before}")]) == 0
        weights.append(load_classifier(tmp_path / f"run{before}" / "classifier.pt")[0].state_dict())
    assert weights[0].keys() == weights[1].keys()
    for name, value in weights[0].items():
        assert torch.equal(value, weights[1][name]), name


@pytest.mark.parametrize("extra, message", [
    (["--lr", "nan"], "--lr must be a number > 0, got nan"),
    (["--lr", "-1"], "--lr must be a number > 0, got -1.0"),
    (["--length", "1e9"], "--length: expected a positive integer, got '1e9'"),
    (["--length", "1000000000"], "--length=1,000,000,000 is too large"),
    (["--pretrained", str(ROOT / "models" / "multi30k")], "is not a pre-trained encoder's folder: it has no tokenizer.json"),
    (["--pretrained", "FOLDER"], "not a masked language model ("),
    (["--checkpoint-dir", "FILE"], "cannot be written: "),
    (["--num-threads", "100000"], "--num-threads 100000 is more than the"),
    (["--save-every", "1"], "--save-every needs --checkpoint-dir"),
    (["--device", "cuda"], "--device cuda was asked for") if not torch.cuda.is_available() else
    (["--seed", "-1"], "--seed must be in [0, 2**64)"),
])
def test_a_bad_value_is_one_line_and_status_2_before_any_work(tmp_path, capsys, monkeypatch, extra, message):
    from transformer.training.checkpoint import read_torch_file, save_torch_file

    def no_work(*args, **kwargs):
        raise AssertionError("work was started before the options were checked")

    rows = write_lines(tmp_path / "rows.jsonl", toy_rows(16, 0))
    folder = tmp_path / "not-an-mlm"  # a model.pt of another kind (the digit detector's settings) and a tokenizer
    folder.mkdir()
    save_torch_file({**read_torch_file(ROOT / "models" / "digit-detector" / "model.pt")}, folder / "model.pt")
    (folder / "tokenizer.json").write_text("{}")
    extra = [{"FOLDER": str(folder), "FILE": str(rows)}.get(value, value) for value in extra]
    for name in ("train_classifier", "email_tokenizer"):
        monkeypatch.setattr(f"transformer.cli.classify.{name}", no_work)
    with pytest.raises(SystemExit) as stop:
        command(["train", "--task", "classify", "--train", str(rows), "--valid", str(rows), *TINY, *extra])
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and len(err) == 2 and message in err[1], err
    assert sorted(path.name for path in tmp_path.iterdir()) == ["not-an-mlm", "rows.jsonl"]  # no folder made


def test_a_run_stopped_and_resumed_ends_as_one_that_ran_through(tmp_path, capsys, monkeypatch):
    import transformer.training.loop as loop

    train = write_lines(tmp_path / "train.jsonl", toy_rows(32, 0))
    run = ["train", "--task", "classify", "--train", str(train), "--valid", str(train), *TINY, "--steps", "5"]
    assert command([*run, "--checkpoint-dir", str(tmp_path / "through")]) == 0
    step = loop.optimizer_step

    def ctrl_c_at_step_4(*args, **kwargs):
        if kwargs["step"] == 4:
            raise KeyboardInterrupt
        return step(*args, **kwargs)

    monkeypatch.setattr(loop, "optimizer_step", ctrl_c_at_step_4)
    stopped = [*run, "--checkpoint-dir", str(tmp_path / "stopped"), "--save-every", "2"]
    assert command(stopped) == 130
    assert capsys.readouterr().err.endswith(f"{tmp_path / 'stopped' / 'checkpoint.pt'} holds step 2 of 5: the same "
                                            "command with --resume goes on from there\n")
    monkeypatch.setattr(loop, "optimizer_step", step)
    assert command([*stopped, "--resume"]) == 0
    through, resumed = (load_classifier(tmp_path / name / "classifier.pt")[2]["model"] for name in ("through", "stopped"))
    assert all(torch.equal(through[name], resumed[name]) for name in through)
    histories = (torch.load(tmp_path / name / "checkpoint.pt", weights_only=True)["history"]["loss"]
                 for name in ("through", "stopped"))
    assert next(histories) == next(histories)  # five losses, the same


@pytest.mark.slow  # trains a classifier
def test_classify_reads_stdin_and_answers_every_line_on_its_line(tmp_path, capsys):
    train = write_lines(tmp_path / "train.jsonl", toy_rows(32, 0))
    assert command(["train", "--task", "classify", "--train", str(train), "--valid", str(train), *TINY,
                    "--checkpoint-dir", str(tmp_path / "run")]) == 0
    capsys.readouterr()
    checkpoint = str(tmp_path / "run" / "classifier.pt")
    lines = ['{"text": "refund the lunch", "id": 7}', "", '{"text": "meeting notes"}', "   ",
             '{"text": "refund", "id": "b"}']
    run = transformer("classify", "--checkpoint", checkpoint, "--input", "-", stdin="\n".join(lines) + "\n")
    assert run.returncode == 0, run.stderr
    out = run.stdout.split("\n")
    assert len(out) == len(lines) + 1 and out[-1] == "" and out[1] == out[3] == ""  # one line out per line in
    answers = [json.loads(line) for line in out if line]
    assert [answer.get("id") for answer in answers] == [7, None, "b"] and list(answers[0]) == ["id", "label", "score"]
    alone = write_lines(tmp_path / "texts.jsonl", [{"text": json.loads(line)["text"]} for line in lines if line.strip()])
    assert command(["classify", "--checkpoint", checkpoint, "--input", str(alone)]) == 0
    by_file = capsys.readouterr().out.splitlines()
    assert [{k: v for k, v in a.items() if k != "id"} for a in answers] == [json.loads(line) for line in by_file]
    line = one_line_refusal(transformer("classify", "--checkpoint", checkpoint, "--input", "-",
                                        stdin='{"text": "a"}\n\n{"txt": "b"}\n'))
    assert "stdin, line 3: expected a JSON object with fields ['text']" in line
