"""benchmarks/robustness.py: the claims it reruns exist in the chapters, and its table judges them."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from benchmarks.robustness import CLAIMS, Claim, chapter_path, table
from tools.chapters import read_chapter

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("name", sorted({claim.chapter for claim in CLAIMS}))
def test_each_chapter_has_one_seed_cell_and_uses_the_seed(name):
    nb = read_chapter(chapter_path(name))
    params = [cell for cell in nb.cells if "parameters" in cell.metadata.get("tags", [])]
    assert len(params) == 1, f"chapter {name}: {len(params)} cells tagged 'parameters'"
    # the seed cell: comment lines, then SEED = 0 (the robustness runs replace the whole cell)
    assert re.match(r"(\s*#.*\n)*SEED = 0\b", params[0].source), params[0].source
    code = [line for line in params[0].source.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    assert len(code) == 1, f"chapter {name}: the robustness runs replace the parameters cell by SEED = k alone"
    later = "\n".join(cell.source for cell in nb.cells[nb.cells.index(params[0]) + 1:] if cell.cell_type == "code")
    assert re.search(r"\bSEED\b", later), f"chapter {name} never uses SEED after setting it"


@pytest.mark.parametrize("claim", CLAIMS, ids=lambda claim: f"{claim.chapter}-{claim.name}-{claim.op}")
def test_every_claim_is_glued_by_its_chapter(claim):
    source = chapter_path(claim.chapter).read_text()
    assert re.search(rf'glue\(\s*"{claim.name}"', source), f"chapter {claim.chapter} glues no {claim.name!r}"


def _run(chapter, seed, path, glued, errors=()):
    return {"chapter": chapter, "seed": seed, "path": path, "glued": glued, "errors": list(errors), "seconds": 1.0}


def test_table_reports_min_median_max_and_the_worst_run():
    claim = Claim("12", "test_exact_match", ">=", 0.98, "exact match")
    runs = [_run("12", seed, path, {"test_exact_match": value})
            for seed, path, value in [(0, "native", 0.99), (1, "native", 0.995), (0, "default", 0.985)]]
    text, ok = table(runs, [claim])
    row = next(line for line in text.splitlines() if "exact match" in line)
    assert ok
    assert "| 0.985 | 0.99 | 0.995 | 3/3 | seed 0, default |" in row  # min, median, max; worst is the min


def test_table_fails_on_a_missed_threshold_a_failing_cell_or_a_missing_number():
    claim = Claim("17", "lm_valid_rise", "<", 0.01, "rise")
    missed = [_run("17", 0, "native", {"lm_valid_rise": -0.01}), _run("17", 1, "default", {"lm_valid_rise": 0.02})]
    text, ok = table(missed, [claim])
    assert not ok and "seed 1, default **MISSED**" in text  # for "<", the worst run is the largest
    text, ok = table([_run("17", 0, "native", {"lm_valid_rise": -0.01}, ["cell 3: AssertionError"])], [claim])
    assert not ok and "cell 3: AssertionError" in text
    text, ok = table([_run("17", 0, "native", {})], [claim])
    assert not ok and "never glued" in text


def test_make_test_runs_nbval_on_the_plain_kernels():
    dry = subprocess.run(["make", "-n", "nbval"], cwd=ROOT, capture_output=True, text=True)
    assert "ATEN_CPU_CAPABILITY=default" in next(line for line in dry.stdout.splitlines() if "--nbval-lax" in line)
