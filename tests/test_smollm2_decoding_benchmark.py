"""The SmolLM2 decoding benchmark (benchmarks/smollm2_decoding.py) and what chapter "From the paper's
decoder to today's" says of it: the committed results have the shape the chapter reads, and the chapter
glues the recorded figures, not typed ones."""

import json
import re
from pathlib import Path

import pytest
from chapter_cells import with_plumbing

from benchmarks.smollm2_decoding import TARGETS, measure
from tools.chapters import read_chapter

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "smollm2_decoding_results.json"
CHAPTER = ROOT / "chapters" / "modern_decoder.md"
ENGINES = {"ours", "ours unpacked", "Hugging Face", "CTranslate2 float32"}


def test_the_recorded_measurement_is_complete():
    recorded = json.loads(RESULTS.read_text())
    assert recorded["command"].startswith("nice python -m benchmarks.smollm2_decoding")
    assert "cores" in recorded["machine"] and "ctranslate2" in recorded["machine"] and recorded["date"]
    assert (recorded["prompt_tokens"], recorded["new_tokens"]) == (32, 128)
    rows = {(row["threads"], row["batch"]): row for row in recorded["results"]}
    assert set(rows) == {(1, 1), (1, 8), (2, 1), (2, 8)}
    for (_, batch), row in rows.items():
        assert set(row["tokens_per_second"]) == ENGINES and min(row["tokens_per_second"].values()) > 0
        assert row["rows_identical_to_ours"]["Hugging Face"] == batch  # asserted by the script as it ran
        assert set(row["rows_identical_to_ours"]) == ENGINES - {"ours"}
    assert recorded["targets"] == [{"ours": o, "reference": r, "least_ratio": t} for (o, r), t in TARGETS.items()]
    met = sum(row["tokens_per_second"][t["ours"]] / row["tokens_per_second"][t["reference"]] >= t["least_ratio"]
              for row in recorded["results"] for t in recorded["targets"])
    assert (recorded["targets_met"], recorded["targets_tried"]) == (met, 4 * len(TARGETS))
    assert recorded["profile"] and all({"op", "calls", "self_ms", "share"} <= op.keys() for op in recorded["profile"])
    per_token = recorded["per_token"]
    assert per_token["floor_ms_per_token"] == pytest.approx(per_token["weight_mb"] / per_token["products_gb_per_s"])
    assert set(per_token["engines"]) == ENGINES
    for name, row in per_token["engines"].items():
        if name != "CTranslate2 float32":  # torch.profiler does not see inside CTranslate2
            assert row["products_ms"] + row["rest_ms"] == pytest.approx(row["total_ms"])
            assert 0 < row["products_ms"] < row["total_ms"] and row["operators"] > 0


def test_the_chapter_glues_the_recorded_figures():
    text = CHAPTER.read_text()
    section = text[text.index("## At engine speed"):text.index("## A command: `transformer generate`")]
    prose = re.sub(r"```.*?```", "", section, flags=re.S)
    assert not re.search(r"\b\d+\.\d\d\b", prose), "a typed ratio in the section's prose"
    cells = read_chapter(CHAPTER).cells
    (index,) = [i for i, c in enumerate(cells)
                if c.cell_type == "code" and "json.loads" in c.source and "smollm2_decoding_results.json" in c.source]
    glued = {}
    names = {"glue": lambda name, value, display=True: glued.__setitem__(name, value)}
    for cell in with_plumbing(cells, index):  # the cell, then the glue calls moved after it
        exec(cell.source, names)  # noqa: S102 (the chapter's own cells)
    recorded = json.loads(RESULTS.read_text())
    for row in recorded["results"]:
        speed, key = row["tokens_per_second"], f"{row['threads']}t_b{row['batch']}"
        assert glued[f"smollm2_vs_hf_{key}"] == speed["ours"] / speed["Hugging Face"]
        assert glued[f"smollm2_vs_ct2_{key}"] == speed["ours"] / speed["CTranslate2 float32"]
        assert f"{{glue:text}}`smollm2_vs_hf_{key}" in prose and f"{{glue:text}}`smollm2_vs_ct2_{key}" in prose
    assert glued["smollm2_targets_met"] == f"{recorded['targets_met']} of {recorded['targets_tried']}"
    engines = recorded["per_token"]["engines"]
    assert glued["smollm2_floor_ms"] == recorded["per_token"]["floor_ms_per_token"]
    assert glued["smollm2_ct2_total_ms"] == engines["CTranslate2 float32"]["total_ms"]
    for short, name in (("ours", "ours"), ("plain", "ours unpacked"), ("hf", "Hugging Face")):
        for field in ("total_ms", "products_ms", "rest_ms", "operators"):
            assert glued[f"smollm2_{short}_{field}"] == engines[name][field]
            assert f"{{glue:text}}`smollm2_{short}_{field}" in prose
    assert recorded["machine"].startswith(glued["smollm2_bench_machine"])


def test_measure_keeps_each_engines_best_time_and_rotates_the_order():
    calls = []

    def engine(name):
        def run(prompt):
            calls.append(name)
            return [[0]]
        return run

    speed, outputs = measure({"a": engine("a"), "b": engine("b")}, prompt=None, repeats=2, tokens=10)
    assert calls == ["a", "b", "b", "a"] and outputs == {"a": [[0]], "b": [[0]]}
    assert set(speed) == {"a", "b"} and all(value > 0 for value in speed.values())
