"""Tests for transformer/interop/onnx.py (chapters/exporting.md): the committed translator exported to
ONNX must give our logits and our greedy translations under onnxruntime. Nothing reaches the network."""

import os

os.environ["HF_HUB_OFFLINE"] = "1"

import pytest
import torch
from factories import small_transformer
from test_huggingface_out import MODEL, book_greedy

from transformer.tasks.multi30k import BOS_ID, EOS_ID, load_multi30k
from transformer.tasks.translation import load_translator

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def committed():
    return load_translator(MODEL)


@pytest.fixture(scope="module")
def test_de():
    return load_multi30k("test")[0]


@pytest.mark.slow
def test_onnxruntime_gives_pytorchs_logits_and_greedy_translations(committed, tmp_path, test_de):
    from transformer.interop.onnx import DecoderStepGraph, EncoderGraph, export_onnx, onnx_greedy, onnx_sessions

    model, tokenizer = committed
    export_onnx(model, tmp_path)
    encoder, step = onnx_sessions(tmp_path)
    src = torch.tensor([tokenizer.encode(test_de[3]).ids])
    tgt = torch.tensor([[BOS_ID, 25, 300, 41]])
    with torch.no_grad():
        memory = model.encode(src)
        logits = model.output(model.decode(tgt, memory))[:, -1]
        _, weights = DecoderStepGraph(model)(tgt, memory)
        torch.testing.assert_close(EncoderGraph(model)(src), memory, atol=1e-5, rtol=0)
    onnx_memory = encoder.run(None, {"src": src.numpy()})[0]
    torch.testing.assert_close(torch.from_numpy(onnx_memory), memory, atol=1e-4, rtol=0)
    onnx_logits, onnx_weights = step.run(None, {"tgt": tgt.numpy(), "memory": memory.numpy()})
    torch.testing.assert_close(torch.from_numpy(onnx_logits), logits, atol=1e-3, rtol=0)
    torch.testing.assert_close(torch.from_numpy(onnx_weights).sum(-1), torch.ones(1), atol=1e-5, rtol=0)
    torch.testing.assert_close(torch.from_numpy(onnx_weights), weights, atol=1e-5, rtol=0)
    sentences = test_de[:40]
    ours = book_greedy(model, tokenizer, sentences)
    theirs = [onnx_greedy((encoder, step), tokenizer.encode(line).ids, BOS_ID, EOS_ID)[0] for line in sentences]
    assert sum(a == b for a, b in zip(ours, theirs)) >= 39


def test_onnx_sessions_refuse_a_folder_without_the_graphs(tmp_path):
    from transformer.interop.onnx import onnx_sessions

    (tmp_path / "encoder.onnx").write_bytes(b"")
    with pytest.raises(ValueError, match="decoder_step.onnx"):
        onnx_sessions(tmp_path)


@pytest.mark.slow
def test_export_onnx_prints_no_notes(tmp_path):
    # torch's exporter logs "torchvision is not installed. Skipping torchvision::nms" (and more) for
    # every graph, and warns about LeafSpec; export_onnx drops both, so that the book's build (where
    # any stderr output is a warning) and a user's terminal stay quiet.
    import logging
    import warnings

    from transformer.interop.onnx import export_onnx

    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    registry = logging.getLogger("torch.onnx._internal.exporter._registration")
    registry.addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            export_onnx(small_transformer(share_embeddings=True, src_vocab_size=11, tgt_vocab_size=11), tmp_path)
    finally:
        registry.removeHandler(handler)
    assert (tmp_path / "encoder.onnx").is_file() and (tmp_path / "decoder_step.onnx").is_file()
    assert [r.getMessage() for r in records if "torchvision" in r.getMessage()] == []
    assert [str(w.message) for w in caught if "LeafSpec" in str(w.message)] == []


@pytest.mark.slow
def test_export_onnx_leaves_the_callers_model_as_it_was(tmp_path):
    from transformer.interop.onnx import export_onnx

    model = small_transformer(share_embeddings=True, src_vocab_size=11, tgt_vocab_size=11).double().train()
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    export_onnx(model, tmp_path)
    assert model.training and all(p.dtype == torch.float64 and torch.equal(p, before[name])
                                  for name, p in model.named_parameters())
