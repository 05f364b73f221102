"""seed_spread: a glued number's spread over the recorded robustness runs, as chapters quote it."""

import json

import pytest

from transformer.paths import seed_spread


def test_seed_spread_reads_one_chapters_number_over_its_runs(tmp_path, monkeypatch):
    (tmp_path / "_toc.yml").write_text("root: intro\n")
    (tmp_path / "benchmarks").mkdir()
    runs = [{"chapter": "vision", "seed": s, "path": p, "glued": {"acc": v, "other": -v}, "errors": []}
            for (s, p), v in zip([(0, "native"), (0, "default"), (1, "native"), (1, "default")], [0.9, 0.7, 0.8, 0.95])]
    runs.append({"chapter": "drawing", "seed": 0, "path": "native", "glued": {"acc": 0.1}, "errors": []})
    runs.append({"chapter": "vision", "seed": 2, "path": "native", "glued": {}, "errors": ["a failing cell"]})
    (tmp_path / "benchmarks" / "robustness_results.json").write_text(json.dumps(runs))
    monkeypatch.chdir(tmp_path / "benchmarks")  # anywhere inside the book
    assert seed_spread("vision", "acc") == pytest.approx({"min": 0.7, "median": 0.85, "max": 0.95, "runs": 4})
    assert seed_spread("drawing", "acc")["runs"] == 1
    with pytest.raises(ValueError, match="no run of chapter 'vision' with a number 'missing'"):
        seed_spread("vision", "missing")


def test_seed_spread_of_the_books_own_table():
    assert seed_spread("training_run", "test_exact_match")["min"] >= 0.98  # the claim of chapter 14
