"""tools/chapter_times.py: each chapter's time, summed from pytest's --durations lines, for the preface."""

import json

from tools.chapter_times import chapter_seconds, main
from tools.chapters import reading_order
from tools.chapter_times import ROOT


def test_durations_are_summed_per_chapter_over_every_phase():
    log = "\n".join([
        "============================= slowest durations =============================",
        "12.50s call     _build/nbval/translation.ipynb::Cell 31",
        "0.25s setup    _build/nbval/translation.ipynb::Cell 0",
        "3.00s call     _build/nbval/attention.ipynb::Cell 2",
        "1.00s call     _build/nbval/attention.ipynb::Cell 10",
        "(1043 durations < 0.005s hidden.  Use -vv to show these durations.)",
        "2.00s call     tests/test_model.py::test_shapes",  # not a chapter's cell
    ])
    assert chapter_seconds(log) == {"translation": 12.75, "attention": 4.0}


def test_the_command_refuses_a_log_without_every_chapter(tmp_path, capsys):
    log = tmp_path / "nbval.log"
    log.write_text("3.00s call     _build/nbval/attention.ipynb::Cell 2\n")
    assert main([str(log), "--out", str(tmp_path / "times.json")]) == 2
    assert "has no durations for" in capsys.readouterr().err and not (tmp_path / "times.json").exists()
    assert main([str(tmp_path / "missing.log")]) == 2


def test_the_command_writes_every_chapter_in_reading_order(tmp_path):
    chapters = [name.removeprefix("chapters/").removesuffix(".md") for name in reading_order(ROOT)]
    log = tmp_path / "nbval.log"
    log.write_text("".join(f"{i + 1}.5s call  _build/nbval/{name}.ipynb::Cell 1\n" for i, name in enumerate(chapters)))
    assert main([str(log), "--out", str(tmp_path / "times.json"), "--command", "make test"]) == 0
    record = json.loads((tmp_path / "times.json").read_text())
    assert list(record["seconds"]) == chapters and record["seconds"][chapters[0]] == 1.5
    assert record["command"] == "make test" and "cores" in record["machine"]


def test_the_committed_times_name_every_chapter_of_the_book():
    record = json.loads((ROOT / "benchmarks" / "chapter_times.json").read_text())
    chapters = [name.removeprefix("chapters/").removesuffix(".md") for name in reading_order(ROOT)]
    assert list(record["seconds"]) == chapters, "benchmarks/chapter_times.json is stale: run tools/chapter_times.py"
    assert all(seconds > 0 for seconds in record["seconds"].values()) and record["command"]
