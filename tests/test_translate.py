"""Tests for transformer/tasks/translation.py (chapters/translation.md): token-count batches, translating,
sacreBLEU scores, saving, loading and averaging, the committed Multi30k model, and the two commands."""

import copy
import dataclasses
import io
import json
import math
import os
import random
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from processes import interruptible, run_ranks
import sacrebleu
import torch

import transformer
from transformer.tasks.numbers import source_vocab, target_vocab
from transformer.tasks.subwords import SPECIAL_TOKENS, split_encoding, train_tokenizer
from transformer.tasks.multi30k import load_multi30k
from transformer.cli.options import config_from_args
from transformer.cli.train import main as train_cli
from transformer.training.checkpoint import save_checkpoint
from transformer.training.config import make_model, TrainConfig
from transformer.training.checkpoint import average_checkpoints
from transformer.tasks.metrics import corpus_scores
from transformer.tasks.multi30k import (BOS_ID, encode_lines, EOS_ID, make_translation_model, PAD_ID, pair_batch,
    token_batches, translation_batches, TranslationConfig)
from transformer.cli.train import build_multi30k_parser
from transformer.cli.translate import main
from benchmarks.translation_outputs import DECODINGS, SAMPLE, read_outputs
from transformer.tasks.translation import (TranslatorFolder, fit_translation, load_translator, save_translator, translate,
                                          translate_lines)

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

# The package under test, also for the processes the tests start; the data is found from the book's root.
ROOT = Path(transformer.__file__).resolve().parent.parent
MODEL = ROOT / "models" / "multi30k" / "model.pt"
RESULTS = ROOT / "models" / "multi30k" / "results.json"
TRAIN_LOG = ROOT / "models" / "multi30k" / "train.log"
TIMEOUT = 180  # seconds for a started process; a healthy one takes a few
# A model small enough to train a few steps in a fraction of a second.
TINY = dict(d_model=32, num_heads=2, num_layers=1, d_ff=64, max_len=128, batch_tokens=256, batch_size=64,
            warmup=4, vocab_size=300, eval_size=0)
GERMAN = ["Ein Hund läuft.", "Zwei Männer spielen Fußball auf einer grünen Wiese.", "Eine Frau.",
          "Ein kleines Mädchen in einem rosa Kleid sitzt auf einer Bank im Park und isst ein Eis.",
          "Kinder spielen.", "Ein Mann fährt Fahrrad."]


def _env(**extra: str) -> dict[str, str]:
    """The environment of a child process: this package first, one thread, no torchrun leftovers."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    return {**env, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "PYTHONIOENCODING": "utf-8", **extra}


@pytest.fixture(autouse=True)
def _alone(monkeypatch):
    """Every test starts as a process that torchrun did not start."""
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="module")
def train_pairs():
    german, english = load_multi30k("train")
    return german[:300], english[:300]


@pytest.fixture(scope="module")
def tokenizer(train_pairs):
    return train_tokenizer([*train_pairs[0], *train_pairs[1]], 300)


@pytest.fixture(scope="module")
def committed():
    """The committed model and its tokenizer."""
    return load_translator(MODEL)


def tiny_model(tokenizer, seed=0, **changes):
    torch.manual_seed(seed)
    return make_translation_model(TranslationConfig(**{**TINY, **changes}), tokenizer.get_vocab_size())


# --- batches by token count -------------------------------------------------------------------

@pytest.fixture(scope="module")
def lengths():
    """Random lengths of 1 to 60 tokens, with three pairs longer than any batch of the tests."""
    rng = random.Random(5)
    src = [rng.randint(1, 60) for _ in range(1000)]
    tgt = [max(1, s + rng.randint(-8, 8)) for s in src]
    src[10], tgt[10] = 300, 2
    src[500], tgt[500] = 260, 3
    src[999], tgt[999] = 5, 280  # long on the target side only
    return src, tgt


@pytest.mark.parametrize("batch_tokens, max_sentences", [(256, 1000), (128, 1000), (4096, 7), (1, 5)])
def test_token_batches_hold_every_pair_once_within_the_token_budget(lengths, batch_tokens, max_sentences):
    src, tgt = lengths
    batches = token_batches(src, tgt, batch_tokens, max_sentences, seed=1)
    assert sorted(i for batch in batches for i in batch) == list(range(len(src)))
    for batch in batches:
        assert 1 <= len(batch) <= max_sentences
        padded = len(batch) * max(max(src[i] for i in batch), max(tgt[i] for i in batch))
        # Only a pair that alone exceeds the budget may exceed it, in a batch of its own.
        assert padded <= batch_tokens or (len(batch) == 1 and max(src[batch[0]], tgt[batch[0]]) > batch_tokens)
    if batch_tokens == 4096:  # the budget never binds: the sentence cap alone cuts the batches
        assert sorted(map(len, batches)) == [len(src) % 7] + [7] * (len(src) // 7)


def test_token_batches_group_similar_lengths(lengths):
    src, tgt = lengths
    batches = token_batches(src, tgt, 512, 1000)

    def padding(groups):  # the padding tokens of the longer side of every batch
        return sum(len(g) * max(max(src[i], tgt[i]) for i in g) - sum(max(src[i], tgt[i]) for i in g)
                   for g in groups)

    order = random.Random(1).sample(range(len(src)), len(src))  # the same batch sizes, pairs drawn at random
    starts = [0]
    for batch in batches:
        starts.append(starts[-1] + len(batch))
    drawn = [order[a:b] for a, b in zip(starts, starts[1:])]
    assert padding(batches) < padding(drawn) / 4  # sorted by length: a small share of the padding


def test_token_batches_are_a_function_of_the_seed(lengths):
    src, tgt = lengths
    first = token_batches(src, tgt, 256, 1000, seed=3)
    assert token_batches(src, tgt, 256, 1000, seed=3) == first
    other = token_batches(src, tgt, 256, 1000, seed=4)
    assert other != first and sorted(i for b in other for i in b) == list(range(len(src)))
    # grouped by length, but not served by length: the batches are shuffled
    longest = [max(src[i] for i in batch) for batch in first]
    assert longest != sorted(longest) and longest != sorted(longest, reverse=True)
    assert token_batches([], [], 8, 2) == []


@pytest.mark.parametrize("call, error, message", [
    (lambda: token_batches([1, 2, 3], [1, 2], 8, 2), ValueError,
     "src_lengths and tgt_lengths must have the same length, got 3 and 2"),
    (lambda: token_batches([1], [1], 0, 2), ValueError, "batch_tokens must be a positive int, got 0"),
    (lambda: token_batches([1], [1], -5, 2), ValueError, "batch_tokens must be a positive int, got -5"),
    (lambda: token_batches([1], [1], 8.0, 2), TypeError, "batch_tokens must be a positive int, got float"),
    (lambda: token_batches([1], [1], 8, 0), ValueError, "max_sentences must be a positive int, got 0"),
])
def test_token_batches_refuse_bad_arguments(call, error, message):
    with pytest.raises(error, match=message):
        call()


@pytest.fixture(scope="module")
def rows():
    """60 distinct pairs of token rows of 1 to 12 ids (ids from 4: no special tokens)."""
    rng = random.Random(0)
    src = [[4 + i] + [rng.randint(4, 99) for _ in range(rng.randint(0, 11))] for i in range(60)]
    tgt = [[rng.randint(4, 99) for _ in range(rng.randint(1, 12))] for _ in range(60)]
    return src, tgt


def test_translation_batches_resume_where_an_unbroken_stream_would_be(rows):
    src, tgt = rows
    config = TranslationConfig(batch_tokens=40, batch_size=6, seed=2)
    unbroken = translation_batches(src, tgt, config)
    expected, seen = [], []  # the first epoch: until every pair was served (each row starts with its own id)
    while len(seen) < 60:
        expected.append(next(unbroken))
        seen += [row[0] for row in expected[-1].src.tolist()]
    assert sorted(seen) == [4 + i for i in range(60)]  # every pair once
    per_epoch = len(expected)
    expected += [next(unbroken) for _ in range(2 * per_epoch)]  # about two epochs more
    # The second epoch is grouped and shuffled anew.
    assert [b.src.tolist() for b in expected[per_epoch:2 * per_epoch]] != [b.src.tolist() for b in expected[:per_epoch]]
    for k in (0, 3, per_epoch - 1, per_epoch, per_epoch + 2, 2 * per_epoch + 1):
        resumed = translation_batches(src, tgt, config, start_step=k)
        for step in range(k, min(k + per_epoch + 2, len(expected))):  # across the next epoch boundary
            batch = next(resumed)
            for name, tensor in zip(batch._fields, batch):
                assert torch.equal(tensor, getattr(expected[step], name)), (k, step, name)


def test_translation_batches_keep_the_budget_on_the_padded_tensors(rows):
    src, tgt = rows
    stream = translation_batches(src, tgt, TranslationConfig(batch_tokens=40, batch_size=6))
    for _ in range(30):
        batch = next(stream)
        assert batch.src.numel() <= 40 and batch.tgt_in.numel() <= 40 and batch.src.shape[0] <= 6


def test_pair_batch_adds_bos_and_eos_and_masks_the_padding():
    batch = pair_batch([[5, 6, 7], [8]], [[9], [10, 11, 12]])
    assert batch.src.tolist() == [[5, 6, 7], [8, PAD_ID, PAD_ID]]
    assert batch.tgt_in.tolist() == [[BOS_ID, 9, PAD_ID, PAD_ID], [BOS_ID, 10, 11, 12]]
    assert batch.tgt_out.tolist() == [[9, EOS_ID, PAD_ID, PAD_ID], [10, 11, 12, EOS_ID]]
    assert batch.src_mask.tolist() == [[[[False, False, False]]], [[[False, True, True]]]]
    assert batch.tgt_mask.tolist() == [[[[False, False, True, True]]], [[[False, False, False, False]]]]


def test_pair_batch_shifts_the_target_by_one_for_teacher_forcing(rows):
    src, tgt = rows
    batch = pair_batch(src[:8], tgt[:8])
    for row_in, row_out, ids in zip(batch.tgt_in.tolist(), batch.tgt_out.tolist(), tgt[:8]):
        assert row_in[0] == BOS_ID and row_in[1:len(ids) + 1] == ids == row_out[:len(ids)]
        assert row_out[len(ids)] == EOS_ID and set(row_out[len(ids) + 1:]) <= {PAD_ID}


def test_encode_lines_are_the_tokenizers_ids_without_special_tokens(tokenizer, committed):
    for vocabulary in (tokenizer, committed[1]):  # the ids of the special tokens are the tokenizers'
        assert [vocabulary.token_to_id(t) for t in SPECIAL_TOKENS[:3]] == [PAD_ID, BOS_ID, EOS_ID]
        assert SPECIAL_TOKENS[:3] == ("<pad>", "<bos>", "<eos>")
    ids = encode_lines(tokenizer, GERMAN)
    assert ids == [tokenizer.encode(line).ids for line in GERMAN]
    assert all(i > 3 for row in ids for i in row)  # seen characters: no <unk>, no specials
    assert [tokenizer.decode(row) for row in ids] == GERMAN


# --- scores -----------------------------------------------------------------------------------

def test_corpus_scores_are_sacrebleus():
    hypotheses = ["A dog runs on the grass .", "two men play soccer", "A woman is sitting on a bench.", ""]
    references = ["A dog is running on the grass.", "Two men are playing soccer.", "A woman sits on a bench.",
                  "Children are playing."]
    scores = corpus_scores(hypotheses, references)
    assert scores["bleu"] == sacrebleu.corpus_bleu(hypotheses, [references]).score
    assert scores["chrf"] == sacrebleu.corpus_chrf(hypotheses, [references]).score
    assert 0 < scores["bleu"] < 100 and 0 < scores["chrf"] < 100
    version = sacrebleu.__version__
    assert scores["bleu_signature"] == f"nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:{version}"
    assert scores["chrf_signature"] == f"nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no|version:{version}"
    # Cased: a lower-cased copy of the references is not a perfect score, an exact copy is.
    assert corpus_scores([r.lower() for r in references], references)["bleu"] < 100
    perfect = corpus_scores(references, references)
    assert perfect["bleu"] == pytest.approx(100) and perfect["chrf"] == pytest.approx(100)


def test_corpus_scores_refuse_lists_of_different_lengths():
    with pytest.raises(ValueError, match="hypotheses and references must have the same length, got 2 and 1"):
        corpus_scores(["a", "b"], ["a"])


# --- translating ------------------------------------------------------------------------------

def greedy_by_hand(model, tokenizer, sentence, extra_len=50):
    """Reference: the whole prefix through the model's forward at every step, the most likely token."""
    src = torch.tensor([tokenizer.encode(sentence).ids])
    tokens = [BOS_ID]
    with torch.no_grad():
        while len(tokens) - 1 < src.shape[1] + extra_len:
            token = model(src, torch.tensor([tokens]))[0, -1].argmax().item()
            if token == EOS_ID:
                break
            tokens.append(token)
    return tokenizer.decode(tokens[1:])


class CountingTokenizer:
    """The test tokenizer, but ``decode`` answers with the ids it was given (as JSON)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def encode_batch(self, lines):
        return self.tokenizer.encode_batch(lines)

    def decode(self, ids):
        return json.dumps(list(ids))


def test_greedy_translation_is_the_most_likely_token_step_by_step_in_the_input_order(committed):
    model, tokenizer = committed
    expected = [greedy_by_hand(model, tokenizer, s) for s in GERMAN]
    # batches of at most 40 tokens, sentences sorted by length: GERMAN's order is not theirs
    assert translate(model, tokenizer, GERMAN, beam_size=1, batch_tokens=40) == expected
    assert "dog" in expected[0] and "men" in expected[1]  # and it is English
    # what is decoded: the tokens after <bos> and before <eos>, nothing special
    ids = [json.loads(out) for out in translate(model, CountingTokenizer(tokenizer), GERMAN)]
    assert [tokenizer.decode(row) for row in ids] == expected
    assert all(i not in (PAD_ID, BOS_ID, EOS_ID) for row in ids for i in row)
    assert translate(model, tokenizer, GERMAN[::-1]) == expected[::-1]


@pytest.mark.slow  # beam search over many batch sizes
@pytest.mark.parametrize("beam_size", [1, 4])
def test_translation_batches_hold_at_most_batch_tokens_tokens_of_hypotheses(committed, monkeypatch, beam_size):
    model, tokenizer = committed
    german = load_multi30k("test")[0][:120]
    seen = []

    def recording(decode):
        def run(model, src, *args, **kwargs):
            seen.append(tuple(src.shape))  # (B, S)
            return decode(model, src, *args, **kwargs)
        return run

    import transformer.tasks.translation as module
    monkeypatch.setattr(module, "greedy_decode", recording(module.greedy_decode))
    monkeypatch.setattr(module, "beam_search", recording(module.beam_search))
    translate(model, tokenizer, german, beam_size=beam_size, batch_tokens=600)
    assert sum(rows for rows, _ in seen) == len(german)
    assert all(rows * length * beam_size <= 600 or rows == 1 for rows, length in seen), seen
    assert max(rows for rows, _ in seen) >= 600 // (beam_size * max(length for _, length in seen))  # batches fill up
    assert len(seen) < len(german) / 4  # not one sentence at a time


def test_beam_translation_keeps_the_input_order(committed):
    model, tokenizer = committed
    one_by_one = [translate(model, tokenizer, [s], beam_size=3)[0] for s in GERMAN]
    assert translate(model, tokenizer, GERMAN, beam_size=3, batch_tokens=120) == one_by_one
    assert translate(model, tokenizer, ["", *GERMAN[:2], ""], beam_size=3) == ["", *one_by_one[:2], ""]


def test_empty_lines_translate_to_empty_lines_in_place(committed):
    model, tokenizer = committed
    alone = translate(model, tokenizer, GERMAN[:2])
    assert translate(model, tokenizer, ["", GERMAN[0], "", "", GERMAN[1], ""]) == ["", alone[0], "", "", alone[1], ""]
    assert translate(model, tokenizer, ["", ""]) == ["", ""]
    assert translate(model, tokenizer, []) == []


@pytest.mark.parametrize("blank", [" ", "   ", "\t"])
def test_blank_lines_translate_to_empty_lines(committed, blank):
    model, tokenizer = committed
    assert translate(model, tokenizer, [blank, GERMAN[0]]) == ["", translate(model, tokenizer, [GERMAN[0]])[0]]


def test_translation_runs_in_eval_mode_and_restores_the_mode(committed):
    model, tokenizer = committed  # dropout 0.3: a forward pass in training mode would differ
    expected = translate(model, tokenizer, GERMAN)
    model.train()
    try:
        assert translate(model, tokenizer, GERMAN) == expected
        assert model.training
    finally:
        model.eval()


@pytest.mark.parametrize("beam_size, batch_tokens", [(1, 4096), (1, 1), (3, 4096), (3, 1)])
def test_outputs_stop_at_source_length_plus_extra_len_and_at_max_len(tokenizer, beam_size, batch_tokens):
    model = tiny_model(tokenizer, max_len=24).eval()
    with torch.no_grad():  # never <eos> (nor <pad>, <bos>): every output runs to its limit
        model.output.bias[[PAD_ID, BOS_ID, EOS_ID]] = -1e4
    counting = CountingTokenizer(tokenizer)
    sentences = ["Ein Hund.", "Zwei Männer spielen Fußball.", GERMAN[3]]
    lengths = [len(tokenizer.encode(s).ids) for s in sentences]
    assert lengths[0] < lengths[1] < 18 < 24 < lengths[2]  # the last is longer than max_len
    parts = [split_encoding(tokenizer.encode(s), s, 24, 24 // 8) for s in sentences]  # the last in pieces
    assert [len(p) for p in parts[:2]] == [1, 1] and len(parts[2]) > 1 and sum(map(len, parts[2])) == lengths[2]
    for extra_len in (0, 3, 50):
        outputs = [json.loads(f"[{out.replace('] [', '], [')}]")  # a sentence's parts joined by a space
                   for out in translate(model, counting, sentences, beam_size, extra_len=extra_len,
                                        batch_tokens=batch_tokens)]
        generated = [[[i for i in part if i != PAD_ID] for part in out] for out in outputs]  # padded after their limit
        assert all(i > EOS_ID for out in generated for part in out for i in part)
        # each part: at most (its source length + extra_len) tokens, and at most max_len - 1 after <bos>
        assert [[len(part) for part in out] for out in generated] == [
            [min(len(part) + extra_len, 23) for part in rows] for rows in parts], extra_len


def test_a_line_of_sixty_sentences_is_translated_whole(committed):
    model, tokenizer = committed
    german = load_multi30k("test")[0]
    sentences = sorted((s for s in german if s.endswith(".") and ". " not in s), key=len)[:60]  # short: quick
    line = " ".join(sentences)
    assert len(tokenizer.encode(line).ids) > model.positional_encoding.max_len  # too long for the model
    alone = translate(model, tokenizer, sentences)  # the reference: each sentence on its own line
    whole = translate(model, tokenizer, ["", line])
    assert whole == ["", " ".join(alone)]  # every sentence, in order
    assert all(alone) and sum(text.count(".") for text in alone) >= 50  # sixty English sentences, none empty


def test_translate_refuses_a_bare_string_and_bad_sizes(committed):
    model, tokenizer = committed
    with pytest.raises(TypeError, match="sentences must be a sequence of str .*got str"):
        translate(model, tokenizer, "Ein Hund läuft.")
    with pytest.raises(TypeError, match="sentences must be a sequence of str .*type int at index 1"):
        translate(model, tokenizer, ["Ein Hund.", 3])
    with pytest.raises(ValueError, match=r"sentences\[1\] is not text: it holds the lone surrogate '\\udce4'"):
        translate(model, tokenizer, ["Ein Hund.", b"Gr\xe4n".decode("utf-8", "surrogateescape")])
    with pytest.raises(ValueError, match="beam_size must be a positive int, got 0"):
        translate(model, tokenizer, GERMAN, beam_size=0)
    with pytest.raises(ValueError, match="batch_tokens must be a positive int, got -1"):
        translate(model, tokenizer, GERMAN, batch_tokens=-1)
    with pytest.raises(ValueError, match="extra_len must be an int >= 0, got -1"):
        translate(model, tokenizer, GERMAN, extra_len=-1)


# --- training, saving, loading, averaging -----------------------------------------------------

def test_fit_translation_resumes_exactly_and_keeps_the_last_checkpoints(train_pairs, tokenizer, tmp_path):
    valid = load_multi30k("val")
    short, long_ = (TranslationConfig(**{**TINY, "dropout": 0.1, "steps": n, "keep_last": 2}) for n in (4, 6))
    fit_translation(short, train_pairs, tokenizer=tokenizer, progress=False,
                    callbacks=[TranslatorFolder(tmp_path / "a", short, every=2)])
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["checkpoint.pt", "step-000002.pt",
                                                                  "step-000004.pt"]
    folder = TranslatorFolder(tmp_path / "a", long_, every=4)
    assert folder.tokenizer.to_str() == tokenizer.to_str()  # the tokenizer comes from the checkpoint
    resumed, _, resumed_history = fit_translation(long_, train_pairs, tokenizer=folder.tokenizer, progress=False,
                                                  callbacks=[folder])
    lines: list[str] = []
    straight_config = dataclasses.replace(long_, eval_size=5, eval_every=3)
    straight, _, history = fit_translation(straight_config, train_pairs, valid, tokenizer=tokenizer, progress=False,
                                           log=lines.append)
    assert resumed_history["step"] == history["step"] == list(range(1, 7))
    assert resumed_history["loss"] == history["loss"] and resumed_history["lr"] == history["lr"]
    for (name, a), b in zip(straight.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(a, b), name
    # the first run saved at steps 2 and 4, the second at its end, 6: the last two are kept
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["checkpoint.pt", "step-000004.pt",
                                                                  "step-000006.pt"]
    assert torch.load(tmp_path / "a" / "checkpoint.pt", weights_only=True)["step"] == 6
    # validation every 3 steps, on the first eval_size pairs, and at the end
    assert history["valid_step"] == [3, 6] and len(lines) == 2 and lines[0].startswith("step 3: loss ")
    german, english = valid[0][:5], valid[1][:5]
    assert history["valid_bleu"][-1] == sacrebleu.corpus_bleu(translate(straight, tokenizer, german),
                                                              [english]).score


def test_fit_translation_with_bf16_runs_its_steps_under_autocast(train_pairs, tokenizer):
    losses = [fit_translation(TranslationConfig(**{**TINY, "steps": 2, "dropout": 0.0, "bf16": bf16}), train_pairs,
                              tokenizer=tokenizer, progress=False)[2]["loss"] for bf16 in (False, True)]
    assert losses[0] != losses[1] and losses[1] == pytest.approx(losses[0], rel=2e-2)


def test_average_of_checkpoints_is_the_mean_of_their_parameters(tokenizer, tmp_path):
    models = [tiny_model(tokenizer, seed=s) for s in range(3)]
    for s, model in enumerate(models):
        save_checkpoint(tmp_path / f"{s}.pt", model, None, None, step=s)
    states = [m.state_dict() for m in models]
    two = average_checkpoints([tmp_path / "0.pt", tmp_path / "1.pt"])
    three = average_checkpoints([str(tmp_path / f"{s}.pt") for s in range(3)])
    assert two.keys() == three.keys() == states[0].keys()
    for name in states[0]:
        torch.testing.assert_close(two[name], (states[0][name] + states[1][name]) / 2)
        torch.testing.assert_close(three[name], (states[0][name] + states[1][name] + states[2][name]) / 3)
    weight = "encoder.layers.0.feed_forward.w_1.weight"
    assert not torch.equal(two[weight], states[0][weight])  # different seeds: a mean that is neither model
    tiny_model(tokenizer).load_state_dict(three)  # loads into the model
    # float16 files are averaged in float32
    save_translator(tmp_path / "h.pt", models[0], tokenizer, TranslationConfig(**TINY), 1)
    half = average_checkpoints([tmp_path / "h.pt"])
    assert all(t.dtype == torch.float32 for t in half.values())
    name = "decoder.layers.0.feed_forward.w_2.weight"
    torch.testing.assert_close(half[name], states[0][name].half().float(), rtol=0, atol=0)


def test_average_refuses_other_parameters_and_no_paths(tokenizer, tmp_path):
    save_checkpoint(tmp_path / "a.pt", tiny_model(tokenizer), None, None, step=1)
    save_checkpoint(tmp_path / "wide.pt", tiny_model(tokenizer, d_ff=128), None, None, step=1)
    save_checkpoint(tmp_path / "numbers.pt", make_model(TrainConfig(d_model=32), source_vocab(), target_vocab()),
                    None, None, step=1)
    for other in ("wide.pt", "numbers.pt"):
        with pytest.raises(ValueError, match=f"{other} does not hold the same parameters as .*a.pt"):
            average_checkpoints([tmp_path / "a.pt", tmp_path / other])
    with pytest.raises(ValueError, match="paths must name at least one checkpoint"):
        average_checkpoints([])


def test_save_translator_then_load_translator_round_trip(tokenizer, tmp_path):
    config = TranslationConfig(**TINY)
    model = tiny_model(tokenizer)
    save_translator(tmp_path / "m.pt", model, tokenizer, config, step=7, note={"averaged_steps": [5, 7]})
    save_translator(tmp_path / "m32.pt", model, tokenizer, config, step=7, dtype=torch.float32)
    raw = torch.load(tmp_path / "m.pt", weights_only=True)  # plain types only: loads safely
    assert {t.dtype for t in raw["model"].values()} == {torch.float16}
    assert raw["step"] == 7 and raw["note"] == {"averaged_steps": [5, 7]} and raw["optimizer"] is None
    assert raw["tokenizer"] == tokenizer.to_str() and TranslationConfig(**raw["config"]) == config
    assert os.path.getsize(tmp_path / "m.pt") < 0.6 * os.path.getsize(tmp_path / "m32.pt")
    assert all(p.dtype == torch.float32 for p in model.parameters())  # the model itself is left alone

    loaded, loaded_tokenizer = load_translator(tmp_path / "m.pt")
    assert not loaded.training and all(p.dtype == torch.float32 for p in loaded.parameters())
    rounded = copy.deepcopy(model).half().float()
    for (name, a), b in zip(rounded.state_dict().items(), loaded.state_dict().values()):
        assert torch.equal(a, b), name
    assert loaded.output.weight is loaded.tgt_embed.weight is loaded.src_embed.weight  # one shared table
    assert loaded_tokenizer.to_str() == tokenizer.to_str()
    assert translate(loaded, loaded_tokenizer, GERMAN[:3]) == translate(rounded, tokenizer, GERMAN[:3])


def test_load_translator_refuses_what_is_not_a_translation_checkpoint(tmp_path):
    with pytest.raises(FileNotFoundError, match=f"no checkpoint at {tmp_path / 'missing.pt'}"):
        load_translator(tmp_path / "missing.pt")
    numbers = make_model(TrainConfig(), source_vocab(), target_vocab())
    save_checkpoint(tmp_path / "numbers.pt", numbers, None, None, step=1, config=TrainConfig(),
                    src_vocab=source_vocab(), tgt_vocab=target_vocab())
    with pytest.raises(ValueError, match="numbers.pt is the number words' checkpoint, not a translator's"):
        load_translator(tmp_path / "numbers.pt")
    for name, content in [("empty.pt", b""), ("random.pt", random.Random(0).randbytes(1000)),
                          ("zip.pt", b"PK\x03\x04 not a zip archive")]:
        (tmp_path / name).write_bytes(content)
        with pytest.raises(ValueError, match=f"{name} cannot be read as a torch checkpoint"):
            load_translator(tmp_path / name)
    torch.save(numbers.state_dict(), tmp_path / "plain.pt")
    with pytest.raises(ValueError, match="plain.pt is not a checkpoint of save_checkpoint"):
        load_translator(tmp_path / "plain.pt")


def test_load_translator_refuses_a_text_file(tmp_path):
    (tmp_path / "notes.pt").write_text("hello world\n")
    with pytest.raises(ValueError, match="notes.pt cannot be read as a torch checkpoint"):
        load_translator(tmp_path / "notes.pt")


def test_load_translator_names_a_configuration_it_cannot_build(tokenizer, tmp_path):
    save_translator(tmp_path / "m.pt", tiny_model(tokenizer), tokenizer, TranslationConfig(**TINY), step=1)
    raw = torch.load(tmp_path / "m.pt", weights_only=True)
    raw["config"]["beam_width"] = 4  # a field of another version
    torch.save(raw, tmp_path / "future.pt")
    with pytest.raises(ValueError, match="future.pt has a configuration this version cannot build: .*beam_width"):
        load_translator(tmp_path / "future.pt")


# --- the committed model ----------------------------------------------------------------------

def recorded_command():
    """The options of the recorded training command (the last line of train.log)."""
    command = [line for line in TRAIN_LOG.read_text().splitlines() if " -m transformer.train " in line][-1]
    argv = shlex.split(command)
    return argv[argv.index("transformer.train") + 1:]


def test_committed_model_is_a_safe_small_file_of_the_recorded_run():
    assert os.path.getsize(MODEL) <= 25_000_000
    raw = torch.load(MODEL, map_location="cpu", weights_only=True)
    assert {t.dtype for t in raw["model"].values()} == {torch.float16}
    args = build_multi30k_parser().parse_args(recorded_command())
    config = config_from_args(args, TranslationConfig())
    assert TranslationConfig(**raw["config"]) == config and raw["step"] == config.steps
    # the average of the last keep_last checkpoints, saved every save_every steps
    assert raw["note"]["averaged_steps"] == list(range(config.steps - (config.keep_last - 1) * args.save_every,
                                                       config.steps + 1, args.save_every))


def test_committed_model_reproduces_its_recorded_sample_bleu(committed):
    model, tokenizer = committed
    sample = json.loads(RESULTS.read_text())["sample"]
    german, english = (lines[:sample["sentences"]] for lines in load_multi30k("test"))
    assert sample["sentences"] == 100 and sample["decoding"] == "greedy"
    scores = corpus_scores(translate(model, tokenizer, german), english)
    assert scores["bleu"] == pytest.approx(sample["bleu"], abs=0.5)  # recorded on a GPU, here on the CPU
    assert scores["chrf"] == pytest.approx(sample["chrf"], abs=0.5)
    assert (scores["bleu_signature"], scores["chrf_signature"]) == (sample["bleu_signature"], sample["chrf_signature"])


def test_recorded_results_meet_the_bar():
    results = json.loads(RESULTS.read_text())
    assert results["averaged"]["test_beam"]["bleu"] >= 30  # the bar: test2016 BLEU of at least 30
    for model in ("last", "averaged"):
        assert set(results[model]) == {"valid_greedy", "valid_beam", "test_greedy", "test_beam"}
        for scores in results[model].values():
            assert scores["bleu_signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|")



def test_committed_test2016_translations_are_whole_and_scored_as_recorded():
    german, english = load_multi30k("test")
    record = json.loads((MODEL.parent / "test2016.json").read_text())
    assert set(record["decodings"]) == set(DECODINGS) and 0 < record["sample"] <= len(german)
    for decoding in DECODINGS:
        lines = read_outputs(MODEL.parent, decoding)
        assert len(lines) == len(german) and all(lines) and not any("\r" in line for line in lines)
        recorded = record["decodings"][decoding]
        assert corpus_scores(lines, english) == {name: recorded[name] for name in corpus_scores(lines, english)}


@pytest.mark.slow  # the committed translator over 100 test sentences, twice (about 6 s)
def test_committed_test2016_translations_are_the_models_line_for_line(committed):
    """Beyond the chapter's live sample (the first SAMPLE lines): every ninth sentence of the rest,
    100 spread over the file, translated greedy and with beam 4 (a few seconds) are the committed lines
    word for word; the committed files score as the GPU's record says."""
    model, tokenizer = committed
    german, english = load_multi30k("test")
    picked = range(SAMPLE + 4, len(german), 9)
    assert len(picked) == 100 and picked[-1] >= len(german) - 9
    results = json.loads(RESULTS.read_text())["averaged"]
    for decoding, beam in DECODINGS.items():
        lines = read_outputs(MODEL.parent, decoding)
        assert translate(model, tokenizer, [german[i] for i in picked], beam_size=beam) == [lines[i] for i in picked]
        recorded = results["test_greedy" if beam == 1 else "test_beam"]
        assert corpus_scores(lines, english)["bleu"] == pytest.approx(recorded["bleu"], abs=0.5)


@pytest.mark.slow  # the whole test set, twice per decoding (about a minute)
def test_packed_weights_translate_the_whole_test_set_as_plain_ones(committed):
    """The translate command multiplies by packed weights (pack_linear_layers): on every sentence of
    Multi30k's test set, greedy and with beam 4, the translations are the plain nn.Linear model's."""
    from transformer.generation.packed import PackedLinear, prepack

    model, tokenizer = committed
    packed = prepack(model)
    assert type(packed.output) is PackedLinear and type(model.output) is torch.nn.Linear
    german = load_multi30k("test")[0]
    for beam in DECODINGS.values():
        assert translate(packed, tokenizer, german, beam_size=beam) == translate(
            model, tokenizer, german, beam_size=beam
        ), f"beam {beam}"


def test_the_translate_command_packs_its_float32_model(committed, monkeypatch, capsys):
    """Without --int8, the command translates with its linear layers PackedLinear (where torch has
    oneDNN), and writes the plain model's translations."""
    import transformer.cli.translate as command

    model, tokenizer = committed
    real, used = command.translate_lines, []

    def spy(net, *args, **kwargs):  # the model the command translates with
        used.append(net)
        return real(net, *args, **kwargs)

    monkeypatch.setattr(command, "translate_lines", spy)
    lines = ["Ein Hund läuft über die Wiese.", "", "Zwei Kinder spielen am Strand."]
    monkeypatch.setattr(sys, "stdin", io.StringIO("\n".join(lines) + "\n"))
    assert main(["--checkpoint", str(MODEL), "--no-progress", "--device", "cpu"]) == 0
    assert capsys.readouterr().out == "".join(line + "\n" for line in translate(model, tokenizer, lines))
    kinds = {type(module).__name__ for module in used[0].modules()} & {"Linear", "PackedLinear"}
    assert kinds == ({"PackedLinear"} if torch.backends.mkldnn.is_available() else {"Linear"})


# --- the commands -----------------------------------------------------------------------------

@pytest.mark.slow  # a process
def test_translate_command_answers_every_line_in_place(committed):
    model, tokenizer = committed
    lines = ["Ein Hund läuft.", "", "Zwei Männer spielen Fußball."]
    done = subprocess.run([sys.executable, "-m", "transformer.translate", "--checkpoint", str(MODEL), "--no-progress",
                           "--device", "cpu"], input="\n".join(lines) + "\n", cwd=ROOT, env=_env(),
                          capture_output=True, text=True, encoding="utf-8", timeout=TIMEOUT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n") == [*translate(model, tokenizer, lines), ""]  # three lines, each ended
    out = done.stdout.splitlines()
    assert len(out) == 3 and out[1] == "" and out[0] and out[2] and done.stderr == ""


def test_translate_command_reads_crlf_lines_and_a_last_line_without_newline(committed, monkeypatch, capsys):
    model, tokenizer = committed
    monkeypatch.setattr(sys, "stdin", io.StringIO("Ein Hund läuft.\r\n\r\nKinder spielen."))
    assert main(["--checkpoint", str(MODEL), "--no-progress", "--device", "cpu", "--beam", "2"]) == 0
    expected = translate(model, tokenizer, ["Ein Hund läuft.", "", "Kinder spielen."], beam_size=2)
    assert capsys.readouterr().out == "".join(line + "\n" for line in expected)


def _stdin(data: bytes) -> io.TextIOWrapper:
    """A stdin as a process has it: text over bytes."""
    return io.TextIOWrapper(io.BytesIO(data), encoding="utf-8")


def test_translate_command_refuses_a_line_that_is_not_utf8_and_names_it(monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", _stdin("Ein Hund läuft.\nGrüne Wiese.\nKinder.\n".encode("utf-8")[:17]
                                             + "Grüne Wiese.\n".encode("latin-1") + b"Kinder.\n"))
    with pytest.raises(SystemExit) as stop:
        main(["--checkpoint", str(MODEL), "--no-progress", "--device", "cpu"])
    out, err = capsys.readouterr()
    assert stop.value.code == 2 and out == "" and "Traceback" not in err
    assert err.splitlines()[-1].endswith(
        "error: stdin, line 2: the bytes b'\\xfc' at byte 3 are not UTF-8: nothing was translated "
        "(--errors replace translates such lines)")


def test_translate_command_replaces_bad_bytes_on_request_and_loses_no_line(committed, monkeypatch, capsys):
    model, tokenizer = committed
    data = "Ein Hund läuft.\n".encode("utf-8") + "Ein Hund läuft.\n".encode("latin-1") + b"\xff\x00\x9c\n\nKinder.\n"
    monkeypatch.setattr(sys, "stdin", _stdin(data))
    assert main(["--checkpoint", str(MODEL), "--no-progress", "--device", "cpu", "--errors", "replace"]) == 0
    out, err = capsys.readouterr()
    lines = ["Ein Hund läuft.", "Ein Hund l\ufffduft.", "\ufffd\x00\ufffd", "", "Kinder."]
    assert lines == data.decode("utf-8", "replace").split("\n")[:5]  # the reference: Python's own replacement
    assert out == "".join(line + "\n" for line in translate(model, tokenizer, lines))  # five lines, in place
    assert err.splitlines() == ["stdin, line 2: the bytes b'\\xe4' at byte 11 are not UTF-8: replaced by U+FFFD",
                                "stdin, line 3: the bytes b'\\xff' at byte 1 are not UTF-8: replaced by U+FFFD"]


def test_translate_command_help_says_how_it_reads_and_cuts_lines(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    shown = " ".join(capsys.readouterr().out.split())
    assert "stdin (UTF-8)" in shown and "cut at sentence ends" in shown and "--errors {strict,replace}" in shown


@pytest.mark.slow  # the committed translator, four times
def test_translate_command_runs_on_the_free_cores_unless_told(committed, monkeypatch, capsys):
    import transformer.cli.translate as module

    threads = torch.get_num_threads()
    try:
        for options, free, expected in (([], 1, 1), ([], 2, 2), (["--threads", "1"], 2, 1), (["--threads", "2"], 1, 2)):
            monkeypatch.setattr(module, "free_cores", lambda free=free: free)
            monkeypatch.setattr(sys, "stdin", io.StringIO("Ein Hund läuft.\n"))
            assert main(["--checkpoint", str(MODEL), "--no-progress", "--device", "cpu", *options]) == 0
            assert torch.get_num_threads() == expected, options
            assert capsys.readouterr().out == translate(*committed, ["Ein Hund läuft."])[0] + "\n"
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("cores, load, free", [({0, 1}, 0.1, 2), ({0, 1}, 1.4, 1), ({0, 1}, 6.0, 1),
                                               (set(range(8)), 2.5, 6), (set(range(8)), 0.0, 8)])
def test_free_cores_are_the_cores_minus_the_load_average(monkeypatch, cores, load, free):
    from transformer.training.loop import free_cores

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: cores)
    monkeypatch.setattr(os, "getloadavg", lambda: (load, 0.0, 0.0))
    assert free_cores() == free


@pytest.mark.parametrize("limit, free", [("1", 1), ("3", 3), ("16", 6), ("", 6), ("0", 6), ("two", 6)])
def test_free_cores_take_no_more_than_omp_num_threads(monkeypatch, limit, free):
    """Two builds side by side (``make test``) each set OMP_NUM_THREADS=1; unset or not a count, no limit."""
    from transformer.training.loop import free_cores

    monkeypatch.setenv("OMP_NUM_THREADS", limit)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))
    monkeypatch.setattr(os, "getloadavg", lambda: (2.4, 0.0, 0.0))
    assert free_cores() == free


@pytest.mark.parametrize("options, message", [
    (["--checkpoint", "no/such/model.pt"], "--checkpoint no/such/model.pt: no checkpoint at no/such/model.pt"),
    (["--checkpoint", str(MODEL), "--extra-len", "-1"], "--extra-len must be >= 0, got -1"),
    (["--checkpoint", str(MODEL), "--length-penalty", "-0.5"], "--length-penalty must be a number >= 0 and finite, got -0.5"),
    (["--checkpoint", str(MODEL), "--beam", "0"], "argument --beam: expected a positive integer, got 0"),
    (["--checkpoint", str(MODEL), "--threads", "0"], "argument --threads: expected a positive integer, got 0"),
    (["--checkpoint", str(MODEL), "--batch-tokens", "x"], "argument --batch-tokens: expected a positive integer, got 'x'"),
    ([], "the following arguments are required: --checkpoint"),
])
def test_translate_command_usage_errors(options, message, capsys):
    with pytest.raises(SystemExit) as stop:
        main(options)
    assert stop.value.code == 2
    error = capsys.readouterr().err
    assert message in error and "Traceback" not in error


def test_translate_command_refuses_a_number_words_checkpoint(tmp_path, capsys):
    save_checkpoint(tmp_path / "numbers.pt", make_model(TrainConfig(), source_vocab(), target_vocab()), None, None, 1)
    with pytest.raises(SystemExit) as stop:
        main(["--checkpoint", str(tmp_path / "numbers.pt")])
    assert stop.value.code == 2 and "numbers.pt is a training state's (no model described) checkpoint, not a translator's" \
        in capsys.readouterr().err


TRAIN = ["--task", "multi30k", "--d-model", "32", "--num-heads", "2", "--num-layers", "1", "--d-ff", "64",
         "--eval-size", "0", "--save-every", "3", "--keep-last", "2", "--batch-tokens", "512", "--vocab-size", "500",
         "--warmup", "4", "--no-progress", "--device", "cpu"]


@pytest.mark.slow  # a process training a model
def test_train_command_saves_averages_and_resumes(tmp_path, monkeypatch, capsys):
    folder = tmp_path / "run"
    first = subprocess.run([sys.executable, "-m", "transformer.train", *TRAIN, "--steps", "6",
                            "--checkpoint-dir", str(folder)],
                           cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=TIMEOUT)
    assert first.returncode == 0, first.stderr
    assert sorted(p.name for p in folder.iterdir()) == ["averaged.pt", "checkpoint.pt", "step-000003.pt",
                                                         "step-000006.pt"]
    assert "validation BLEU, greedy, last model: " in first.stdout
    assert "validation BLEU, greedy, average of the last 2 checkpoints: " in first.stdout
    assert first.stdout.splitlines()[-1] == (f"checkpoints written to {folder}: checkpoint.pt (to resume), averaged.pt "
                                            "(to translate with)")
    checkpoint = torch.load(folder / "checkpoint.pt", weights_only=True)
    assert checkpoint["step"] == 6 and checkpoint["history"]["step"] == list(range(1, 7))
    config = TranslationConfig(**checkpoint["config"])
    assert (config.d_model, config.vocab_size, config.batch_tokens, config.keep_last) == (32, 500, 512, 2)
    # averaged.pt: the mean of the two step files, in float16
    steps = [torch.load(folder / f"step-00000{s}.pt", weights_only=True)["model"] for s in (3, 6)]
    averaged = torch.load(folder / "averaged.pt", weights_only=True)
    assert averaged["note"] == {"averaged_steps": [3, 6]} and averaged["tokenizer"] == checkpoint["tokenizer"]
    for name, value in averaged["model"].items():
        assert value.dtype == torch.float16
        torch.testing.assert_close(value, ((steps[0][name] + steps[1][name]) / 2).half(), rtol=0, atol=0, msg=name)
    model, tokenizer = load_translator(folder / "averaged.pt")
    assert tokenizer.get_vocab_size() == 500

    # On to step 8, in this process (the data is found from the book's root).
    monkeypatch.chdir(ROOT)
    with pytest.raises(SystemExit) as stop:  # the folder holds a run: continuing it takes --resume
        train_cli([*TRAIN, "--steps", "8", "--checkpoint-dir", str(folder)])
    assert stop.value.code == 2 and "pass --resume to continue it" in capsys.readouterr().err
    assert train_cli([*TRAIN, "--steps", "8", "--checkpoint-dir", str(folder), "--resume"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == f"resuming from {folder / 'checkpoint.pt'} at step 6 of 8"
    resumed = torch.load(folder / "checkpoint.pt", weights_only=True)
    assert resumed["step"] == 8 and resumed["history"]["step"] == list(range(1, 9))
    assert resumed["history"]["loss"][:6] == checkpoint["history"]["loss"]
    assert sorted(p.name for p in folder.glob("step-*.pt")) == ["step-000006.pt", "step-000008.pt"]
    assert torch.load(folder / "averaged.pt", weights_only=True)["note"] == {"averaged_steps": [6, 8]}
    capsys.readouterr()
    # Another width does not continue this run.
    with pytest.raises(SystemExit) as stop:
        train_cli([*TRAIN, "--steps", "10", "--d-model", "48", "--checkpoint-dir", str(folder), "--resume"])
    assert stop.value.code == 2
    assert "d_model=32 there, 48 here" in capsys.readouterr().err
    assert torch.load(folder / "checkpoint.pt", weights_only=True)["step"] == 8  # untouched


def test_train_command_help_of_the_translation_task(capsys):
    with pytest.raises(SystemExit) as stop:
        train_cli(["--task", "multi30k", "--help"])
    assert stop.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: python -m transformer.train --task multi30k")
    for option in ("--batch-tokens", "--vocab-size", "--keep-last", "--bf16", "--eval-size", "--checkpoint-dir"):
        assert option in out
    with pytest.raises(SystemExit):
        train_cli(["--help"])  # the number-words task has none of them
    out = capsys.readouterr().out
    assert "--task {numbers,multi30k,translation,classify}" in out and "--batch-tokens" not in out


def test_train_parser_defaults_are_the_translation_config():
    assert config_from_args(build_multi30k_parser().parse_args([]), TranslationConfig()) == TranslationConfig()
    args = build_multi30k_parser().parse_args(["--batch-tokens", "1000", "--vocab-size", "600", "--keep-last", "3",
                                            "--bf16", "--lr-factor", "2", "--eval-size", "0"])
    config = config_from_args(args, TranslationConfig())
    assert isinstance(config, TranslationConfig)
    assert (config.batch_tokens, config.vocab_size, config.keep_last, config.bf16, config.lr_factor,
            config.eval_size) == (1000, 600, 3, True, 2.0, 0)


@pytest.mark.parametrize("options, message", [
    (["--d-model", "30", "--num-heads", "4"], "d_model must be divisible by num_heads"),
    (["--save-every", "5"], "--save-every needs --checkpoint-dir"),
    (["--eval-size", "-1"], "eval_size must be a non-negative int, got -1"),
    (["--batch-tokens", "0"], "argument --batch-tokens: batch_tokens must be a positive int, got 0"),
    (["--dropout", "1.5"], r"dropout must be in [0, 1), got 1.5"),
])
def test_train_command_usage_errors(options, message, capsys):
    with pytest.raises(SystemExit) as stop:
        train_cli(["--task", "multi30k", "--device", "cpu", *options])
    assert stop.value.code == 2
    error = capsys.readouterr().err
    assert message in error and "Traceback" not in error


def test_train_command_refuses_cuda_without_a_gpu(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as stop:
        train_cli(["--task", "multi30k", "--device", "cuda"])
    assert stop.value.code == 2 and "--device cuda was asked for" in capsys.readouterr().err


def test_translation_config_checks_its_own_fields():
    for name in ("batch_tokens", "vocab_size", "keep_last"):
        with pytest.raises(ValueError, match=f"{name} must be a positive int, got 0"):
            TranslationConfig(**{name: 0})
    with pytest.raises(TypeError, match="bf16 must be a bool, got int"):
        TranslationConfig(bf16=1)
    with pytest.raises(ValueError, match="d_model must be a positive int"):
        TranslationConfig(d_model=0)  # and TrainConfig's


def test_translate_reads_any_iterable_of_sentences_once(committed):
    model, tokenizer = committed
    expected = translate(model, tokenizer, GERMAN)
    assert translate(model, tokenizer, (line for line in GERMAN)) == expected  # a generator, read once
    with pytest.raises(TypeError, match="sentences must be a sequence of str .*got an item of type int"):
        translate(model, tokenizer, [GERMAN[0], 3])


def test_translation_batches_refuse_no_pairs_and_a_negative_start(tokenizer):
    config = TranslationConfig(**TINY)
    with pytest.raises(ValueError, match="src_rows and tgt_rows must be non-empty"):
        next(translation_batches([], [], config))
    with pytest.raises(ValueError, match="start_step must be an int >= 0, got -1"):
        next(translation_batches([[5]], [[6]], config, start_step=-1))


def test_fit_translation_refuses_pairs_longer_than_max_len_before_training(tokenizer):
    config = dataclasses.replace(TranslationConfig(**TINY), max_len=4)
    with pytest.raises(ValueError, match="more than max_len=4"):
        fit_translation(config, (["Ein Mann fährt mit dem Fahrrad durch die Stadt."], ["A man rides."]),
                        tokenizer=tokenizer, progress=False)


@pytest.mark.slow  # two processes under torch.distributed
def test_train_command_runs_as_two_processes(tmp_path):
    """As under torchrun: each process takes its rows of every batch; process 0 alone writes and reports."""
    folder, meet = tmp_path / "run", f"file://{tmp_path / 'meet'}"
    argv = [sys.executable, "-m", "transformer.train", *TRAIN, "--steps", "4", "--checkpoint-dir", str(folder),
            "--init-method", meet]
    outputs = run_ranks([argv, argv], [_env(RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE="2") for r in range(2)],
                        ROOT, TIMEOUT)
    assert "validation BLEU" in outputs[0] and "validation BLEU" not in outputs[1]
    assert sorted(p.name for p in folder.iterdir()) == ["averaged.pt", "checkpoint.pt", "step-000003.pt",
                                                         "step-000004.pt"]
    assert torch.load(folder / "checkpoint.pt", weights_only=True)["step"] == 4


# --- lines as they are done, and Ctrl-C (issue 47) ----------------------------------------------

def test_translate_lines_gives_the_lines_of_translate_in_order():
    model, tokenizer = load_translator(MODEL)
    german = load_multi30k("val")[0][:24]
    sentences = [german[0], "", *german[1:12], "  ", " ".join(german[12:24])]  # blank lines, and one long line
    with torch.no_grad():
        whole = translate(model, tokenizer, sentences, batch_tokens=256)
        one_by_one = list(translate_lines(model, tokenizer, sentences, batch_tokens=256))
    assert one_by_one == whole and len(whole) == len(sentences) and whole[1] == "" and whole[-2] == ""


@pytest.mark.slow  # a process translating until a Ctrl-C
def test_ctrl_c_stops_translate_with_130_and_one_line_and_keeps_every_line_written(tmp_path):
    (tmp_path / "de.txt").write_text("\n".join(load_multi30k("val")[0][:300]) + "\n", encoding="utf-8")
    with open(tmp_path / "de.txt", "rb") as german:
        process = subprocess.Popen([sys.executable, "-m", "transformer", "translate", "--checkpoint", str(MODEL),
                                    "--no-progress", "--batch-tokens", "256", "--device", "cpu"],
                                   stdin=german, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                   env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"},
                                       preexec_fn=interruptible)
    first = process.stdout.readline()  # a line comes out as soon as it is translated
    process.send_signal(signal.SIGINT)
    rest, err = process.communicate(timeout=120)
    written = [first.rstrip("\n"), *rest.splitlines()]
    assert process.returncode == 130, err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert f"interrupted (Ctrl-C): the first {len(written)} of 300 lines were translated and written" in err
    assert 1 <= len(written) < 300 and all(written)


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "-1"])
def test_translate_refuses_a_length_penalty_that_is_not_a_finite_number_at_least_0(value, capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO("Ein Hund.\n"))
    with pytest.raises(SystemExit) as stop:
        main(["--checkpoint", str(MODEL), "--beam", "2", f"--length-penalty={value}"])
    assert stop.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].endswith(
        f"error: --length-penalty must be a number >= 0 and finite, got {float(value)}")


def test_beam_search_refuses_an_infinite_length_penalty():
    model, tokenizer = load_translator(MODEL)
    with pytest.raises(ValueError, match="length_penalty must be a number >= 0 and finite, got inf"):
        translate(model, tokenizer, ["Ein Hund."], beam_size=2, length_penalty=math.inf)
