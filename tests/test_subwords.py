"""Tests for transformer/tasks/subwords.py (chapters/subwords.md)."""

import gzip
import hashlib
import json
import shutil

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from transformer.paths import data_file
from transformer.tasks.multi30k import MULTI30K_SHA256, load_multi30k
from transformer.tasks.subwords import (SPECIAL_TOKENS, WORD_START, bpe_decode, bpe_encode, check_text, learn_bpe,
    pre_tokenize, split_encoding, train_tokenizer, word_counts)


@pytest.fixture(scope="module")
def train():
    return load_multi30k("train")


def library_merges(lines, num_merges):
    """Independent reference: the merges of tokenizers' BpeTrainer with Metaspace words."""
    alphabet = {c for line in lines for word in line.split(" ") for c in WORD_START + word}
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    trainer = trainers.BpeTrainer(vocab_size=len(alphabet) + num_merges, show_progress=False)
    tokenizer.train_from_iterator(lines, trainer)
    return [tuple(m) for m in json.loads(tokenizer.to_str())["model"]["merges"]]


# --- data ---------------------------------------------------------------------------------------

def test_checksums_match_the_files():
    folder = data_file("multi30k/train.de.gz").parent
    for name, digest in MULTI30K_SHA256.items():
        assert hashlib.sha256((folder / name).read_bytes()).hexdigest() == digest


@pytest.mark.parametrize("split, size", [("train", 29_000), ("val", 1_014), ("test", 1_000)])
def test_line_counts(split, size):
    german, english = load_multi30k(split)
    assert len(german) == len(english) == size
    assert all(line.strip() for line in german + english)


def test_pairs_are_aligned(train):
    german, english = train
    assert german[0].startswith("Zwei junge weiße Männer") and english[0].startswith("Two young, White males")
    assert german[-1] != "" and english[-1] != ""


def test_altered_file_is_refused(tmp_path):
    folder = data_file("multi30k/val.de.gz").parent
    for name in ("val.de.gz", "val.en.gz"):
        shutil.copy(folder / name, tmp_path / name)
    assert len(load_multi30k("val", folder=tmp_path)[0]) == 1_014  # the copy is fine
    lines = gzip.decompress((tmp_path / "val.en.gz").read_bytes()).decode("utf-8").split("\n")
    lines[5] = lines[5].upper()
    (tmp_path / "val.en.gz").write_bytes(gzip.compress("\n".join(lines).encode("utf-8")))
    with pytest.raises(ValueError, match="val.en.gz"):
        load_multi30k("val", folder=tmp_path)


def test_missing_file(tmp_path):
    shutil.copy(data_file("multi30k/test_2016_flickr.de.gz"), tmp_path)
    with pytest.raises(FileNotFoundError, match="test_2016_flickr.en.gz"):
        load_multi30k("test", folder=tmp_path)


def test_unknown_split():
    with pytest.raises(ValueError, match="split"):
        load_multi30k("dev")


# --- BPE from scratch ---------------------------------------------------------------------------

def test_hand_worked_merges():
    # "es" and "st" both occur 6 + 3 = 9 times; "e" precedes "s" in the alphabet, so "es" first.
    merges = learn_bpe({"low": 5, "lower": 2, "newest": 6, "widest": 3}, 4)
    assert merges == [("e", "s"), ("es", "t"), ("l", "o"), ("lo", "w")]


def test_pair_counts_are_weighted_by_word_frequency():
    # "ab" occurs 3 times in one word, "cd" twice in each of 2 words, 4 in all: "cd" wins.
    assert learn_bpe({"ab": 3, "cdcd": 1, "cd": 2}, 1) == [("c", "d")]


def test_tie_goes_to_the_earlier_symbols():
    assert learn_bpe({"ba": 1, "ab": 1}, 1) == [("a", "b")]
    # "xy" and "ab" both 2: the left symbol "a" entered the vocabulary first.
    assert learn_bpe({"xy": 2, "ab": 2}, 1) == [("a", "b")]


def test_stops_when_no_pair_is_left():
    merges = learn_bpe({"abc": 1}, 10)
    assert merges == [("a", "b"), ("ab", "c")]


def test_overlapping_pairs_merge_left_to_right():
    merges = learn_bpe({"aaa": 1}, 2)
    assert merges == [("a", "a"), ("aa", "a")]
    assert bpe_encode("aaaaa", merges[:1]) == ["aa", "aa", "a"]


@pytest.mark.parametrize("corpus", [
    ["low lower newest widest", "newest newest widest low"],
    ["ab ab ba  ba", "aaa b", " leading space"],
])
def test_tiny_corpora_match_tokenizers(corpus):
    counts = word_counts(corpus)
    ours = learn_bpe(dict(counts), 6)
    assert ours == library_merges(corpus, len(ours))


def test_real_corpus_matches_tokenizers(train):
    lines = train[0][:300] + train[1][:300]
    ours = learn_bpe(dict(word_counts(lines)), 120)
    assert ours == library_merges(lines, 120)


def test_encode_matches_tokenizers_model(train):
    lines = train[0][:300]
    merges = learn_bpe(dict(word_counts(lines)), 150)
    vocab = {}
    for word in sorted({c for line in lines for w in pre_tokenize(line) for c in w}) + [a + b for a, b in merges]:
        vocab.setdefault(word, len(vocab))
    model = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    model.pre_tokenizer = pre_tokenizers.Metaspace()
    known = [line for line in train[0][300:500] if all(c in vocab or WORD_START + c in vocab for c in line.replace(' ', ''))]
    assert len(known) > 150  # lines with a character the 300 lines lack are left out: no <unk> here
    for line in known:
        ours = [t for word in pre_tokenize(line) for t in bpe_encode(word, merges)]
        assert ours == model.encode(line).tokens


def test_round_trip(train):
    merges = learn_bpe(dict(word_counts(train[0][:200])), 100)
    for line in train[0][1000:1100] + ["zwei  Leerzeichen", " vorne", "Fußballspieler"]:
        tokens = [t for word in pre_tokenize(line) for t in bpe_encode(word, merges)]
        assert bpe_decode(tokens) == line


def test_pre_tokenize_marks_word_starts():
    assert pre_tokenize("Ein Mann.") == ["▁Ein", "▁Mann."]
    assert word_counts(["a b a"]) == {"▁a": 2, "▁b": 1}


@pytest.mark.parametrize("call, error, name", [
    (lambda: learn_bpe({"ab": 1}, 0), ValueError, "num_merges"),
    (lambda: learn_bpe({"ab": 1}, 1.5), TypeError, "num_merges"),
    (lambda: learn_bpe({}, 1), ValueError, "word_counts"),
    (lambda: learn_bpe({"ab": 0}, 1), ValueError, "word_counts"),
    (lambda: learn_bpe({"": 2}, 1), ValueError, "word_counts"),
    (lambda: bpe_encode("", []), ValueError, "word"),
    (lambda: pre_tokenize(3), TypeError, "line"),
    (lambda: word_counts("a b"), TypeError, "lines"),
    (lambda: train_tokenizer(["a b"], 0), ValueError, "vocab_size"),
    (lambda: train_tokenizer([], 10), ValueError, "lines"),
    (lambda: train_tokenizer(["a", 3], 10), ValueError, "lines"),
])
def test_bad_input(call, error, name):
    with pytest.raises(error, match=name):
        call()


# --- the joint vocabulary -----------------------------------------------------------------------

@pytest.fixture(scope="module")
def tokenizer(train):
    return train_tokenizer(train[0] + train[1], 8000)


def test_special_tokens_and_size(tokenizer):
    assert tokenizer.get_vocab_size() == 8000
    assert [tokenizer.token_to_id(t) for t in SPECIAL_TOKENS] == [0, 1, 2, 3]


def test_deterministic(train, tokenizer):
    again = train_tokenizer(train[0] + train[1], 8000)
    assert again.to_str() == tokenizer.to_str()


def test_round_trip_on_real_sentences(tokenizer):
    german, english = load_multi30k("val")
    for line in german + english:
        assert tokenizer.decode(tokenizer.encode(line).ids) == line


def test_unseen_character_is_unknown(tokenizer):
    assert "<unk>" in tokenizer.encode("Ein 漢 Mann").tokens


# --- a line longer than a model takes -----------------------------------------------------------

def parts_of(tokenizer, line, max_tokens):
    return split_encoding(tokenizer.encode(line), line, max_tokens)


def test_a_line_that_fits_is_one_part(tokenizer, train):
    for line in train[0][:50]:
        assert parts_of(tokenizer, line, 256) == [tokenizer.encode(line).ids]


@pytest.mark.parametrize("max_tokens", [1, 3, 8, 40])
def test_parts_hold_every_token_once_in_order_and_fit(tokenizer, train, max_tokens):
    line = " ".join(train[0][:20]) + " Donaudampfschifffahrtsgesellschaftskapitänsmütze  «Hallo!» z. B. ...  "
    parts = parts_of(tokenizer, line, max_tokens)
    assert [i for part in parts for i in part] == tokenizer.encode(line).ids
    assert all(1 <= len(part) <= max_tokens for part in parts)


def test_a_long_line_is_cut_at_its_sentence_ends(tokenizer, train):
    sentences = [s for s in train[0][:400] if s.endswith(".") and ". " not in s][:30]  # one sentence each
    line = " ".join(sentences)
    assert len(tokenizer.encode(line).ids) > 100
    # the reference: each sentence encoded alone (Metaspace: a word's tokens do not depend on its neighbours)
    assert parts_of(tokenizer, line, 100) == [tokenizer.encode(s).ids for s in sentences]
    assert [tokenizer.decode(part) for part in parts_of(tokenizer, line, 100)] == sentences
    question = "Ist das ein Hund? Ja! Das ist \"ein Hund.\" Und dann…  noch einer."
    assert [tokenizer.decode(part) for part in parts_of(tokenizer, question, 10)] == [
        "Ist das ein Hund?", "Ja!", "Das ist \"ein Hund.\"", "Und dann", " noch einer."]  # … is <unk> here


def test_a_sentence_too_long_is_cut_before_words_and_a_word_anywhere(tokenizer):
    words = "ein kleiner Hund läuft über eine grüne Wiese".split()
    line = " ".join(words * 30)  # 240 words, no sentence end
    parts = parts_of(tokenizer, line, 25)
    assert all(tokenizer.decode(part).split() for part in parts)
    assert " ".join(tokenizer.decode(part) for part in parts) == line  # every cut falls between words
    assert all(len(part) > 25 - max(len(tokenizer.encode(w).ids) for w in words) for part in parts[:-1])  # filled
    word = "x" * 50 + "ä" * 50  # one word of many tokens
    assert [len(part) for part in parts_of(tokenizer, word, 7)][:-1] == [7] * (len(tokenizer.encode(word).ids) // 7)


def test_a_sentence_too_long_is_cut_in_pieces_of_piece_tokens_and_one_that_fits_stays_whole(tokenizer, train):
    short, long = train[0][0], " ".join(s.rstrip(".") for s in train[0][1:40])  # one sentence, then a long one
    line = f"{short} {long}."
    n_short = len(tokenizer.encode(short).ids)
    assert 8 < n_short < 30 < len(tokenizer.encode(long).ids)
    parts = split_encoding(tokenizer.encode(line), line, 30, 8)
    assert parts[0] == tokenizer.encode(short).ids  # longer than 8 tokens, but it fits: whole
    assert all(len(part) <= 8 for part in parts[1:]) and len(parts) > 10
    assert [i for part in parts for i in part] == tokenizer.encode(line).ids
    assert split_encoding(tokenizer.encode(line), line, 30, 99) == split_encoding(tokenizer.encode(line), line, 30)


def test_split_encoding_refuses_a_bad_limit(tokenizer):
    with pytest.raises(ValueError, match="max_tokens must be a positive int, got 0"):
        parts_of(tokenizer, "Ein Hund.", 0)
    with pytest.raises(ValueError, match="piece_tokens must be a positive int, got -2"):
        split_encoding(tokenizer.encode("Ein Hund."), "Ein Hund.", 5, -2)
    with pytest.raises(ValueError, match="piece_tokens must be a positive int, got 0"):
        split_encoding(tokenizer.encode("Ein Hund."), "Ein Hund.", 5, 0)


def test_check_text_names_the_item_that_is_not_text():
    assert check_text("lines", ("a", "b")) == ["a", "b"]
    assert check_text("lines", []) == []
    with pytest.raises(TypeError, match=r"lines must be a sequence of str \(one sentence each\), got str"):
        check_text("lines", "Ein Hund.")
    with pytest.raises(TypeError, match="got an item of type bytes at index 2"):
        check_text("lines", ["a", "b", b"c"])
    bad = b"Gr\xfcn ist die Wiese".decode("utf-8", errors="surrogateescape")  # Latin-1 read as UTF-8
    with pytest.raises(ValueError, match=r"lines\[1\] is not text: it holds the lone surrogate '\\udcfc' at character 2"):
        check_text("lines", ["Ein Hund.", bad])
    with pytest.raises(ValueError, match=r"lines\[0\] is not text"):
        check_text("lines", ["\ud800"])


def test_a_vocabulary_smaller_than_the_texts_characters_is_refused_not_enlarged():
    # 15 letters, the word mark ▁ and the 4 special tokens: 20 tokens before any merge
    with pytest.raises(ValueError, match=r"vocab_size 5 is too small for this text: .* are 20 tokens; use 20 or more"):
        train_tokenizer(["the quick brown fox"], 5)
    assert train_tokenizer(["the quick brown fox"], 20).get_vocab_size() == 20
