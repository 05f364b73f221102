"""Tests for transformer/cli/generate.py (chapters/modern_decoder.md, "A command: `transformer generate`"):
SmolLM2-135M-Instruct continuing a prompt from the command line, streamed, with the sampling chapter's
knobs, and a one-line refusal (exit status 2) of every bad value."""

import io
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from processes import interruptible

from transformer.__main__ import command
from transformer.cli.generate import write_stream
from transformer.generation.sampling import sample
from transformer.interop.gguf import chat, load_smollm2, smollm2_path

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py
ROOT = Path(__file__).resolve().parent.parent
QUESTION = "What is the capital of France?"


@pytest.fixture(scope="module")
def smollm2():
    """(model, tokenizer) of the real file; a failure, not a skip, if it is not fetched."""
    try:
        smollm2_path()
    except FileNotFoundError as err:
        pytest.fail(f"{err}. The tests of `transformer generate` need it: run `make setup`.")
    return load_smollm2()


def run(capsys, *argv):
    """``transformer generate ARGV`` in this process: (exit status, stdout, stderr)."""
    try:
        status = command(["generate", *argv])
    except SystemExit as stop:  # argparse's refusals
        status = stop.code
    out, err = capsys.readouterr()
    return status, out, err


@pytest.mark.slow  # loads SmolLM2 (a 98 MB file), in this process or a new one
def test_greedy_answer_is_chats_greedy_answer(smollm2, capsys):
    model, tokenizer = smollm2
    status, out, err = run(capsys, "--prompt", QUESTION, "--top-k", "1", "--max-new-tokens", "24", "--num-threads", "1")
    expected = chat(model, tokenizer, [{"role": "user", "content": QUESTION}], max_new_tokens=24, top_k=1)
    assert (status, err) == (0, "")
    assert out == expected + "\n" and "Paris" in out


@pytest.mark.slow  # loads SmolLM2 (a 98 MB file), in this process or a new one
def test_seeded_sampling_draws_what_the_library_draws_from_the_same_seed(smollm2, capsys):
    model, tokenizer = smollm2
    knobs = ["--temperature", "1.3", "--top-p", "0.95", "--top-k", "50", "--max-new-tokens", "16"]
    status, out, err = run(capsys, "--prompt", QUESTION, "--seed", "7", *knobs)
    assert (status, err) == (0, "")
    generator = torch.Generator().manual_seed(7)  # the same draws through the library
    expected = chat(model, tokenizer, [{"role": "user", "content": QUESTION}], max_new_tokens=16, temperature=1.3,
                    top_p=0.95, top_k=50, generator=generator)
    assert out == expected + "\n"
    other = chat(model, tokenizer, [{"role": "user", "content": QUESTION}], max_new_tokens=16, temperature=1.3,
                 top_p=0.95, top_k=50, generator=torch.Generator().manual_seed(8))
    assert other + "\n" != out  # the seed matters: these knobs draw another text from another seed


@pytest.mark.slow  # loads SmolLM2 (a 98 MB file), in this process or a new one
def test_prompt_on_stdin_without_the_chat_format(smollm2):
    model, tokenizer = smollm2
    text = "The capital of France is"
    done = subprocess.run([sys.executable, "-m", "transformer", "generate", "--no-chat", "--top-k", "1",
                           "--max-new-tokens", "8"], input=text.encode(), capture_output=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"})
    prompt = torch.tensor([tokenizer.encode(text).ids])  # (1, P)
    new = sample(model, prompt, 8, top_k=1)[0, prompt.shape[1]:].tolist()
    eos = tokenizer.token_to_id("<|im_end|>")  # SmolLM2's end of text, tokenizer.ggml.eos_token_id
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout.decode() == tokenizer.decode(new[:new.index(eos)] if eos in new else new) + "\n"


@pytest.mark.slow  # loads SmolLM2 (a 98 MB file), in this process or a new one
def test_ctrl_c_stops_generate_with_130_and_one_line():
    smollm2_path()
    process = subprocess.Popen([sys.executable, "-m", "transformer", "generate", "--prompt", "Once upon a time",
                                "--no-chat", "--temperature", "1.5", "--top-p", "1", "--seed", "0",
                                "--max-new-tokens", "4000"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"},
                               preexec_fn=interruptible)
    first = process.stdout.read(1)  # written as soon as the first token is drawn, and flushed
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=60)
    assert first and process.returncode == 130, err.decode()
    assert err.decode() == "transformer generate: interrupted (Ctrl-C)\n"


@pytest.mark.slow  # loads SmolLM2 (a 98 MB file), in this process or a new one
def test_a_reader_that_closes_early_ends_generate_quietly_with_status_1():
    """`transformer generate ... | head -c 1`: the write after the reader has gone fails (EPIPE); the
    command stops with exit status 1 and nothing on stderr, not a BrokenPipeError traceback."""
    smollm2_path()
    writer = subprocess.Popen([sys.executable, "-m", "transformer", "generate", "--prompt", "Once upon a time",
                               "--no-chat", "--temperature", "1.5", "--top-p", "1", "--seed", "0",
                               "--max-new-tokens", "4000"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"})
    reader = subprocess.Popen(["head", "-c", "1"], stdin=writer.stdout, stdout=subprocess.PIPE)
    writer.stdout.close()  # the reader holds the pipe's only read end: when it exits, the pipe is broken
    first, _ = reader.communicate(timeout=120)
    try:
        err = writer.stderr.read()
        writer.wait(timeout=120)
    finally:
        writer.kill()
    assert len(first) == 1 and reader.returncode == 0
    assert (writer.returncode, err.decode()) == (1, "")


class Bytes:
    """A stand-in tokenizer whose tokens are single bytes: a character of two bytes spans two tokens."""

    def decode(self, ids):
        return bytes(ids).decode("utf-8", errors="replace")


def test_write_stream_holds_back_half_a_character_and_stops_at_a_stop_token(capsys):
    steps = [torch.tensor([[0, *list("é!".encode())[:i]]]) for i in range(1, 4)]  # (1, 1 + i)
    written = []

    class Watched(io.StringIO):
        def flush(self):  # what has been written each time the stream is flushed
            written.append(self.getvalue())

    stdout = Watched()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sys, "stdout", stdout)
        assert write_stream(iter(steps), Bytes(), stop=set()) == "é!"
    assert written == ["é", "é!", "é!\n"]  # nothing after the first byte of é, whose second byte was to come
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sys, "stdout", io.StringIO())
        assert write_stream(iter(steps), Bytes(), stop={ord("!")}) == "é"


@pytest.mark.parametrize("argv, message", [
    (["--temperature", "nan"], "argument --temperature: --temperature must be a number > 0, got nan"),
    (["--temperature", "inf"], "argument --temperature: --temperature must be a finite number > 0, got inf"),
    (["--temperature", "0"], "argument --temperature: --temperature must be a number > 0, got 0.0"),
    (["--temperature", "-0.5"], "argument --temperature: --temperature must be a number > 0, got -0.5"),
    (["--temperature", "warm"], "argument --temperature: --temperature must be a number, got 'warm'"),
    (["--top-p", "0"], "argument --top-p: --top-p must be a number in (0, 1], got 0.0"),
    (["--top-p", "1.5"], "argument --top-p: --top-p must be a number in (0, 1], got 1.5"),
    (["--top-p", "nan"], "argument --top-p: --top-p must be a number in (0, 1], got nan"),
    (["--top-k", "0"], "argument --top-k: expected a positive integer, got 0"),
    (["--top-k", "-3"], "argument --top-k: expected a positive integer, got -3"),
    (["--max-new-tokens", "0"], "argument --max-new-tokens: expected a positive integer, got 0"),
    (["--max-new-tokens", "inf"], "argument --max-new-tokens: expected a positive integer, got 'inf'"),
    (["--seed", "-1"], "argument --seed: expected an integer in [0, 2**64), got -1"),
    (["--seed", str(2**64)], f"argument --seed: expected an integer in [0, 2**64), got {2**64}"),
    (["--num-threads", "0"], "argument --num-threads: expected a positive integer, got 0"),
    (["--num-threads", "100000"], f"--num-threads 100000 is more than the {os.cpu_count()} cores of this machine"),
    (["--model", "no/such/file.gguf"], "--model must be a GGUF file, no/such/file.gguf is not a file"),
])
def test_each_bad_value_is_one_line_with_exit_status_2(capsys, argv, message):
    status, out, err = run(capsys, "--prompt", "Hi", *argv)
    assert (status, out) == (2, "")
    assert err.count("\n") == 2 and err.startswith("usage: transformer generate")  # the usage's line, then this
    assert err.splitlines()[1] == f"transformer generate: error: {message}"


def test_a_missing_default_model_says_run_make_setup(capsys, monkeypatch):
    def missing():
        raise FileNotFoundError("SmolLM2 is not at /x/models/smollm2/f.gguf: run `make setup` in the book's root")

    monkeypatch.setattr("transformer.cli.generate.smollm2_path", missing)
    status, out, err = run(capsys, "--prompt", "Hi")
    assert (status, out, err.count("\n")) == (2, "", 2)
    assert "error: --model: SmolLM2 is not at /x/models/smollm2/f.gguf: run `make setup`" in err


def test_a_file_that_is_not_gguf_is_one_line(capsys, tmp_path):
    (tmp_path / "not.gguf").write_bytes(b"GGUF" + bytes(60))
    status, out, err = run(capsys, "--prompt", "Hi", "--model", str(tmp_path / "not.gguf"))
    assert (status, out, err.count("\n")) == (2, "", 2)
    assert "error: path must be a whole GGUF file" in err


@pytest.mark.slow  # loads SmolLM2 (a 98 MB file), in this process or a new one
def test_a_prompt_past_the_context_an_empty_one_and_bytes_that_are_not_utf8(capsys, monkeypatch):
    smollm2_path()
    status, out, err = run(capsys, "--prompt", "Hi", "--max-new-tokens", "8192")
    assert (status, out, err.count("\n")) == (2, "", 2)
    assert "error: the prompt is 31 tokens in the chat format: with --max-new-tokens 8192 it needs 8222 " \
           "positions, more than the model's context of 8192" in err
    long = "word " * 9000  # 9,000 tokens and more, without the chat format
    status, out, err = run(capsys, "--prompt", long, "--no-chat", "--max-new-tokens", "1")
    assert (status, out, err.count("\n")) == (2, "", 2) and "more than the model's context of 8192" in err
    status, out, err = run(capsys, "--prompt", "", "--no-chat")
    assert (status, out) == (2, "") and "error: the prompt is empty: give --prompt TEXT, or text on stdin" in err
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"caf\xe9")))
    status, out, err = run(capsys, "--prompt", "-")
    assert (status, out, err.count("\n")) == (2, "", 2)
    assert "error: --prompt -: standard input must be UTF-8 text" in err
