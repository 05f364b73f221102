"""The data-parallel measurement (benchmarks/data_parallel.py) and what chapter "Scaling out" says of it:
the file is complete and consistent, the chapter glues the recorded figures rather than typed ones, and
the benchmark writes what the chapter reads."""

import json
import re
import statistics
from pathlib import Path

import pytest

import benchmarks.data_parallel as data_parallel
from tools.chapters import read_chapter

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "data_parallel_results.json"
CHAPTER = ROOT / "chapters" / "scaling_out.md"
SETTINGS = ["1x1", "2x1", "1x2"]


def test_the_recorded_measurement_is_complete_and_consistent():
    recorded = json.loads(RESULTS.read_text())
    assert recorded["command"].startswith("python -m benchmarks.data_parallel")
    assert recorded["machine"] and recorded["cores"] >= 2 and recorded["torch"] and recorded["date"]
    assert len(recorded["load_average_before"]) == len(recorded["load_average_after"]) == 3
    assert "load average" in recorded["uptime_before"]
    assert recorded["settings"] == SETTINGS
    assert recorded["model"]["parameters"] > 1_000_000  # a step with real arithmetic in it
    assert len(recorded["runs"]) == recorded["repeats"] * len(SETTINGS) >= len(SETTINGS)
    for setting in SETTINGS:
        processes, threads = map(int, setting.split("x"))
        runs = [r for r in recorded["runs"] if (r["processes"], r["threads"]) == (processes, threads)]
        assert len(runs) == recorded["repeats"]
        for run in runs:
            assert len(run["step_seconds"]) == recorded["steps"]
            assert run["seconds_per_step"] == statistics.median(run["step_seconds"])
            assert 0 < run["cpu_seconds_per_step"] and 0 < run["seconds_per_step"]
        assert recorded["best_seconds_per_step"][setting] == min(r["seconds_per_step"] for r in runs)
        assert recorded["best_cpu_seconds_per_step"][setting] == min(r["cpu_seconds_per_step"] for r in runs)
    wall = recorded["best_seconds_per_step"]
    assert recorded["speedup_two_processes"] == pytest.approx(wall["1x1"] / wall["2x1"])
    assert recorded["speedup_two_threads"] == pytest.approx(wall["1x1"] / wall["1x2"])
    # one setting, the same steps at every repeat: its process 0 ends on the same loss
    for setting in SETTINGS:
        losses = {r["last_loss"] for r in recorded["runs"] if f"{r['processes']}x{r['threads']}" == setting}
        assert max(losses) - min(losses) < 1e-5 * max(losses), setting


def test_the_chapter_glues_the_recorded_figures():
    text = CHAPTER.read_text()
    section = text[text.index("(scaling-out-speed)="):text.index("```{admonition} Beyond the paper")]
    prose = "\n".join(part for i, part in enumerate(section.split("```")) if i % 2 == 0)
    assert not re.search(r"\d+\.\d+ ?(s|x)\b", prose), "a typed timing or ratio in the section's prose"
    cells = read_chapter(CHAPTER).cells
    (first,) = [i for i, c in enumerate(cells) if "data_parallel_results.json" in c.source]
    glued: dict = {}
    names = {"json": json, "book_root": lambda: ROOT,
             "glue": lambda name, value, display=True: glued.__setitem__(name, value)}
    for cell in cells[first:first + 2]:  # the measurement read and checked, then glued
        exec(cell.source, names)  # noqa: S102 (the chapter's own cells)
    for name in glued:
        assert f"{{glue:text}}`{name}" in section, f"{name} is glued but not quoted"
    recorded = json.loads(RESULTS.read_text())
    assert glued["dp_speedup"] == recorded["speedup_two_processes"]
    assert glued["dp_one_s"] == recorded["best_seconds_per_step"]["1x1"]
    assert glued["dp_two_s"] == recorded["best_seconds_per_step"]["2x1"]
    cpu = recorded["best_cpu_seconds_per_step"]
    assert glued["dp_work_ratio"] == cpu["1x1"] / cpu["2x1"]
    assert glued["dp_load"] == recorded["load_average_before"][0]
    fastest = min((r for r in recorded["runs"] if (r["processes"], r["threads"]) == (2, 1)),
                  key=lambda r: r["seconds_per_step"])
    assert glued["dp_two_cores"] == 2 * fastest["cpu_seconds_per_step"] / fastest["seconds_per_step"]
    assert recorded["machine"] in glued["dp_machine"] and f"{recorded['cores']}-core" in glued["dp_machine"]


def test_the_benchmark_writes_what_the_chapter_reads(tmp_path, monkeypatch):
    """``main`` with the runs faked: the file it writes has the fields the chapter and the tests read."""
    fake = iter([1.0, 0.6, 3.0, 0.9, 0.7, 2.0])

    def run_child(processes, threads, sizes):
        assert "--batch-size=128" in sizes and "--d-model=256" in sizes
        wall = next(fake)
        return {"processes": processes, "threads": threads, "seconds_per_step": wall,
                "cpu_seconds_per_step": wall / 2, "step_seconds": [wall] * 6, "parameters": 3_000_000,
                "last_loss": 4.2}

    monkeypatch.setattr(data_parallel, "run_child", run_child)
    out = tmp_path / "dp.json"
    assert data_parallel.main(["--repeats", "2", "--out", str(out)]) == 0
    written = json.loads(out.read_text())
    assert written["command"] == f"python -m benchmarks.data_parallel --repeats 2 --out {out}"
    assert written["best_seconds_per_step"] == {"1x1": 0.9, "2x1": 0.6, "1x2": 2.0}
    assert written["speedup_two_processes"] == pytest.approx(1.5)
    assert [(r["processes"], r["threads"]) for r in written["runs"]] == [(1, 1), (2, 1), (1, 2)] * 2
    assert written["model"]["parameters"] == 3_000_000 and written["settings"] == SETTINGS
