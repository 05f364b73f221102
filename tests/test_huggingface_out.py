"""Tests for transformer/interop/huggingface_out.py (chapters/exporting.md): the committed translator
written as a Hugging Face Marian model, and that model converted by CTranslate2, must give our logits
and our greedy translations. Nothing reaches the network. The ONNX graphs: tests/test_onnx.py."""

import importlib
import os
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"

import pytest
import torch
import transformers
from factories import small_transformer

from benchmarks.generation import word_tokenizer

from transformer import DecoderOnlyLM, LayerOptions
from transformer.__main__ import command
from transformer.nn.attention import padding_mask
from transformer.training.checkpoint import save_checkpoint
from transformer.training.batch import pad_rows
from transformer.generation.decoding import generated_ids, greedy_decode
from transformer.interop.huggingface_out import export_huggingface, hf_greedy, marian_config, to_huggingface
from transformer.tasks.multi30k import BOS_ID, EOS_ID, PAD_ID, encode_lines
from transformer.interop.huggingface_in import from_huggingface
from transformer.tasks.multi30k import load_multi30k
from transformer.tasks.subwords import SPECIAL_TOKENS, train_tokenizer
from transformer.tasks.translation import load_translator, translate

MODEL = Path(__file__).resolve().parents[1] / "models" / "multi30k" / "model.pt"

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def committed():
    return load_translator(MODEL)


@pytest.fixture(scope="module")
def exported(committed):
    return to_huggingface(*committed)


@pytest.fixture(scope="module")
def test_de():
    return load_multi30k("test")[0]


def book_greedy(model, tokenizer, sentences, batch_size=32):
    """Our greedy ids (no <bos>, no <eos>), as `translate` decodes."""
    out = []
    for start in range(0, len(sentences), batch_size):
        src = pad_rows(encode_lines(tokenizer, sentences[start:start + batch_size]), PAD_ID, "cpu")
        limit = min(model.positional_encoding.max_len, src.shape[1] + 51)
        tokens = greedy_decode(model, src, limit, BOS_ID, EOS_ID, src_mask=padding_mask(src, PAD_ID),
                               pad_id=PAD_ID, extra_len=50)
        out += generated_ids(tokens, EOS_ID)
    return out


def test_the_round_trip_gives_the_models_logits(committed, exported, test_de):
    model, tokenizer = committed
    back = from_huggingface(exported[0]).eval()
    src = pad_rows(encode_lines(tokenizer, test_de[:16]), PAD_ID, "cpu")
    tgt = torch.randint(4, 8000, (16, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        mask = padding_mask(src, PAD_ID)
        torch.testing.assert_close(back(src, tgt, src_mask=mask), model(src, tgt, src_mask=mask), atol=1e-5, rtol=0)


def _tiny_tokenizer():
    """A BPE tokenizer of a few dozen tokens, with the book's special tokens at ids 0 to 3."""
    return train_tokenizer(["ein Hund läuft", "a dog runs", "zwei Hunde", "two dogs"], 30)


def test_the_special_tokens_ids_are_the_tokenizers_wherever_they_are():
    # the book's tokenizers put <pad>, <bos>, <eos>, <unk> at 0 to 3; this one puts them at 7 to 10,
    # and the exported model, its tokenizer and its generation use those ids: Marian's greedy
    # translations are the book's greedy_decode given the same ids
    tokenizer = word_tokenizer(11, specials_first=False)
    pad, bos, eos, unk = (tokenizer.token_to_id(token) for token in SPECIAL_TOKENS)
    assert (pad, bos, eos, unk) == (7, 8, 9, 10)
    model = small_transformer(seed=5, share_embeddings=True, src_vocab_size=11, tgt_vocab_size=11, pad_id=pad)
    with torch.no_grad():  # weights that end the first sentence at once and repeat a word in the others
        for p in model.parameters():
            p.add_(0.5 * torch.randn_like(p))
    hf, fast = to_huggingface(model, tokenizer)
    config, generation = hf.config, hf.generation_config
    assert (config.pad_token_id, config.bos_token_id, config.eos_token_id, config.decoder_start_token_id) == (
        pad, bos, eos, bos)
    assert (generation.pad_token_id, generation.bos_token_id, generation.eos_token_id,
            generation.decoder_start_token_id) == (pad, bos, eos, bos)
    assert (fast.pad_token_id, fast.bos_token_id, fast.eos_token_id, fast.unk_token_id) == (pad, bos, eos, unk)
    sentences = ["w0 w1 w2 w3 w4", "w5 w6", "w2"]
    src = pad_rows([tokenizer.encode(line).ids for line in sentences], pad, "cpu")  # (3, 5)
    assert src.tolist() == [[0, 1, 2, 3, 4], [5, 6, pad, pad, pad], [2, pad, pad, pad, pad]]
    tokens = greedy_decode(model, src, min(model.positional_encoding.max_len, src.shape[1] + 51), bos, eos,
                           src_mask=padding_mask(src, pad), pad_id=pad, extra_len=50)
    # a row that reached its limit (its source length + 50) before the longest is padded after it
    ours = generated_ids(tokens, eos, pad_id=pad)
    assert [len(row) for row in ours] == [0, 52, 51]  # <eos> at once; then two rows cut at their limits
    assert hf_greedy(hf, fast, sentences) == ours


def test_a_tokenizer_without_the_special_tokens_is_refused_by_name():
    model = small_transformer(share_embeddings=True, src_vocab_size=11, tgt_vocab_size=11)
    with pytest.raises(ValueError, match=r"tokenizer must hold the special tokens .*; it lacks \['<bos>'\]"):
        to_huggingface(model, word_tokenizer(11, specials=("<pad>", "<eos>", "<unk>")))


def test_a_random_model_round_trips_too():
    tokenizer = _tiny_tokenizer()  # of the model's size: another size is refused (generate would fail)
    size = tokenizer.get_vocab_size()
    model = small_transformer(share_embeddings=True, src_vocab_size=size, tgt_vocab_size=size)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    hf, _ = to_huggingface(model, tokenizer)
    src, tgt = torch.tensor([[3, 4, 5, 6]]), torch.tensor([[1, 7, 8]])
    with torch.no_grad():
        ours = model(src, tgt)
        torch.testing.assert_close(hf(input_ids=src, decoder_input_ids=tgt).logits, ours, atol=1e-5, rtol=0)
        torch.testing.assert_close(from_huggingface(hf).eval()(src, tgt), ours, atol=1e-6, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_the_callers_model_is_left_as_it_was(committed, dtype):
    # to_huggingface reads float32 copies of the weights: the model it is given keeps its dtype,
    # its parameters and their values (Module.float() would have converted it in place)
    tokenizer = _tiny_tokenizer()
    size = tokenizer.get_vocab_size()
    model = small_transformer(share_embeddings=True, src_vocab_size=size, tgt_vocab_size=size).to(dtype).train()
    before = {name: (p, p.detach().clone()) for name, p in model.named_parameters()}
    hf, _ = to_huggingface(model, tokenizer)
    assert model.training and [name for name, _ in model.named_parameters()] == list(before)
    for name, p in model.named_parameters():
        assert p is before[name][0] and p.dtype == dtype and torch.equal(p, before[name][1]), name
    assert {p.dtype for p in hf.parameters()} == {torch.float32}
    src, tgt = torch.tensor([[3, 4, 5, 6]]), torch.tensor([[1, 7, 8]])
    with torch.no_grad():
        theirs, ours = hf(input_ids=src, decoder_input_ids=tgt).logits, model.eval()(src, tgt)
    torch.testing.assert_close(theirs, ours.float(), atol=1e-5 if dtype == torch.float64 else 0.1, rtol=0)


def test_hugging_faces_logits_are_ours_on_the_committed_model(committed, exported, test_de):
    model, tokenizer = committed
    hf, hf_tokenizer = exported
    batch = hf_tokenizer(test_de[:32], return_tensors="pt", padding=True)
    assert batch["input_ids"].tolist() == pad_rows(encode_lines(tokenizer, test_de[:32]), PAD_ID, "cpu").tolist()
    tgt = torch.randint(4, 8000, (32, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        theirs = hf(**batch, decoder_input_ids=tgt).logits
        ours = model(batch["input_ids"], tgt, src_mask=padding_mask(batch["input_ids"], PAD_ID))
    torch.testing.assert_close(theirs, ours, atol=1e-3, rtol=1e-4)


@pytest.mark.slow
def test_generate_gives_our_greedy_tokens_on_the_whole_test_set(committed, exported, test_de):
    model, tokenizer = committed
    ours, theirs = book_greedy(model, tokenizer, test_de), hf_greedy(*exported, test_de)
    same = sum(a == b for a, b in zip(ours, theirs))
    assert len(test_de) == 1000 and same >= 995, same  # near-ties may flip a token after float rounding


@pytest.mark.slow  # transformers' generate
def test_generate_gives_our_greedy_tokens_on_the_first_sentences(committed, exported, test_de):
    model, tokenizer = committed
    assert hf_greedy(*exported, test_de[:40]) == book_greedy(model, tokenizer, test_de[:40])


@pytest.mark.parametrize("changes, setting", [
    ({"options": LayerOptions(norm_first=True)}, "norm_first"),
    ({"share_embeddings": False}, "share_embeddings"),
    ({"tie_output": False}, "tie_output"),
])
def test_settings_marian_cannot_hold_are_refused_by_name(changes, setting):
    model = small_transformer(**{"share_embeddings": True, "src_vocab_size": 11, "tgt_vocab_size": 11, **changes})
    with pytest.raises(ValueError, match=setting):
        marian_config(model, word_tokenizer(11))


@pytest.mark.parametrize("activation, name", [("relu", "relu"), ("gelu", "gelu"), ("gelu_tanh", "gelu_new"),
                                              ("silu", "silu")])
def test_each_activation_gets_the_first_of_hugging_faces_names_for_it(activation, name):
    model = small_transformer(share_embeddings=True, src_vocab_size=11, tgt_vocab_size=11,
                              options=LayerOptions(activation=activation))
    assert marian_config(model, word_tokenizer(11)).activation_function == name


def test_another_layer_norm_eps_is_refused():
    model = small_transformer(share_embeddings=True, src_vocab_size=11, tgt_vocab_size=11)
    model.encoder.layers[0].norm1.eps = 1e-6
    with pytest.raises(ValueError, match="LayerNorm eps"):
        marian_config(model, word_tokenizer(11))


def test_other_models_are_refused():
    with pytest.raises(TypeError, match="transformer.Transformer"):
        marian_config(DecoderOnlyLM(vocab_size=10, d_model=8, num_heads=2, d_ff=16, num_layers=1, max_len=16),
                      word_tokenizer(10))


@pytest.mark.slow  # the command, then transformers loads its folder
def test_the_command_writes_a_folder_that_transformers_loads_offline(tmp_path, test_de, committed):
    out = tmp_path / "hf"
    assert command(["export", "huggingface", "--checkpoint", str(MODEL), "--out", str(out)]) == 0
    model = transformers.AutoModelForSeq2SeqLM.from_pretrained(out, local_files_only=True)
    tokenizer = transformers.AutoTokenizer.from_pretrained(out, local_files_only=True)
    assert isinstance(model, transformers.MarianMTModel)
    batch = tokenizer(test_de[:6], return_tensors="pt", padding=True)
    english = tokenizer.batch_decode(model.generate(**batch, num_beams=1, max_new_tokens=60), skip_special_tokens=True)
    assert english == translate(*committed, test_de[:6])
    card = (out / "README.md").read_text(encoding="utf-8")  # the model card: tests/test_model_card.py reads it
    assert card.startswith("---\nlibrary_name: transformers\n") and 'MarianMTModel.from_pretrained("hf")' in card
    assert "## Terms of the data" in card and "| average of the last 5 | beam 4, α = 0.6 | **39.61** | 58.95 |" in card
    modes = {file.name: file.stat().st_mode & 0o777 for file in out.iterdir()}
    assert len(set(modes.values())) == 1 and "model.safetensors" in modes, modes  # all alike: 0644 under umask 022


def test_the_command_refuses_a_folder_that_is_not_empty(tmp_path, capsys):
    (tmp_path / "something").write_text("x")
    with pytest.raises(SystemExit) as exit_:
        command(["export", "huggingface", "--checkpoint", str(MODEL), "--out", str(tmp_path)])
    assert exit_.value.code == 2 and "is not an empty folder" in capsys.readouterr().err


def test_the_command_refuses_a_checkpoint_of_another_task(tmp_path, capsys):
    path = tmp_path / "numbers.pt"
    save_checkpoint(path, small_transformer(), None, None, 0, None)
    with pytest.raises(SystemExit) as exit_:
        command(["export", "huggingface", "--checkpoint", str(path), "--out", str(tmp_path / "out")])
    assert exit_.value.code == 2 and "numbers.pt is a training state's (no model described) checkpoint, not a " \
        "translator's" in capsys.readouterr().err


def test_a_missing_extra_names_the_pip_line(monkeypatch, committed, tmp_path):
    real = importlib.import_module

    def without(name, *args):
        if name in ("transformers", "onnxscript", "ctranslate2.converters.transformers"):
            raise ImportError(f"No module named {name!r}")
        return real(name, *args)

    monkeypatch.setattr(importlib, "import_module", without)
    from transformer.interop.huggingface_out import ctranslate2_folder
    from transformer.interop.onnx import export_onnx
    with pytest.raises(ImportError, match=r'pip install -e "\.\[pretrained\]"'):
        to_huggingface(*committed)
    with pytest.raises(ImportError, match=r'pip install -e "\.\[onnx\]"'):
        export_onnx(committed[0], tmp_path)
    with pytest.raises(ImportError, match=r'pip install -e "\.\[ctranslate2\]"'):
        ctranslate2_folder(tmp_path, tmp_path / "ct2")


@pytest.mark.slow
def test_ctranslate2_translates_the_first_100_test_sentences_as_we_do(committed, tmp_path, test_de):
    import ctranslate2

    from transformer.interop.huggingface_out import ctranslate2_folder

    model, tokenizer = committed
    export_huggingface(MODEL, tmp_path / "hf")
    ctranslate2_folder(tmp_path / "hf", tmp_path / "ct2")
    translator = ctranslate2.Translator(str(tmp_path / "ct2"), device="cpu")
    pieces = [tokenizer.encode(line).tokens for line in test_de[:100]]
    results = translator.translate_batch(pieces, beam_size=1, max_decoding_length=max(map(len, pieces)) + 50)
    theirs = [[tokenizer.token_to_id(t) for t in r.hypotheses[0]] for r in results]
    same = sum(a == b for a, b in zip(book_greedy(model, tokenizer, test_de[:100]), theirs))
    assert same >= 98, same


def test_a_tokenizer_of_another_size_or_none_is_refused_by_name(committed):
    model, tokenizer = committed
    small = small_transformer(share_embeddings=True, src_vocab_size=50, tgt_vocab_size=50)
    with pytest.raises(ValueError, match=r"tokenizer has 8,000 tokens, but the model's vocabulary has 50"):
        to_huggingface(small, tokenizer)
    with pytest.raises(TypeError, match="tokenizer must be the model's tokenizers.Tokenizer, got NoneType"):
        to_huggingface(model, None)


def test_exporting_prints_no_progress_bar_and_leaves_transformers_setting_alone(tmp_path, capfd):
    # transformers draws a "Writing model shards" bar on stderr; the command's output is its own lines
    # (a Ctrl-C during the export must leave one line), and a library caller's setting is kept.
    from transformers.utils import logging as hf_logging

    assert hf_logging.is_progress_bar_enabled()
    export_huggingface(MODEL, tmp_path / "hf")
    assert "Writing model shards" not in capfd.readouterr().err
    assert hf_logging.is_progress_bar_enabled()
