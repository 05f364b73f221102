"""The package's one checkpoint format (``transformer/training/checkpoint.py``, chapter "Training the model"):
every kind written by ``save_checkpoint`` and rebuilt by ``load_checkpoint``; the committed models, which are
of older formats, read through the converter with the outputs their own recipes give; the refusals."""

import ast
import importlib
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer

from transformer.cli.classify import RUN_SETTINGS, load_classifier, save_classifier
from transformer.nn.detector import DigitDetector
from transformer.nn.encoder_only import MaskedLanguageModel, SequenceClassifier
from transformer.tasks.masked_lm import from_settings, load_mlm
from transformer.tasks.multi30k import TranslationConfig, make_translation_model
from transformer.tasks.numbers import source_vocab, target_vocab
from transformer.tasks.translation import load_translator, translate
from transformer.training.checkpoint import (BUILDERS, FORMAT, VERSION, check_resume, load_checkpoint, model_of,
                                             read_checkpoint, save_checkpoint)
from transformer.training.config import TrainConfig, make_model

ROOT = Path(__file__).resolve().parent.parent
MODELS = ROOT / "models"
SMALL_MLM = dict(vocab_size=50, d_model=16, num_heads=2, d_ff=32, num_layers=1, dropout=0.0, max_len=12, pad_id=0)
SMALL_DETECTOR = dict(image_size=16, patch_size=4, num_classes=10, num_queries=4, d_model=16, num_heads=2, d_ff=32)

pytestmark = pytest.mark.usefixtures("one_thread")


def _tokens(vocab_size: int, shape: tuple[int, ...], seed: int = 0) -> torch.Tensor:
    """Token ids in [4, vocab_size): no padding, no special tokens."""
    return torch.randint(4, vocab_size, shape, generator=torch.Generator().manual_seed(seed))


def _images(size: int, count: int = 3) -> torch.Tensor:
    return torch.rand(count, 1, size, size, generator=torch.Generator().manual_seed(0))


# --- the committed models: older formats, read as they are ---------------------------------------

def test_a_classifier_of_the_older_format_reads_with_the_outputs_of_its_own_recipe(tmp_path):
    """The format the committed spam classifier had until 2026-11-30 (settings, state_dict, task and what
    labelling needs, no "format"), written from the committed classifier's weights: the converter reads it."""
    model_now, tokenizer_now, checkpoint_now = load_classifier(MODELS / "spam-classifier" / "classifier.pt")
    settings = {name: value for name, value in checkpoint_now["config"].items() if name not in RUN_SETTINGS}
    raw = {"task": "classify", "settings": settings, "state_dict": model_now.state_dict(),
           "labels": checkpoint_now["labels"], "tokenizer": tokenizer_now.to_str(),
           "length": checkpoint_now["length"], "reads": checkpoint_now["reads"]}
    path = tmp_path / "classifier.pt"
    torch.save(raw, path)
    old = from_settings(SequenceClassifier, raw["settings"], num_classes=len(raw["labels"]), pooling="mean").eval()
    old.load_state_dict(raw["state_dict"])
    model, tokenizer, checkpoint = load_classifier(path)
    tokens = _tokens(raw["settings"]["vocab_size"], (4, raw["length"]))
    with torch.no_grad():
        assert torch.equal(model(tokens), old(tokens))
    assert (checkpoint["kind"], checkpoint["labels"], checkpoint["reads"]) == ("classifier", raw["labels"], raw["reads"])
    assert tokenizer.to_str() == raw["tokenizer"]
    assert type(load_checkpoint(path)) is SequenceClassifier  # its kind told by its "task"


def test_the_committed_masked_lm_reads_with_the_outputs_of_its_own_recipe():
    raw = torch.load(MODELS / "spam-mlm" / "model.pt", map_location="cpu", weights_only=True)
    assert raw.keys() == {"settings", "state_dict"}
    old = from_settings(MaskedLanguageModel, raw["settings"]).eval()
    old.load_state_dict(raw["state_dict"])
    model, tokenizer = load_mlm(MODELS / "spam-mlm")
    tokens = _tokens(raw["settings"]["vocab_size"], (2, 16))
    with torch.no_grad():
        assert torch.equal(model(tokens), old(tokens))
    assert tokenizer.to_str() == Tokenizer.from_file(str(MODELS / "spam-mlm" / "tokenizer.json")).to_str()
    with pytest.raises(ValueError, match=r"model.pt is an older file of settings and state_dict .*: read it with "
                                         r"read_checkpoint\(path, kind=...\)$"):
        load_checkpoint(MODELS / "spam-mlm" / "model.pt")  # whose kind only its reader knows


def test_the_committed_detector_reads_with_the_outputs_of_its_own_recipe():
    path = MODELS / "digit-detector" / "model.pt"
    raw = torch.load(path, map_location="cpu", weights_only=True)
    old = DigitDetector(**raw["settings"]).eval()
    old.load_state_dict(raw["state_dict"])
    model = load_checkpoint(path, kind="detector")
    images = _images(raw["settings"]["image_size"])
    with torch.no_grad():
        for new_part, old_part in zip(model(images), old(images), strict=True):
            assert torch.equal(new_part, old_part)
    checkpoint = read_checkpoint(path, kind="detector")
    assert checkpoint["step"] == raw["step"] and checkpoint["machine"] == raw["machine"]


def test_the_committed_translator_reads_through_load_checkpoint_as_through_load_translator():
    path = MODELS / "multi30k" / "model.pt"
    raw = torch.load(path, map_location="cpu", weights_only=True)
    tokenizer = Tokenizer.from_str(raw["tokenizer"])
    old = make_translation_model(TranslationConfig(**raw["config"]), tokenizer.get_vocab_size()).eval()
    old.load_state_dict({name: tensor.float() for name, tensor in raw["model"].items()})
    model, loaded_tokenizer = load_translator(path)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), old.state_dict().values(), strict=True))
    sentences = ["Ein Hund läuft im Park.", "Zwei Kinder spielen."]
    assert translate(model, loaded_tokenizer, sentences) == translate(old, tokenizer, sentences)
    assert read_checkpoint(path)["kind"] == "translator"


# --- today's format: every kind round trip -------------------------------------------------------

def test_every_kind_is_a_key_of_builders_and_names_a_function():
    assert set(BUILDERS) == {"numbers", "translator", "classifier", "masked_lm", "detector"}
    for kind, where in BUILDERS.items():
        module, name = where.split(":")
        assert callable(getattr(importlib.import_module(module), name)), kind


def test_training_imports_no_task_for_its_builders():
    source = (ROOT / "transformer" / "training" / "checkpoint.py").read_text()
    imported = [node.module for node in ast.walk(ast.parse(source)) if isinstance(node, ast.ImportFrom)]
    assert not [module for module in imported if module and module.startswith(("transformer.tasks", "transformer.cli"))]


def test_a_saved_classifier_holds_the_format_and_loads_the_same(tmp_path):
    torch.manual_seed(0)
    settings = dict(SMALL_MLM)
    model = from_settings(SequenceClassifier, settings, num_classes=3, pooling="mean").eval()
    tokenizer = Tokenizer.from_file(str(MODELS / "spam-mlm" / "tokenizer.json"))
    save_classifier(tmp_path / "c.pt", model, settings, tokenizer, ["a", "b", "c"], 12, "text")
    raw = torch.load(tmp_path / "c.pt", weights_only=True)
    assert (raw["format"], raw["version"], raw["kind"], raw["config"]) == (FORMAT, VERSION, "classifier", settings)
    loaded, _, checkpoint = load_classifier(tmp_path / "c.pt")
    tokens = _tokens(50, (2, 12))
    with torch.no_grad():
        assert torch.equal(loaded(tokens), model(tokens))
    assert (checkpoint["labels"], checkpoint["length"], checkpoint["reads"]) == (["a", "b", "c"], 12, "text")


@pytest.mark.parametrize("kind, build, example", [
    ("masked_lm", lambda: from_settings(MaskedLanguageModel, SMALL_MLM), lambda: _tokens(50, (2, 10))),
    ("detector", lambda: DigitDetector(**SMALL_DETECTOR), lambda: _images(16)),
])
def test_a_saved_model_of_each_kind_loads_the_same(tmp_path, kind, build, example):
    torch.manual_seed(0)
    model = build().eval()
    config = SMALL_MLM if kind == "masked_lm" else SMALL_DETECTOR
    save_checkpoint(tmp_path / "m.pt", model, None, None, 7, {"loss": [1.0]}, config=config, kind=kind)
    loaded = load_checkpoint(tmp_path / "m.pt")
    assert type(loaded) is type(model) and not loaded.training
    with torch.no_grad():
        expected, got = model(example()), loaded(example())
    for a, b in zip(expected if isinstance(expected, tuple) else (expected,),
                    got if isinstance(got, tuple) else (got,), strict=True):
        assert torch.equal(a, b)
    assert read_checkpoint(tmp_path / "m.pt", kind=kind)["history"] == {"loss": [1.0]}


def test_a_file_of_version_1_reads_as_today(tmp_path):
    model = make_model(TrainConfig(), source_vocab(), target_vocab())
    save_checkpoint(tmp_path / "new.pt", model, None, None, 3, config=TrainConfig(),
                    src_vocab=source_vocab(), tgt_vocab=target_vocab())
    old = {k: v for k, v in torch.load(tmp_path / "new.pt", weights_only=True).items()
           if k not in ("format", "version", "kind")}  # what save_checkpoint wrote before the format had a name
    torch.save(old, tmp_path / "v1.pt")
    assert read_checkpoint(tmp_path / "v1.pt")["kind"] == "numbers"
    loaded = load_checkpoint(tmp_path / "v1.pt")
    assert all(torch.equal(a, b) for a, b in zip(loaded.state_dict().values(), model.state_dict().values(), strict=True))
    # the detector's training state of version 1 kept its run's settings as "recipe": they become its config
    recipe = {"steps": 6, "seed": 3}
    torch.save({"model": {}, "step": 2, "history": {}, "recipe": recipe}, tmp_path / "run.pt")
    checkpoint = read_checkpoint(tmp_path / "run.pt")
    assert (checkpoint["kind"], checkpoint["config"]) == (None, recipe) and "recipe" not in checkpoint
    with pytest.raises(ValueError, match=r"run.pt: it was trained with other settings: seed=3 there, 4 here$"):
        check_resume(checkpoint, {"steps": 6, "seed": 4}, tmp_path / "run.pt", may_change=())


# --- refusals ---------------------------------------------------------------------------------------

def test_refusals_name_the_file_and_what_it_holds(tmp_path):
    model = from_settings(MaskedLanguageModel, SMALL_MLM)
    with pytest.raises(ValueError, match=r"^kind must be one of \['classifier', .*\] or None, got 'mine'$"):
        save_checkpoint(tmp_path / "x.pt", model, None, None, 0, kind="mine")
    with pytest.raises(ValueError, match=r"^extra must not replace the checkpoint's own entries, got \['kind'\]$"):
        save_checkpoint(tmp_path / "x.pt", model, None, None, 0, extra={"kind": "detector"})
    save_checkpoint(tmp_path / "m.pt", model, None, None, 0, config=SMALL_MLM, kind="masked_lm")
    raw = torch.load(tmp_path / "m.pt", weights_only=True)
    torch.save({**raw, "version": VERSION + 1}, tmp_path / "newer.pt")
    with pytest.raises(ValueError, match=rf"newer.pt is a checkpoint of format version {VERSION + 1}; this version "
                                         rf"of the package reads versions up to {VERSION}$"):
        read_checkpoint(tmp_path / "newer.pt")
    torch.save({**raw, "kind": "mine"}, tmp_path / "mine.pt")
    with pytest.raises(ValueError, match=r"mine.pt holds a model of kind 'mine', which this package cannot build"):
        load_checkpoint(tmp_path / "mine.pt")
    with pytest.raises(ValueError, match=r"m.pt is a masked language model's checkpoint, not a detector's: "
                                         r"load_checkpoint\(path\) loads any kind$"):
        load_checkpoint(tmp_path / "m.pt", kind="detector")
    save_checkpoint(tmp_path / "state.pt", model, None, None, 0)
    with pytest.raises(ValueError, match=r"state.pt does not describe its model .*load_checkpoint\(path, model\)$"):
        model_of(read_checkpoint(tmp_path / "state.pt"), tmp_path / "state.pt")
