"""Tests for transformer/tasks/cards.py (chapters/long_runs.md): the model card that goes with a shared
translator, checked against the records it is made from, read here independently."""

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from transformer.tasks.cards import model_card
from transformer.tasks.multi30k import TranslationConfig, make_translation_model
from transformer.tasks.translation import save_translator
from transformer.tasks.subwords import train_tokenizer

RECORDS = Path(__file__).resolve().parents[1] / "models" / "multi30k"
DATA_README = Path(__file__).resolve().parents[1] / "data" / "README.md"


@pytest.fixture(scope="module")
def card():
    return model_card(RECORDS / "model.pt", "opus-book-de-en")


def test_the_card_is_the_record_kept_with_the_model_and_names_the_file_by_its_checksum(card):
    assert card.startswith("---\nlibrary_name: transformers\npipeline_tag: translation\n")
    assert (RECORDS / "README.md").read_text(encoding="utf-8").strip() in card  # source, how it was made, terms
    digest = hashlib.sha256((RECORDS / "model.pt").read_bytes()).hexdigest()
    assert f"from `model.pt` (SHA-256 `{digest}`), step 5000, the average of steps 4000, 4250, 4500, 4750, 5000" in card
    assert "d_model 256, num_heads 4, num_layers 3, d_ff 1024, max_len 256, vocab_size 8000" in card


def test_the_card_gives_the_recorded_figures(card):
    results = json.loads((RECORDS / "results.json").read_text())["averaged"]  # model.pt is the average
    for key in ("test_greedy", "test_beam"):
        assert f"{results[key]['bleu']:.2f} | {results[key]['chrf']:.2f} |" in card.replace("**", "")


def test_the_card_says_how_the_model_was_made(card):
    command = (RECORDS / "train.log").read_text().strip().splitlines()[-1]
    assert command.startswith("python3 -m transformer.train --task multi30k")
    assert " ".join(card.replace("\\\n", " ").split()).count(" ".join(command.split())) == 1
    assert "NVIDIA H100" in card


def test_the_card_carries_multi30ks_terms_and_citation(card):
    terms = DATA_README.read_text(encoding="utf-8").split("## `multi30k/`", 1)[1]
    assert "for research and non-commercial educational use" in terms  # what data/README.md says
    terms_section = card.split("## Terms of the data", 1)[1].split("## How to load it")[0]
    assert "research and non-commercial educational use" in terms_section
    assert "Multi30K: Multilingual English-German Image Descriptions" in terms_section
    assert "Elliott" in terms_section and "pages 70–74" in terms_section


def test_the_card_says_how_to_load_it(card):
    code = card.split("## How to load it", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    compile(code, "card", "exec")  # Python that runs (tests/test_huggingface_out.py loads a real folder)
    assert 'MarianMTModel.from_pretrained("opus-book-de-en")' in code


def test_a_checkpoint_without_records_says_what_is_not_recorded(tmp_path):
    tokenizer = train_tokenizer(["ein Hund", "a dog"], 40)
    config = TranslationConfig(d_model=16, num_heads=2, num_layers=1, d_ff=32, vocab_size=40)
    save_translator(tmp_path / "mine.pt", make_translation_model(config, tokenizer.get_vocab_size()), tokenizer,
                    config, step=7)
    card = model_card(tmp_path / "mine.pt")
    assert "# A Transformer translator" in card and "step 7;" in card and "d_model 16" in card
    assert ("How it was made, its figures and its terms are not recorded beside the checkpoint: the model is "
            "derived from its training data, on their terms.") in card
    assert "Multi30k" not in card and 'from_pretrained("FOLDER")' in card
    shutil.copy(RECORDS / "README.md", tmp_path / "README.md")  # records beside it are read
    assert "research and non-commercial educational use" in model_card(tmp_path / "mine.pt")
