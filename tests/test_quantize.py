"""Tests for transformer/generation/quantize.py (chapters/fast_generation.md): int8 linear layers for
inference on the CPU, checked against the float32 model they come from, and the translate command's
--int8. The chapter checks the BLEU of the committed translator on the whole test set."""

import io
import sys
from pathlib import Path

import pytest
import sacrebleu
import torch
from torch import nn

import transformer
from transformer.nn.multihead import MultiHeadAttention
from transformer.tasks.multi30k import BOS_ID, PAD_ID, encode_lines
from transformer.generation.quantize import quantize_int8
from transformer.tasks.multi30k import load_multi30k
from transformer.cli.translate import main
from transformer.tasks.translation import load_translator, translate
from transformer.nn.attention import padding_mask
from transformer.training.batch import pad_rows

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

MODEL = Path(transformer.__file__).resolve().parent.parent / "models" / "multi30k" / "model.pt"


@pytest.fixture(scope="module")
def committed():
    model, tokenizer = load_translator(MODEL)
    return model, quantize_int8(model), tokenizer


def test_every_linear_layer_is_int8_and_nothing_else_changes(committed):
    model, int8, _ = committed
    quantized = [name for name, m in int8.named_modules() if isinstance(m, torch.ao.nn.quantized.dynamic.Linear)]
    linears = [name for name, m in model.named_modules() if isinstance(m, nn.Linear)]
    assert quantized == linears and "output" in linears and not int8.training
    assert all(m.weight().dtype == torch.qint8 for m in int8.modules()
               if isinstance(m, torch.ao.nn.quantized.dynamic.Linear))
    assert model.output.weight is model.tgt_embed.weight  # the float model keeps its tied Parameter
    torch.testing.assert_close(int8.tgt_embed.weight, model.tgt_embed.weight, rtol=0, atol=0)


@pytest.mark.slow  # the committed model over 64 test sentences
def test_int8_next_token_scores_stay_close_to_float32(committed):
    model, int8, tokenizer = committed
    german, english = load_multi30k("test")
    src = pad_rows(encode_lines(tokenizer, german[:64]), PAD_ID, "cpu")  # (B, S)
    tgt = pad_rows([[BOS_ID] + row for row in encode_lines(tokenizer, english[:64])], PAD_ID, "cpu")  # (B, T)
    real = tgt != PAD_ID
    with torch.no_grad():
        ours, theirs = (m(src, tgt, src_mask=padding_mask(src, PAD_ID)).log_softmax(-1) for m in (int8, model))
    same_top = (ours.argmax(-1) == theirs.argmax(-1))[real].float().mean()
    gap = (ours.exp() - theirs.exp()).abs().sum(-1)[real]  # total variation x 2, per position
    assert same_top >= 0.97, same_top
    assert gap.mean() < 0.05, gap.mean()


@pytest.mark.slow  # translates 60 sentences four times
def test_int8_translates_like_float32_greedy_and_beam(committed):
    model, int8, tokenizer = committed
    german = load_multi30k("test")[0][:60]
    for beam in (1, 3):
        ours, theirs = translate(int8, tokenizer, german, beam), translate(model, tokenizer, german, beam)
        same = sum(a == b for a, b in zip(ours, theirs))
        # measured 47-50 identical and BLEU 91-94 against float32 (both CPU paths): near-ties move a word
        assert same >= 40, (beam, same)
        assert sacrebleu.corpus_bleu(ours, [theirs]).score >= 85, beam


def test_a_quantized_layer_still_names_a_wrong_dtype():
    mha = quantize_int8(MultiHeadAttention(d_model=8, num_heads=2))
    x = torch.randn(2, 3, 8, dtype=torch.float64)
    with pytest.raises(TypeError, match="query must have the dtype of the module's parameters, torch.float32"):
        mha(x, x, x)


@pytest.mark.parametrize("model, error, message", [
    ("a model", TypeError, "model must be a torch.nn.Module, got str"),
    (nn.Linear(4, 4).double(), ValueError, "model must be float32 on the CPU.*torch.float64 on cpu"),
    (nn.Linear(4, 4).half(), ValueError, "torch.float16 on cpu"),
])
def test_what_cannot_be_quantized_is_refused(model, error, message):
    with pytest.raises(error, match=message):
        quantize_int8(model)


def test_the_translate_command_takes_int8(committed, monkeypatch, capsys):
    _, int8, tokenizer = committed
    lines = ["Ein Hund läuft über die Wiese.", "", "Zwei Kinder spielen am Strand."]
    monkeypatch.setattr(sys, "stdin", io.StringIO("\n".join(lines) + "\n"))
    assert main(["--checkpoint", str(MODEL), "--no-progress", "--device", "cpu", "--int8"]) == 0
    assert capsys.readouterr().out == "".join(line + "\n" for line in translate(int8, tokenizer, lines))


def test_the_translate_command_refuses_int8_on_cuda(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["--checkpoint", str(MODEL), "--int8", "--device", "cuda"])
    assert stop.value.code == 2
    assert "--int8 runs on the CPU: add --device cpu (got --device cuda)" in capsys.readouterr().err
