"""`make busy-check` (tools/busy_check.py): the book's per-cell limit, and busy processes that are
stopped however the chapters' run ends."""

import subprocess
import textwrap

import pytest

from tools import busy_check

CHAPTER = textwrap.dedent("""\
    ---
    jupytext:
      text_representation:
        extension: .md
        format_name: myst
    kernelspec:
      display_name: Python 3
      language: python
      name: python3
    ---

    # A chapter that fails

    ```{code-cell} ipython3
    assert 1 + 1 == 3
    ```
    """)


def test_the_limit_is_the_books():
    assert busy_check.cell_timeout() == 900  # _config.yml's execute.timeout


@pytest.mark.slow
def test_a_failing_chapter_fails_the_check_and_the_busy_processes_stop(tmp_path, monkeypatch, capsys):
    started = []
    popen = subprocess.Popen

    def recording(*args, **kwargs):
        started.append(popen(*args, **kwargs))
        return started[-1]

    monkeypatch.setattr(subprocess, "Popen", recording)
    chapter = tmp_path / "99_fails.md"
    chapter.write_text(CHAPTER)
    assert busy_check.main(["--busy", "2", "--out", str(tmp_path / "out"), str(chapter)]) == 1
    busy = [p for p in started if busy_check.BUSY_LOOP in p.args]
    assert len(busy) == 2 and all(p.returncode is not None for p in busy)
    out = capsys.readouterr().out
    assert "99_fails: FAILED" in out and "busy-check: FAILED: 99_fails" in out
