"""The threads measurement (benchmarks/threads.py) and what chapter "Long runs" says of it: the chapter
glues the recorded figures, not typed ones, and the figures support its sentence (one thread beats
two beside a busy process)."""

import json
import os
import re
from pathlib import Path
from unittest import mock

import benchmarks.threads as threads
from chapter_cells import with_plumbing
from tools.chapters import read_chapter
from transformer.training.loop import free_cores

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "threads_results.json"
CHAPTER = ROOT / "chapters" / "long_runs.md"


def test_the_recorded_measurement_is_complete_and_supports_the_chapter():
    recorded = json.loads(RESULTS.read_text())
    assert recorded["command"].startswith("python -m benchmarks.threads")
    assert recorded["machine"] and recorded["cores"] >= 2 and recorded["torch"] and recorded["date"]
    assert len(recorded["load_average_before"]) == 3 and "load average" in recorded["uptime_before"]
    assert (recorded["model"], recorded["sentences"], recorded["beam"], recorded["busy_processes"]) == (
        "models/multi30k/model.pt", 50, 4, 1)
    assert recorded["same_translations"]  # the thread count changes the time, not the translations
    for n in (1, 2):
        times = [run["seconds"] for run in recorded["runs"] if run["threads"] == n]
        assert len(times) == recorded["repeats"] >= 1
        assert recorded["best_seconds"][str(n)] == min(times)
    assert recorded["best_seconds"]["1"] < recorded["best_seconds"]["2"]  # "and ... s with one": faster


def test_the_chapter_glues_the_recorded_figures():
    text = CHAPTER.read_text()
    section = text[text.index("### Threads on a shared machine"):text.index("### Text that is not UTF-8")]
    for name in ("threads_two_s", "threads_one_s", "threads_machine"):
        assert f"{{glue:text}}`{name}" in section
    prose = "\n".join(line for line in section.split("```")[0].splitlines())  # the text before the cell
    assert not re.search(r"\d+\.\d+ s\b", prose), "a typed timing in the section's prose"
    cells = read_chapter(CHAPTER).cells
    (index,) = [i for i, c in enumerate(cells) if "threads_results.json" in c.source]
    glued = {}
    names = {"json": json, "os": os, "mock": mock, "free_cores": free_cores, "book_root": lambda: ROOT,
             "glue": lambda name, value, display=True: glued.__setitem__(name, value)}
    for cell in with_plumbing(cells, index):  # the cell, then the glue calls moved after it
        exec(cell.source, names)  # noqa: S102 (the chapter's own cells)
    recorded = json.loads(RESULTS.read_text())
    assert glued["threads_two_s"] == recorded["best_seconds"]["2"]
    assert glued["threads_one_s"] == recorded["best_seconds"]["1"]
    assert recorded["machine"] in glued["threads_machine"] and f"{recorded['cores']}-core" in glued["threads_machine"]


def test_the_benchmark_writes_what_the_chapter_reads(tmp_path, monkeypatch):
    """``main`` with the timings faked: the file it writes has the fields the chapter and the test above read."""
    fake = iter([3.0, 1.0, 2.5, 1.2])
    monkeypatch.setattr(threads, "run_child", lambda n, sentences, beam: {
        "threads": n, "seconds": next(fake), "english": ["A dog runs."]})
    monkeypatch.setattr(threads.time, "sleep", lambda seconds: None)
    monkeypatch.setattr(threads, "busy_process", mock.MagicMock())  # no busy process in a unit test
    out = tmp_path / "threads.json"
    assert threads.main(["--repeats", "2", "--out", str(out)]) == 0
    written = json.loads(out.read_text())
    assert written["best_seconds"] == {"2": 2.5, "1": 1.0} and written["same_translations"]
    assert written["command"] == f"python -m benchmarks.threads --repeats 2 --out {out}"
    assert [run["threads"] for run in written["runs"]] == [2, 1, 2, 1]  # alternating
    assert "english" not in written["runs"][0]


def test_cpu_name_reads_proc_cpuinfo(monkeypatch):
    from benchmarks import machine

    monkeypatch.setattr(machine.Path, "read_text", lambda self: "processor\t: 0\nmodel name\t: Some CPU @ 2.0GHz\n")
    assert machine.cpu_name() == "Some CPU @ 2.0GHz"
