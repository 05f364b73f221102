"""Tests for transformer/interop/huggingface_in.py (chapters/pretrained.md): Hugging Face's Marian and GPT-2
models, built from small configurations with random weights (no network), loaded into the book's
classes, must give the same logits and the same greedy tokens as `transformers` itself."""

import json
import os

os.environ["HF_HUB_OFFLINE"] = "1"  # nothing in these tests may reach the network

import pytest
import torch
from torch import nn

import transformers
from transformers import GPT2Config, GPT2LMHeadModel, MarianConfig, MarianMTModel

from transformer import DecoderOnlyLM, sample
from transformer.generation.decoding import greedy_decode
from transformer.nn.model import Transformer
from transformer.nn.positional import sinusoidal_encoding
from transformer.interop.huggingface_in import from_huggingface, load_pretrained, marian_permutation

PAD = 39  # Marian's pad token: the last id, also the decoder's start token, as in opus-mt
ATOL = 1e-5  # float32 agreement, relative to logits of order 1

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def _randomise(model: nn.Module, seed: int) -> nn.Module:
    """Weights far from the initialisation (biases and gains too), so that a misplaced one shows.

    Token embeddings are small and GPT-2's learned positions large, so that what comes next depends
    on the position and the context, not only on the last token (which a random model with tied
    embeddings otherwise repeats for ever).
    """
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "embed_positions" in name:  # Marian's fixed sinusoidal table
                continue
            noise = torch.randn(p.shape, generator=generator)
            norm = "layer_norm" in name or name.split(".")[-2].startswith("ln")
            if name.endswith("bias"):
                p.copy_(0.1 * noise)
            elif norm:
                p.copy_(1.0 + 0.2 * noise)  # gains near 1
            else:
                scale = {"shared": 0.05, "embed_tokens": 0.05, "wte": 0.05, "wpe": 1.0}.get(name.split(".")[-2], 0.3)
                p.copy_(scale * noise)
        for name, buffer in model.named_buffers():
            if name == "final_logits_bias":
                buffer.copy_(0.1 * torch.randn(buffer.shape, generator=generator))
    return model.eval()


def marian(seed=0, **overrides) -> MarianMTModel:
    config = dict(vocab_size=PAD + 1, d_model=16, encoder_layers=3, decoder_layers=3, encoder_attention_heads=4,
                  decoder_attention_heads=4, encoder_ffn_dim=40, decoder_ffn_dim=40, max_position_embeddings=64,
                  activation_function="swish", scale_embedding=True, pad_token_id=PAD,
                  decoder_start_token_id=PAD, eos_token_id=0, forced_eos_token_id=None)
    config.update(overrides)
    torch.manual_seed(seed)
    return _randomise(MarianMTModel(MarianConfig(**config)), seed)


def gpt2(seed=0, **overrides) -> GPT2LMHeadModel:
    config = dict(vocab_size=57, n_embd=24, n_layer=3, n_head=4, n_positions=48, bos_token_id=0, eos_token_id=0)
    config.update(overrides)
    torch.manual_seed(seed)
    return _randomise(GPT2LMHeadModel(GPT2Config(**config)), seed)


def source_batch(seed=0):
    """Three source rows, two of them padded on the right (as MarianTokenizer pads)."""
    generator = torch.Generator().manual_seed(seed)
    src = torch.randint(1, PAD, (3, 9), generator=generator)  # (B, S)
    src[1, 6:] = PAD
    src[2, 3:] = PAD
    return src, (src != PAD).long()  # ids, Hugging Face's attention mask (1 = real token)


def test_permutation_maps_marian_sinusoids_onto_the_books():
    config = MarianConfig(d_model=16, max_position_embeddings=40)
    theirs = MarianMTModel(config).model.encoder.embed_positions.weight  # (P, d_model): sines, then cosines
    torch.testing.assert_close(theirs[:, marian_permutation(16)], sinusoidal_encoding(40, 16), atol=1e-6, rtol=0)
    assert marian_permutation(6).tolist() == [0, 3, 1, 4, 2, 5]
    assert sorted(marian_permutation(512).tolist()) == list(range(512))


@pytest.mark.parametrize("overrides", [
    {},  # the opus-mt choices: swish, scaled, shared and tied embeddings
    {"activation_function": "gelu", "scale_embedding": False},
    {"activation_function": "relu", "share_encoder_decoder_embeddings": False, "decoder_vocab_size": 45},
])
def test_marian_logits_equal_the_reference_with_padded_source(overrides):
    hf = marian(**overrides)
    model = from_huggingface(hf)
    assert isinstance(model, Transformer) and not model.training
    src, attention_mask = source_batch()
    tgt = torch.randint(0, 31, (3, 6), generator=torch.Generator().manual_seed(1))
    tgt[:, 0] = PAD  # the decoder's start token
    with torch.no_grad():
        reference = hf(input_ids=src, attention_mask=attention_mask, decoder_input_ids=tgt).logits  # (B, T, V)
        logits = model(src, tgt, src_mask=(attention_mask == 0)[:, None, None, :])
    assert reference.std() > 0.1  # logits far from constant: the comparison means something
    torch.testing.assert_close(logits, reference, atol=ATOL, rtol=ATOL)


def test_marian_greedy_generation_is_token_identical_to_generate():
    hf = marian(seed=1, tie_word_embeddings=False)
    model = from_huggingface(hf)
    src, attention_mask = source_batch(seed=2)
    src_mask = (attention_mask == 0)[:, None, None, :]  # (B, 1, 1, S), True = padding
    reference = hf.generate(input_ids=src, attention_mask=attention_mask, do_sample=False, num_beams=1,
                            max_new_tokens=20, output_scores=True, return_dict_in_generate=True)
    tokens = greedy_decode(model, src, max_len=21, bos_id=PAD, eos_id=0, pad_id=PAD, src_mask=src_mask)
    assert tokens.tolist() == reference.sequences.tolist()
    assert len(set(tokens[1, 1:].tolist())) > 1  # not one token repeated
    # Each step's scores of generate (Hugging Face's cache) equal the full forward pass of ours.
    with torch.no_grad():
        logits = model(src, tokens[:, :-1], src_mask=src_mask)  # (B, T - 1, V)
    torch.testing.assert_close(logits, torch.stack(reference.scores, dim=1), atol=ATOL, rtol=ATOL)


@pytest.mark.parametrize("overrides", [{}, {"activation_function": "gelu", "n_inner": 40},
                                       {"layer_norm_epsilon": 1e-3}])
def test_gpt2_logits_equal_the_reference(overrides):
    hf = gpt2(**overrides)
    model = from_huggingface(hf)
    assert isinstance(model, DecoderOnlyLM) and model.output.weight is model.embed.weight
    tokens = torch.randint(0, 57, (2, 30), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        reference = hf(tokens).logits
        logits = model(tokens)
    assert reference.std() > 0.1
    torch.testing.assert_close(logits, reference, atol=ATOL, rtol=ATOL)


def test_gpt2_greedy_generation_is_token_identical_to_generate():
    hf = gpt2(seed=4)
    hf.generation_config.eos_token_id = None  # sample() runs to max_new_tokens
    model = from_huggingface(hf)
    prompt = torch.randint(0, 57, (2, 5), generator=torch.Generator().manual_seed(3))
    reference = hf.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False, num_beams=1,
                            max_new_tokens=25, pad_token_id=0)
    tokens = sample(model, prompt, max_new_tokens=25, top_k=1)  # top_k=1: greedy
    assert tokens.tolist() == reference.tolist()
    assert len(set(tokens[:, 5:].flatten().tolist())) > 3


def test_converted_model_follows_dtype_and_mode():
    hf = gpt2().double().train()
    model = from_huggingface(hf)
    assert model.training and model.embed.weight.dtype == torch.float64


@pytest.mark.parametrize("make, field, value", [
    (marian, "encoder_layers", 2), (marian, "decoder_attention_heads", 2), (marian, "activation_function", "tanh"),
    (gpt2, "scale_attn_by_inverse_layer_idx", True), (gpt2, "add_cross_attention", True),
    (gpt2, "activation_function", "gelu_fast"),
])
def test_unrepresentable_configurations_are_refused_naming_the_field(make, field, value):
    hf = make()
    setattr(hf.config, field, value)
    with pytest.raises(ValueError, match=field):
        from_huggingface(hf)


def test_other_models_are_refused():
    with pytest.raises(TypeError, match="MarianMTModel, GPT2LMHeadModel, LlamaForCausalLM or BertModel, got Linear"):
        from_huggingface(nn.Linear(2, 2))
    with pytest.raises(TypeError, match="name_or_path must be a str or a path, got int"):
        load_pretrained(3)


def test_load_pretrained_refuses_other_model_types(tmp_path):
    transformers.BertConfig(vocab_size=10, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                            intermediate_size=16).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="model_type 'bert'"):
        load_pretrained(tmp_path)


def _gpt2_tokenizer(folder):
    """A byte-level BPE tokenizer with the 256 byte symbols, a few merges and <|endoftext|>."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    symbols = list(bytes_to_unicode().values())
    merges = [("t", "h"), ("th", "e"), ("Ġ", "the")]
    vocab = {s: i for i, s in enumerate(symbols + ["".join(m) for m in merges] + ["<|endoftext|>"])}
    (folder / "vocab.json").write_text(json.dumps(vocab))
    (folder / "merges.txt").write_text("#version: 0.2\n" + "\n".join(" ".join(m) for m in merges) + "\n")
    return transformers.GPT2Tokenizer(str(folder / "vocab.json"), str(folder / "merges.txt"))


def test_load_pretrained_gpt2_from_a_saved_folder(tmp_path):
    (tmp_path / "files").mkdir()
    tokenizer = _gpt2_tokenizer(tmp_path / "files")
    hf = gpt2(vocab_size=len(tokenizer))
    hf.save_pretrained(tmp_path / "gpt2")
    tokenizer.save_pretrained(tmp_path / "gpt2")
    model, loaded = load_pretrained(tmp_path / "gpt2")
    assert isinstance(model, DecoderOnlyLM) and not model.training
    ids = loaded("the theory", return_tensors="pt").input_ids  # (1, T)
    assert ids.tolist() == tokenizer("the theory", return_tensors="pt").input_ids.tolist()
    with torch.no_grad():
        torch.testing.assert_close(model(ids), hf(ids).logits, atol=ATOL, rtol=ATOL)


def _marian_tokenizer(folder):
    """A MarianTokenizer over a tiny sentencepiece model trained here, from sentences in memory."""
    import sentencepiece as spm

    sentences = ["das ist ein kleines haus", "der hund schläft im haus", "ein kleiner hund",
                 "this is a small house", "the dog sleeps in the house", "a small dog"] * 20
    spm.SentencePieceTrainer.train(sentence_iterator=iter(sentences), model_prefix=str(folder / "spm"),
                                   vocab_size=30, model_type="unigram", character_coverage=1.0,
                                   bos_id=-1, eos_id=-1, unk_id=0, pad_id=-1)
    processor = spm.SentencePieceProcessor(model_file=str(folder / "spm.model"))
    pieces = [processor.id_to_piece(i) for i in range(processor.get_piece_size())]
    vocab = {"</s>": 0, "<unk>": 1}
    for piece in pieces:
        vocab.setdefault(piece, len(vocab))
    vocab["<pad>"] = len(vocab)
    (folder / "vocab.json").write_text(json.dumps(vocab))
    return transformers.MarianTokenizer(source_spm=str(folder / "spm.model"), target_spm=str(folder / "spm.model"),
                                        vocab=str(folder / "vocab.json"))


@pytest.mark.filterwarnings("ignore:Recommended. pip install sacremoses:UserWarning")  # only for its own detokenizer
def test_load_pretrained_marian_from_a_saved_folder(tmp_path):
    (tmp_path / "files").mkdir()
    tokenizer = _marian_tokenizer(tmp_path / "files")
    pad = tokenizer.pad_token_id
    hf = marian(vocab_size=len(tokenizer), pad_token_id=pad, decoder_start_token_id=pad)
    hf.save_pretrained(tmp_path / "marian")
    tokenizer.save_pretrained(tmp_path / "marian")
    model, loaded = load_pretrained(tmp_path / "marian", local_files_only=True)
    assert isinstance(model, Transformer) and not model.training
    batch = loaded(["das ist ein haus", "ein hund"], return_tensors="pt", padding=True)
    assert (batch.input_ids == pad).any()  # the shorter sentence is padded
    reference = hf.generate(**batch, do_sample=False, num_beams=1, max_new_tokens=8)
    tokens = greedy_decode(model, batch.input_ids, max_len=9, bos_id=pad, eos_id=tokenizer.eos_token_id,
                           pad_id=pad, src_mask=(batch.attention_mask == 0)[:, None, None, :])
    assert tokens.tolist() == reference.tolist()


def test_missing_transformers_gives_an_install_hint(monkeypatch):
    import importlib

    import transformer.interop.huggingface_in as pretrained

    real = importlib.import_module

    def without_transformers(name, *args):
        if name == "transformers":
            raise ImportError("No module named 'transformers'")
        return real(name, *args)

    monkeypatch.setattr(pretrained.importlib, "import_module", without_transformers)
    with pytest.raises(ImportError, match=r'pip install -e "\.\[pretrained\]"'):
        from_huggingface(nn.Linear(2, 2))
