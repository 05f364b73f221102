"""Tests for benchmarks/spam_over_time.py (chapters/classify_command.md, "Mail from later"): the split by date is
one, the control has its sizes, and the committed results file is reproduced."""

import json
from datetime import datetime, timezone
from pathlib import Path

import pytest

from benchmarks.spam_over_time import (CLASSES, RECIPE, dated_emails, mail_date, measure, split_at_random,
                                     split_by_date)
from transformer.tasks.email import Email, read_emails, split_emails

pytestmark = pytest.mark.usefixtures("one_thread")
ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "spam_over_time_results.json"


def mail(date_header, label=0, number=1):
    name = f"{number:05d}.{number:032x}.txt"
    return Email("easy-ham-1", name, label, "text", f"From: a@b\nDate: {date_header}\nSubject: x")


@pytest.fixture(scope="module")
def recorded():
    return json.loads(RESULTS.read_text())


@pytest.fixture(scope="module")
def mails():
    return read_emails()


def test_dates_are_read_in_utc_and_the_undated_and_absurd_are_dropped():
    assert mail_date(mail("Tue, 03 Sep 2002 10:00:00 +0200")) == datetime(2002, 9, 3, 8, tzinfo=timezone.utc)
    assert mail_date(mail("Tue, 03 Sep 2002 10:00:00 -0000")) == datetime(2002, 9, 3, 10, tzinfo=timezone.utc)
    assert mail_date(mail("2002/09/14 Sat 02:29:32 CDT")) is None
    assert mail_date(Email("spam-1", "00001.0.txt", 1, "x", "From: a@b")) is None
    dated, dropped = dated_emails([mail("Tue, 03 Sep 2002 10:00:00 +0000"), mail("Mon, 3 Sep 0102 10:00:00 +0000"),
                                   mail("not a date")])
    assert len(dated) == 1 and dropped == {"no date": 1, "year outside 2001-2003": 1}


@pytest.mark.slow  # reads every email of the corpus (14 s on the busy 2-core machine)
def test_each_class_is_split_by_its_own_dates_and_the_control_has_the_same_sizes(mails):
    splits = split_emails(mails)
    dated, _ = dated_emails([m for part in splits.values() for m in part])
    by_date = split_by_date(dated, 0.2)
    sizes = {label: sum(m.label == label for _, m in by_date["test"]) for label in CLASSES}
    controls = [split_at_random(dated, sizes, seed) for seed in (0, 1)]
    for label in CLASSES:
        train = [date for date, m in by_date["train"] if m.label == label]
        test = [date for date, m in by_date["test"] if m.label == label]
        assert len(test) == round(0.2 * (len(train) + len(test))) > 50
        assert min(test) >= max(train)  # every later email dated no earlier than every training email
        for control in controls:
            assert sum(m.label == label for _, m in control["test"]) == len(test)
            assert sum(m.label == label for _, m in control["train"]) == len(train)
    assert {id(m) for _, m in controls[0]["test"]} != {id(m) for _, m in controls[1]["test"]}
    names = lambda rows: sorted((m.folder, m.name) for _, m in rows)  # noqa: E731
    assert names(by_date["train"] + by_date["test"]) == names(dated)  # each dated email once


def test_the_recorded_sizes_agree_between_the_split_by_date_and_every_control(recorded):
    by_date = recorded["splits"]["by date"]
    controls = [split for name, split in recorded["splits"].items() if name.startswith("random")]
    assert len(controls) == len({run["seed"] for run in recorded["runs"] if run["split"] == "random"}) >= 3
    for split in controls:
        for cls in CLASSES.values():
            assert {p: split[cls][p]["emails"] for p in split[cls]} == {p: by_date[cls][p]["emails"] for p in split[cls]}
    for cls in CLASSES.values():
        assert by_date[cls]["test"]["first"] >= by_date[cls]["train"]["last"]
    emails = sum(by_date[cls][p]["emails"] for cls in CLASSES.values() for p in ("train", "test"))
    assert emails == recorded["emails"]["dated"] == recorded["emails"]["kept"] - sum(recorded["dropped"].values())


@pytest.mark.slow  # splits the corpus and fits two bags of words (16 s), after reading it
def test_the_bag_of_words_figures_are_reproduced(mails, recorded):
    again = measure(mails, [0], ["bag of words"], recorded["later"])
    assert again["splits"]["by date"] == recorded["splits"]["by date"]
    assert again["splits"]["random, seed 0"] == recorded["splits"]["random, seed 0"]
    for key in ("emails", "dropped", "date_check"):
        assert again[key] == recorded[key], key
    wanted = [run for run in recorded["runs"] if run["model"] == "bag of words" and run["seed"] in (None, 0)]
    assert len(again["runs"]) == len(wanted) == 2
    for run, record in zip(again["runs"], wanted):
        # the same emails; the fit's last bits may differ on another CPU's kernels, so one email
        # on the edge may change sides: at most one error more or fewer of each kind
        assert {k: run[k] for k in ("model", "split", "seed", "emails", "spam")} == \
            {k: record[k] for k in ("model", "split", "seed", "emails", "spam")}
        assert abs(run["ham_false_positives"] - record["ham_false_positives"]) <= 1, (run, record)
        assert abs(run["spam_missed"] - record["spam_missed"]) <= 1, (run, record)
        assert abs(run["accuracy"] - record["accuracy"]) <= 1 / run["emails"] + 1e-12, (run, record)


def test_the_recipe_is_the_committed_classifiers_command_less_its_data():
    command = json.loads((ROOT / "models" / "spam-classifier" / "results.json").read_text())["command"]
    assert f" {' '.join(RECIPE)} " in f" {command} "


def test_the_recipe_was_trained_on_the_split_by_date_and_on_random_controls_of_its_sizes(recorded):
    recipe = [run for run in recorded["runs"] if run["model"] == "committed recipe"]
    later = [run for run in recipe if run["split"] == "by date"]
    controls = [run for run in recipe if run["split"] == "random"]
    bow_later = next(run for run in recorded["runs"] if run["model"] == "bag of words" and run["split"] == "by date")
    assert len(later) == 1 and len(controls) >= 3 and len({run["seed"] for run in controls}) == len(controls)
    for run in recipe:  # each test set is the later mail's size, or a random one of the same sizes
        assert (run["emails"], run["spam"]) == (bow_later["emails"], bow_later["spam"])
        errors = run["spam_missed"] + run["ham_false_positives"]
        assert run["accuracy"] == pytest.approx(1 - errors / run["emails"], abs=1e-12)
        assert run["spam_recall"] == pytest.approx(1 - run["spam_missed"] / run["spam"], abs=1e-12)
        assert run["accuracy_interval"][0] <= run["accuracy"] <= run["accuracy_interval"][1]
