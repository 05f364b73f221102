"""Tests of transformer.cli.train and transformer.cli.options: the command line, and data parallelism over two CPU processes."""

import dataclasses
import json
import os
import re
import subprocess
import signal
import sys
import time
from pathlib import Path

import pytest
from processes import interruptible, run_ranks
import torch

import transformer
from transformer.tasks.numbers import make_batch, source_vocab, target_vocab
from transformer.nn.model import Transformer
from transformer.cli.options import config_from_args, field_docs
from transformer.training.distributed import DataParallelHooks, init_distributed, replica_difference, shard_batch
from transformer.cli.train import build_numbers_parser, check_numbers_arguments, main, run_training
from transformer.training.config import TrainConfig
from transformer.training.losses import label_smoothed_cross_entropy

# The package under test, also for the processes the tests start.
ROOT = Path(transformer.__file__).resolve().parent.parent
# A model small enough to train a few steps in well under a second. 19 numbers in batches of 8
# give batches of 8, 8 and 3 sequences: the short one splits unevenly (2 and 1) over two processes.
TINY = ["--d-model", "16", "--num-layers", "1", "--num-heads", "2", "--d-ff", "32", "--dropout", "0",
        "--warmup", "4", "--batch-size", "8", "--train-size", "19", "--valid-size", "8", "--no-progress",
        "--device", "cpu"]
TIMEOUT = 120  # seconds for a started process; a healthy one takes a few


def _env(**extra: str) -> dict[str, str]:
    """The environment of a child process: this package first, one thread, no torchrun leftovers."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    return {**env, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **extra}


@pytest.fixture(autouse=True)
def _alone(monkeypatch):
    """Every test starts as a process that torchrun did not start."""
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)


def _numbers_batch():
    src_vocab, tgt_vocab = source_vocab(), target_vocab()
    return make_batch([7, 777_777, 15, 40_002, 123], src_vocab, tgt_vocab), tgt_vocab


# --- the command line -------------------------------------------------------------------------

def test_defaults_are_the_training_config_and_options_fill_fields_by_name():
    args = build_numbers_parser().parse_args([])
    assert config_from_args(args) == TrainConfig()
    assert args.device == ("cuda" if torch.cuda.is_available() else "cpu")
    args = build_numbers_parser().parse_args(["--d-model", "32", "--num-layers", "3", "--num-heads", "8",
                                      "--d-ff", "48", "--steps", "9", "--batch-size", "6", "--warmup", "5",
                                      "--seed", "4", "--dropout", "0.25"])
    config = config_from_args(args)
    assert (config.d_model, config.num_layers, config.num_heads, config.d_ff) == (32, 3, 8, 48)
    assert (config.steps, config.batch_size, config.warmup, config.seed, config.dropout) == (9, 6, 5, 4, 0.25)


def test_options_fill_the_fields_of_the_given_default_and_keep_its_type():
    from transformer.tasks.multi30k import TranslationConfig

    args = build_numbers_parser().parse_args(["--d-model", "32", "--steps", "9"])
    config = config_from_args(args, TrainConfig(max_len=40, lr_factor=2.0))  # not given: the default's
    assert type(config) is TrainConfig and (config.d_model, config.steps) == (32, 9)
    assert (config.max_len, config.lr_factor) == (40, 2.0)
    translation = config_from_args(args, TranslationConfig(batch_tokens=1000))
    assert type(translation) is TranslationConfig and (translation.d_model, translation.steps) == (32, 9)
    assert translation.batch_tokens == 1000 and translation.vocab_size == TranslationConfig().vocab_size


def test_refuses_an_unknown_task(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--task", "wmt14"])
    assert exit_.value.code == 2
    assert "argument --task: invalid choice: 'wmt14'" in capsys.readouterr().err


@pytest.mark.parametrize("option, value, message", [
    ("--steps", "0", "steps must be a positive int, got 0"),
    ("--batch-size", "-2", "batch_size must be a positive int, got -2"),
    ("--d-model", "ten", "invalid int value: 'ten'"),
    ("--label-smoothing", "1.5", "label_smoothing must be in [0, 1), got 1.5"),
    ("--clip", "-1", "clip must be a number > 0, got -1.0"),
])
def test_refuses_a_value_the_config_refuses_naming_the_flag(capsys, option, value, message):
    with pytest.raises(SystemExit) as exit_:
        build_numbers_parser().parse_args([option, value])
    assert exit_.value.code == 2
    assert f"argument {option}: {message}" in capsys.readouterr().err.strip().splitlines()[-1]


def test_every_config_field_is_a_flag_with_its_docstring_as_help():
    from transformer.tasks.multi30k import TranslationConfig
    from transformer.cli.train import build_multi30k_parser

    for parser, config_class in ((build_numbers_parser(), TrainConfig), (build_multi30k_parser(), TranslationConfig)):
        docs = field_docs(config_class)
        help_text = " ".join(parser.format_help().split())
        for field in dataclasses.fields(config_class):
            assert docs[field.name], field.name  # every field is documented where it is defined
            assert f"--{field.name.replace('_', '-')}" in help_text
            assert " ".join(docs[field.name].split()) in help_text, field.name
    # A subclass's own fields and its new docstring for an inherited one.
    assert field_docs(TranslationConfig)["vocab_size"].startswith("Size of the joint BPE vocabulary")
    assert field_docs(TranslationConfig)["batch_size"] != field_docs(TrainConfig)["batch_size"]


def test_a_new_config_field_becomes_a_flag():
    @dataclasses.dataclass
    class Wider(TrainConfig):
        width_factor: float = 1.0
        """How much wider."""

    from transformer.cli.options import add_config_options
    import argparse

    parser = argparse.ArgumentParser()
    add_config_options(parser, Wider())
    assert "How much wider. (default: 1.0)" in " ".join(parser.format_help().split())
    config = config_from_args(parser.parse_args(["--width-factor", "2.5"]), Wider())
    assert isinstance(config, Wider) and config.width_factor == 2.5


def test_flags_set_every_field_of_the_config():
    args = build_numbers_parser().parse_args(["--label-smoothing", "0.2", "--clip", "none", "--lr-factor", "2",
                                      "--eval-every", "7", "--max-len", "20", "--num-threads", "none",
                                      "--betas", "0.8", "0.9", "--adam-eps", "1e-8", "--eval-size", "0"])
    config = config_from_args(args)
    assert config == TrainConfig(label_smoothing=0.2, clip=None, lr_factor=2.0, eval_every=7, max_len=20,
                                 num_threads=None, betas=(0.8, 0.9), adam_eps=1e-8, eval_size=0)


def test_a_config_file_fills_the_fields_and_flags_override_it(tmp_path):
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"d_model": 32, "steps": 50, "clip": None, "betas": [0.8, 0.9]}))
    config = config_from_args(build_numbers_parser().parse_args(["--config", str(path), "--steps", "70"]))
    assert config == TrainConfig(d_model=32, steps=70, clip=None, betas=(0.8, 0.9))


@pytest.mark.parametrize("content, message", [
    ('{"d_modle": 32}', "d_modle not a field of TrainConfig"),
    ('[32]', "must hold a JSON object of fields, got list"),
    ('{"steps": 0}', "steps must be a positive int, got 0"),
    ("{steps: 5", "is not JSON"),
])
def test_a_bad_config_file_is_a_usage_error(tmp_path, capsys, content, message):
    path = tmp_path / "run.json"
    path.write_text(content)
    with pytest.raises(SystemExit) as stop:
        main([*TINY, "--config", str(path)])
    assert stop.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert "error:" in error and message in error and "Traceback" not in error


def test_a_missing_config_file_is_a_usage_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        main([*TINY, "--config", str(tmp_path / "nowhere.json")])
    assert stop.value.code == 2 and "nowhere.json cannot be read" in capsys.readouterr().err


def test_refuses_a_global_batch_the_processes_cannot_share(monkeypatch, capsys):
    with pytest.raises(ValueError, match="--batch-size 10 cannot be split evenly over 4 processes"):
        check_numbers_arguments(build_numbers_parser().parse_args(["--batch-size", "10"]), world_size=4)
    check_numbers_arguments(build_numbers_parser().parse_args(["--batch-size", "12"]), world_size=4)
    # Under torchrun the command refuses it before joining the other processes (which would hang).
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(SystemExit) as exit_:
        main(TINY + ["--batch-size", "8"])
    assert exit_.value.code == 2
    assert "--batch-size 8 cannot be split evenly over 3 processes" in capsys.readouterr().err


def test_refuses_cuda_without_a_gpu_and_save_every_without_a_folder(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="--device cuda"):
        check_numbers_arguments(build_numbers_parser().parse_args(["--device", "cuda"]))
    with pytest.raises(ValueError, match="--save-every needs --checkpoint-dir"):
        check_numbers_arguments(build_numbers_parser().parse_args(["--save-every", "5"]))


@pytest.mark.slow  # a process training a model
def test_command_runs_saves_a_checkpoint_and_resumes_from_it(tmp_path, capsys):
    folder = tmp_path / "run"
    # Without a cooldown, a run of 3 steps is the start of a run of 5, so carrying it on to 5 steps must
    # give the straight run of 5 (with one, its rate would already have fallen to zero at step 3).
    paper = [*TINY, "--cooldown", "0"]
    first = subprocess.run([sys.executable, "-m", "transformer.train", *paper, "--steps", "3",
                            "--checkpoint-dir", str(folder)],
                           cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=TIMEOUT)
    assert first.returncode == 0, first.stderr
    assert "validation exact match:" in first.stdout
    checkpoint = folder / "checkpoint.pt"
    # the README's way of asking the trained model runs on the file alone (3 steps: answers, not right ones)
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    ask = readme.split("To ask the trained model", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    assert '"runs/numbers/checkpoint.pt"' in ask
    exec(ask.replace("runs/numbers/checkpoint.pt", checkpoint.as_posix()), {})  # noqa: S102 - the README's own code
    answers = capsys.readouterr().out.strip()
    assert answers.startswith("[") and answers.count(",") == 2, answers
    assert torch.load(checkpoint, weights_only=True)["step"] == 3
    # On to step 5, in this process: the command resumes from the checkpoint ...
    main(paper + ["--steps", "5", "--checkpoint-dir", str(folder), "--resume"])
    assert f"resuming from {checkpoint}" in capsys.readouterr().out
    resumed = torch.load(checkpoint, weights_only=True)
    assert resumed["step"] == 5 and resumed["history"]["step"] == [1, 2, 3, 4, 5]
    # ... and ends where an uninterrupted run of 5 steps ends.
    main(paper + ["--steps", "5", "--checkpoint-dir", str(tmp_path / "straight")])
    straight = torch.load(tmp_path / "straight" / "checkpoint.pt", weights_only=True)
    assert resumed["model"].keys() == straight["model"].keys()
    for name, value in straight["model"].items():
        torch.testing.assert_close(resumed["model"][name], value, rtol=0, atol=0, msg=name)


# --- sharding and the weighted gradient -------------------------------------------------------

@pytest.mark.parametrize("world_size", [1, 2, 3, 5])
def test_shards_are_consecutive_blocks_that_make_up_the_batch(world_size):
    batch, _ = _numbers_batch()
    shards = [shard_batch(batch, rank, world_size) for rank in range(world_size)]
    sizes = [shard.src.shape[0] for shard in shards]
    assert sum(sizes) == 5 and max(sizes) - min(sizes) <= 1
    for whole, *parts in zip(batch, *shards):
        assert torch.equal(torch.cat(parts), whole)


def test_shard_refuses_a_bad_rank_and_a_batch_too_small_to_share():
    batch, _ = _numbers_batch()
    with pytest.raises(ValueError, match=r"rank must be in \[0, 2\), got 2"):
        shard_batch(batch, 2, 2)
    with pytest.raises(ValueError, match="a batch of 5 sequences cannot give each of 6 processes a row"):
        shard_batch(batch, 0, 6)


def test_token_weighted_shard_gradients_sum_to_the_whole_batch_gradient():
    batch, tgt_vocab = _numbers_batch()
    torch.manual_seed(0)
    model = Transformer(len(source_vocab()), len(tgt_vocab), d_model=16, num_heads=2, num_layers=1, d_ff=32,
                        dropout=0.0, pad_id=0).double()

    def gradients(b):
        model.zero_grad()
        label_smoothed_cross_entropy(model(b.src, b.tgt_in, b.src_mask, b.tgt_mask), b.tgt_out).backward()
        return [p.grad.clone() for p in model.parameters()]

    hooks = [DataParallelHooks(rank, 2, pad_id=0) for rank in range(2)]
    per_rank = [gradients(h.on_step_begin(1, batch)) for h in hooks]
    shares = [h.token_share for h in hooks]
    counts = [int((shard_batch(batch, r, 2).tgt_out != 0).sum()) for r in range(2)]
    assert shares == pytest.approx([c / sum(counts) for c in counts]) and counts[0] != counts[1]
    for whole, g0, g1 in zip(gradients(batch), *per_rank):
        torch.testing.assert_close(shares[0] * g0 + shares[1] * g1, whole)


def test_without_torchrun_a_process_runs_alone_and_joins_no_group():
    assert init_distributed("cpu") == (0, 1, torch.device("cpu"))
    assert not torch.distributed.is_initialized()
    assert replica_difference(torch.nn.Linear(2, 2)) == 0.0


def test_data_parallel_options_are_nothing_alone_and_the_hooks_in_a_group():
    from transformer.training.distributed import data_parallel_options

    assert data_parallel_options(0, 1) == {}
    options = data_parallel_options(1, 3, pad_id=0)
    assert set(options) == {"wrap_model", "callbacks"}
    [hooks] = options["callbacks"]
    assert isinstance(hooks, DataParallelHooks) and (hooks.rank, hooks.world_size) == (1, 3)
    assert options["wrap_model"].__self__ is hooks  # one set of hooks: the callback's share is what wrap weights by


# --- two processes ----------------------------------------------------------------------------

# One rank of a two-process run: run_training as under torchrun, then save what it learned.
RANK_SCRIPT = """
import sys, torch
from transformer.cli.train import build_numbers_parser, run_training
torch.set_num_threads(1)
torch.set_default_dtype(torch.float64)
model = run_training(build_numbers_parser().parse_args(sys.argv[2:]))
torch.save(model.state_dict(), sys.argv[1])
"""


@pytest.mark.slow  # two processes under torch.distributed
def test_two_processes_keep_identical_replicas_equal_to_one_process(tmp_path):
    argv = TINY + ["--steps", "6"]  # two epochs of batches of 8, 8 and 3 sequences
    # A file in tmp_path is the meeting place: no network port to find, nothing shared between tests.
    meet = ["--init-method", f"file://{tmp_path / 'meet'}"]
    run_ranks([[sys.executable, "-c", RANK_SCRIPT, str(tmp_path / f"rank{r}.pt"), *argv, *meet] for r in range(2)],
              [_env(RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE="2") for r in range(2)], tmp_path, TIMEOUT)
    replicas = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(2)]
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)  # the model is built in float64, as in RANK_SCRIPT; see below
    try:
        alone = run_training(build_numbers_parser().parse_args(argv)).state_dict()
    finally:
        torch.set_default_dtype(previous)
    for name, value in alone.items():
        # (a) DDP gives every replica the same combined gradient: the replicas agree bit for bit.
        assert torch.equal(replicas[0][name], replicas[1][name]), name
        # (b) Token-weighted gradients are the one-process gradient of the same global batch, up to
        # the order of float additions (two partial sums instead of one). In float32 that rounding
        # would not stay small: some gradients are exactly zero in exact arithmetic (the key bias
        # shifts all scores of a query alike, which softmax ignores), and Adam divides such a
        # gradient's rounding noise, about 1e-9, by its own size plus eps = 1e-9, turning noise into
        # steps of the size of the learning rate. In float64 the noise stays far below eps.
        # Measured: about 1e-15 for most parameters, 1e-9 for the key biases; averaging the
        # gradients instead of weighting them by tokens misses by about 0.1.
        torch.testing.assert_close(replicas[0][name], value, rtol=1e-7, atol=1e-7, msg=name)


# Issue 13: usage errors, not tracebacks; resuming says where it stands.

@pytest.mark.parametrize("options, message", [
    (["--d-model", "30", "--num-heads", "4"], "d_model must be divisible by num_heads"),
    (["--dropout", "1.5"], r"dropout must be in \[0, 1\), got 1.5"),
])
def test_model_settings_that_cannot_build_are_usage_errors(options, message, capsys):
    with pytest.raises(SystemExit) as stop:
        main([*TINY, *options])
    assert stop.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert "error:" in error and re.search(message, error) and "Traceback" not in error


def test_a_checkpoint_dir_that_cannot_be_written_is_refused_before_training(tmp_path, capsys):
    (tmp_path / "file").write_text("not a folder")
    with pytest.raises(SystemExit) as stop:
        main([*TINY, "--checkpoint-dir", str(tmp_path / "file" / "run")])
    assert stop.value.code == 2
    assert re.search(r"error: --checkpoint-dir .*file/run cannot be written", capsys.readouterr().err)
    assert not (tmp_path / "file" / "run").exists()


def test_resuming_says_from_which_step_refuses_other_settings_and_knows_a_finished_run(tmp_path, capsys):
    folder = str(tmp_path / "run")
    main([*TINY, "--steps", "2", "--checkpoint-dir", folder])
    capsys.readouterr()
    # Without --resume, a folder that holds a run is refused, and the run is left as it was.
    with pytest.raises(SystemExit) as stop:
        main([*TINY, "--steps", "3", "--checkpoint-dir", folder])
    assert stop.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert "holds a run already (checkpoint.pt, at step 2): pass --resume to continue it" in error
    assert torch.load(Path(folder) / "checkpoint.pt", weights_only=True)["step"] == 2
    main([*TINY, "--steps", "3", "--checkpoint-dir", folder, "--resume"])
    assert "at step 2 of 3" in capsys.readouterr().out
    main([*TINY, "--steps", "3", "--checkpoint-dir", folder, "--resume"])
    assert "the run is already complete, step 3 of 3" in capsys.readouterr().out
    with pytest.raises(SystemExit) as stop:
        main([*TINY, "--steps", "4", "--d-model", "32", "--checkpoint-dir", folder, "--resume"])
    assert stop.value.code == 2
    assert "cannot resume from" in capsys.readouterr().err


def test_resume_needs_a_checkpoint_dir_and_starts_afresh_in_an_empty_one(tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        main([*TINY, "--resume"])
    assert stop.value.code == 2 and "--resume needs --checkpoint-dir" in capsys.readouterr().err
    with pytest.raises(SystemExit) as stop:  # a mistyped folder continues nothing (issue 32)
        main([*TINY, "--steps", "2", "--checkpoint-dir", str(tmp_path / "new"), "--resume"])
    assert stop.value.code == 2 and "does not exist, so there is no run to continue" in capsys.readouterr().err
    (tmp_path / "new").mkdir()
    main([*TINY, "--steps", "2", "--checkpoint-dir", str(tmp_path / "new"), "--resume"])
    out = capsys.readouterr().out
    assert "resuming" not in out and "yet: starting from step 0" in out
    assert torch.load(tmp_path / "new" / "checkpoint.pt", weights_only=True)["step"] == 2


# --- the installed command ----------------------------------------------------------------------

def _command(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "transformer", *argv], cwd=ROOT, env=_env(),
                          capture_output=True, text=True, timeout=TIMEOUT)


@pytest.mark.slow
def test_the_transformer_command_lists_its_commands_and_passes_each_its_options():
    listing = _command("--help")
    assert listing.returncode == 0 and "train" in listing.stdout and "translate" in listing.stdout
    train = _command("train", "--help")
    assert train.returncode == 0 and train.stdout.startswith("usage: transformer train")
    assert "--label-smoothing" in train.stdout and "--resume" in train.stdout
    multi30k = _command("train", "--task", "multi30k", "--help")
    assert multi30k.returncode == 0 and multi30k.stdout.startswith("usage: transformer train --task multi30k")
    assert "--batch-tokens" in multi30k.stdout
    translate = _command("translate", "--help")
    assert translate.returncode == 0 and translate.stdout.startswith("usage: transformer translate")


def test_the_command_list_names_every_task_that_train_accepts(capsys):
    from transformer.__main__ import command
    from transformer.cli.train import TRAINERS

    assert command(["--help"]) == 0
    train_line = next(line for line in capsys.readouterr().out.splitlines() if line.strip().startswith("train "))
    assert sorted(TRAINERS) == ["classify", "multi30k", "numbers", "translation"]
    assert all(f"--task {task}" in train_line for task in TRAINERS), train_line


@pytest.mark.parametrize("argv, message", [
    ([], "usage: transformer {train,translate,classify,generate,export}"),
    (["fly"], "transformer: error: unknown command 'fly' (choose from train, translate, classify, generate, export)"),
])
def test_the_transformer_command_without_a_known_command_exits_2(argv, message, capsys):
    from transformer.__main__ import command

    assert command(argv) == 2
    assert message in capsys.readouterr().err


def test_the_transformer_command_hands_usage_errors_of_a_command_on(capsys):
    from transformer.__main__ import command

    with pytest.raises(SystemExit) as stop:
        command(["train", "--steps", "0"])
    assert stop.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert error[0].startswith("usage: transformer train")
    assert error[-1] == "transformer train: error: argument --steps: steps must be a positive int, got 0"


# Issue 32: the commands' manners: two-line usage errors, --version, the registry of trainers.
@pytest.mark.parametrize("argv, prog", [
    (["train", "--steps", "0"], "transformer train"),
    (["train", "--task", "fly"], "transformer train"),
    (["train", "--task", "multi30k", "--vocab-size", "x"], "transformer train --task multi30k"),
    (["translate"], "transformer translate"),
    (["translate", "--checkpoint", "x", "--beam", "0"], "transformer translate"),
    (["export", "onnx"], "transformer export"),
    (["--frobnicate"], "transformer"),
    (["fly"], "transformer"),
])
def test_a_usage_error_is_the_usage_line_and_one_message(argv, prog, capsys):
    from transformer.__main__ import command

    try:
        code = command(argv)
    except SystemExit as stop:
        code = stop.code
    assert code == 2
    error = capsys.readouterr().err.splitlines()
    assert len(error) == 2, error
    assert error[0].startswith(f"usage: {prog}") and error[1].startswith(f"{prog}: error: ")


@pytest.mark.parametrize("argv", [["--version"], ["train", "--version"], ["train", "--task", "multi30k", "--version"],
                                  ["translate", "--version"], ["export", "--version"]])
def test_every_command_answers_version(argv, capsys):
    from transformer.__main__ import command
    from transformer.cli.options import package_version

    try:
        code = command(argv)
    except SystemExit as stop:
        code = stop.code
    out = capsys.readouterr().out
    assert code in (0, None) and out == f"transformer {package_version()}\n"
    assert re.fullmatch(r"\d+\.\d+\.\d+\S*", package_version())


def test_the_tasks_are_the_keys_of_the_trainers_table(monkeypatch, capsys):
    from transformer.cli import train

    assert list(train.TRAINERS)[:2] == ["numbers", "multi30k"]
    calls = []
    monkeypatch.setitem(train.TRAINERS, "echo", lambda argv, prog: calls.append((list(argv), prog)) or 0)
    assert train.main(["--task", "echo", "--x"], prog="transformer train") == 0
    assert calls == [(["--task", "echo", "--x"], "transformer train")]
    with pytest.raises(SystemExit):
        train.main(["--help"])
    assert "echo" in capsys.readouterr().out  # --task's choices are read when the parser is built


# Issue 43: `transformer train TASK ...`, one parser and one --help per task; `--task TASK` keeps working.
def test_train_help_lists_the_tasks_and_each_task_has_its_own_help(capsys):
    from transformer.cli import train

    with pytest.raises(SystemExit) as stop:
        train.main(["--help"], prog="transformer train")
    listing = capsys.readouterr().out
    assert stop.value.code == 0 and all(task in listing for task in train.TRAINERS)
    assert "train TASK --help" in listing and "--reads" not in listing
    for argv in (["classify", "--help"], ["--task", "classify", "--help"]):
        with pytest.raises(SystemExit) as stop:
            train.main(argv, prog="transformer train")
        classify = capsys.readouterr().out
        assert stop.value.code == 0 and "--reads {text,email}" in classify and "--label-smoothing" not in classify
    with pytest.raises(SystemExit) as stop:
        train.main(["multi30k", "--help"], prog="transformer train")
    assert stop.value.code == 0 and "--batch-tokens" in capsys.readouterr().out


def test_the_subcommand_and_the_task_option_parse_to_the_same_options(monkeypatch):
    from transformer.cli import train

    parsed = []
    for name, build in (("multi30k", train.build_multi30k_parser), ("numbers", train.build_numbers_parser)):
        monkeypatch.setitem(train.TRAINERS, name,
                            lambda argv, prog, build=build: parsed.append(vars(build(prog).parse_args(argv))) or 0)
        options = ["--steps", "7", "--seed", "3", "--no-progress"]
        assert train.main([name, *options], prog="transformer train") == 0
        assert train.main(["--task", name, *options], prog="transformer train") == 0
        assert parsed[-1] == parsed[-2] and parsed[-1]["steps"] == 7 and parsed[-1]["task"] == name
    assert train.main(["--steps", "7", "--seed", "3", "--no-progress"], prog="transformer train") == 0
    assert parsed[-1] == parsed[-2]  # no task: the number words


@pytest.mark.parametrize("argv", [["wmt14"], ["wmt14", "--steps", "3"], ["--task", "wmt14"]])
def test_an_unknown_task_is_a_usage_error_of_one_message(argv, capsys):
    from transformer.__main__ import command

    with pytest.raises(SystemExit) as stop:
        command(["train", *argv])
    error = capsys.readouterr().err.splitlines()
    assert stop.value.code == 2 and len(error) == 2, error
    assert error[0] == "usage: transformer train [TASK | --task TASK] [options]"
    assert error[1].startswith("transformer train: error: argument --task: invalid choice: 'wmt14'")


# Issue 32: settings checked before anything starts, each message naming the file, field or flag.
@pytest.mark.parametrize("content, message", [
    (b'{"betas": [0.9, "x"]}', r"--config \S+run.json: betas\[1\] must be a float in \[0, 1\), got str 'x'"),
    (b'{"betas": 0.9}', r"--config \S+run.json: betas must be two numbers \(beta1, beta2\), got 0.9"),
    (b'{"adam_eps": -1}', r"--config \S+run.json: adam_eps must be a number > 0, got -1"),
    (b'{"seed": 1.5}', r"--config \S+run.json: seed must be a non-negative int, got float 1.5"),
    (b'{"d_model": 1e2}', r"--config \S+run.json: d_model must be a positive int, got float 100.0"),
    (b"\x80\x81\xfe\x00binary", r"--config \S+run.json is not a text file"),
    (b"[" * 100_000, r"--config \S+run.json is not JSON"),
    (b'{"steps": 1' + b"0" * 5000 + b"}", r"--config \S+run.json is not JSON"),
    (b'"d_model"', r"--config \S+run.json must hold a JSON object of fields, got str"),
])
def test_a_config_file_is_checked_field_by_field_naming_the_file(tmp_path, capsys, content, message):
    path = tmp_path / "run.json"
    path.write_bytes(content)
    with pytest.raises(SystemExit) as stop:
        main([*TINY, "--config", str(path), "--checkpoint-dir", str(tmp_path / "run")])
    assert stop.value.code == 2
    error = capsys.readouterr().err.splitlines()
    assert len(error) == 2 and re.search(message, error[1]), error
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.json"]  # the refused run left no folder


def test_a_config_file_that_is_a_folder_is_named(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main([*TINY, "--config", str(tmp_path)])
    assert f"--config {tmp_path} cannot be read: Is a directory" in capsys.readouterr().err


@pytest.mark.parametrize("options, message", [
    (["--max-len", "4"], r"--max-len 4 is too short: the longest example, \d+ \('[a-z -]+'\), has \d words"),
    (["--betas", "2", "3"], r"betas\[0\] must be in \[0, 1\), got 2.0"),
    (["--adam-eps", "inf"], "adam_eps must be a finite number > 0, got inf"),
    (["--train-size", "999999", "--valid-size", "2"], "add up to more than the 1,000,000 numbers"),
    (["--num-layers", "100000000"], r"parameters: training it needs [\d,.]+ GiB or more"),
    (["--d-model", "1" + "0" * 400], r"--d-model 10+ is beyond any machine"),
    (["--num-threads", "100000"], "--num-threads 100000 is more than the"),
])
def test_settings_that_cannot_run_are_refused_up_front_and_leave_no_folder(tmp_path, capsys, options, message):
    with pytest.raises(SystemExit) as stop:
        main([*TINY, *options, "--checkpoint-dir", str(tmp_path / "a" / "run")])
    assert stop.value.code == 2
    error = capsys.readouterr().err.splitlines()
    assert len(error) == 2 and re.search(message, error[1]), error
    assert list(tmp_path.iterdir()) == []


def test_the_checkpoint_folder_is_made_when_training_starts(tmp_path, capsys):
    main([*TINY, "--steps", "1", "--checkpoint-dir", str(tmp_path / "a" / "run")])
    assert (tmp_path / "a" / "run" / "checkpoint.pt").is_file()
    # The last line says where it went, also when --no-progress showed nothing else.
    assert capsys.readouterr().out.splitlines()[-1] == f"checkpoint written to {tmp_path / 'a' / 'run' / 'checkpoint.pt'}"


def test_help_shows_defaults_only_where_there_are_some():
    from transformer.cli.translate import build_parser

    for parser in (build_numbers_parser("transformer train"), build_parser("transformer translate")):
        text = " ".join(parser.format_help().split())
        assert "(default: None)" not in text and "(default: False)" not in text
        assert "--device {cpu,cuda} where to" in text and "(default: cuda when torch finds one" in text
    assert "--checkpoint CHECKPOINT a model of" in " ".join(build_parser().format_help().split())


def test_translate_refuses_a_gpu_that_is_not_there(monkeypatch, capsys):
    from transformer.cli.translate import main as translate_main

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as stop:
        translate_main(["--checkpoint", "nowhere.pt", "--device", "cuda"], prog="transformer translate")
    assert stop.value.code == 2
    error = capsys.readouterr().err.splitlines()
    assert error[1] == "transformer translate: error: --device cuda was asked for, but torch.cuda.is_available() is False"


# --- a run that diverges (issue 47) -----------------------------------------------------------

@pytest.mark.slow  # trains until the loss is not finite
def test_a_diverging_run_exits_2_with_one_line_and_leaves_only_finite_checkpoints(tmp_path):
    folder = tmp_path / "run"
    run = subprocess.run([sys.executable, "-m", "transformer", "train", *TINY, "--steps", "30", "--save-every", "1",
                          "--lr-factor", "1e8", "--clip", "none", "--checkpoint-dir", str(folder)],
                         cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=TIMEOUT)
    assert run.returncode == 2 and run.stdout == "", run.stderr
    line = run.stderr.strip()
    assert "\n" not in line and "Traceback" not in line
    step = int(re.search(r"diverged at step (\d+): the (loss|gradient norm) is (nan|inf)", line).group(1))
    saved = torch.load(folder / "checkpoint.pt", weights_only=True)
    assert saved["step"] == step - 1  # saved every step, up to the last good one
    assert f"{folder / 'checkpoint.pt'} holds step {step - 1} of 30" in line and "--resume" in line
    assert "--lr-factor" in line
    assert all(torch.isfinite(tensor).all() for tensor in saved["model"].values())


def test_a_run_that_diverges_before_its_first_save_says_nothing_was_saved(tmp_path, capsys):
    assert main([*TINY, "--steps", "5", "--lr-factor", "1e8", "--clip", "none", "--checkpoint-dir",
                 str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert re.fullmatch(r"python -m transformer.train: error: the run diverged at step \d+: [^\n]*; no checkpoint "
                        r"was saved: start again with a smaller --lr-factor \(or with --clip 1\)\n", err), err
    assert not (tmp_path / "run" / "checkpoint.pt").exists()


# --- Ctrl-C (issue 47) --------------------------------------------------------------------------

@pytest.mark.slow  # trains, then a Ctrl-C
def test_ctrl_c_stops_train_with_130_and_one_line_naming_what_was_kept(tmp_path):
    folder = tmp_path / "run"
    process = subprocess.Popen([sys.executable, "-m", "transformer", "train", *TINY, "--steps", "5000",
                                "--save-every", "2", "--checkpoint-dir", str(folder)],
                               cwd=tmp_path, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                       preexec_fn=interruptible)
    deadline = time.monotonic() + TIMEOUT
    while not (folder / "checkpoint.pt").is_file() or torch.load(folder / "checkpoint.pt", weights_only=True)["step"] < 4:
        assert process.poll() is None and time.monotonic() < deadline, "the run ended before Ctrl-C"
        time.sleep(0.05)
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=TIMEOUT)
    assert process.returncode == 130, err
    assert err.count("\n") == 1 and "Traceback" not in err
    step = torch.load(folder / "checkpoint.pt", weights_only=True)["step"]
    assert (f"transformer train: interrupted (Ctrl-C); {folder / 'checkpoint.pt'} holds step {step} of 5000: "
            "the same command with --resume goes on from there") in err
    assert sorted(path.name for path in folder.iterdir()) == ["checkpoint.pt"]  # no partial file left


@pytest.mark.slow  # starts a process four times
@pytest.mark.parametrize("entry", [["-m", "transformer", "train"], ["-m", "transformer.train"]])
@pytest.mark.parametrize("delay", [0.0, 0.3])
def test_ctrl_c_while_the_command_imports_torch_is_one_line_and_130(tmp_path, entry, delay):
    """The first seconds of a command go to importing torch. A Ctrl-C then used to print Python's
    KeyboardInterrupt traceback from inside torch's import (or, once, to be lost in it: the run went
    on). ``-X importtime`` shows on stderr when the import of torch has begun; the Ctrl-C follows."""
    process = subprocess.Popen([sys.executable, "-X", "importtime", *entry, *TINY, "--steps", "5000",
                                "--checkpoint-dir", str(tmp_path / "run")],
                               cwd=tmp_path, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               preexec_fn=interruptible)
    said = []
    for line in process.stderr:  # import time: self [us] | cumulative | imported package
        said.append(line)
        if line.startswith("import time:") and line.split("|")[-1].strip() == "torch._utils":
            break  # torch's own modules are being imported
    else:
        raise AssertionError(f"torch's import never showed: {''.join(said)[-2000:]}")
    time.sleep(delay)
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=TIMEOUT)
    lines = [line for line in err.splitlines() if not line.startswith("import time:")]
    prog = "transformer train" if entry[-1] == "train" else "python -m transformer.train"
    assert process.returncode == 130 and lines == [f"{prog}: interrupted (Ctrl-C)"], err[-3000:]
    assert not (tmp_path / "run").exists()  # stopped before it began


def test_ctrl_c_before_a_run_keeps_nothing_and_says_so(monkeypatch, capsys):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr("transformer.cli.train.split_numbers_by_length", interrupted)  # Ctrl-C while the data are made
    assert main([*TINY, "--steps", "3"]) == 130
    assert capsys.readouterr().err == ("python -m transformer.train: interrupted (Ctrl-C); no checkpoint was saved "
                                       "(no --checkpoint-dir)\n")


def test_resuming_with_another_train_size_is_refused_before_a_step(tmp_path, capsys):
    folder = tmp_path / "run"
    assert main([*TINY, "--steps", "2", "--checkpoint-dir", str(folder)]) == 0
    capsys.readouterr()
    with pytest.raises(SystemExit) as stop:
        main([*TINY, "--train-size", "17", "--steps", "4", "--checkpoint-dir", str(folder), "--resume"])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "Traceback" not in err
    assert (f"cannot resume from {folder / 'checkpoint.pt'}: it was trained on other numbers (19 of them, here 17)"
            in err)
    assert torch.load(folder / "checkpoint.pt", weights_only=True)["step"] == 2  # nothing was trained
