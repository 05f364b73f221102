"""tools/format_chapters.py: chapter code within 88 columns, the code itself unchanged."""

import re
from pathlib import Path

import pytest

from tools import format_chapters as fc

ROOT = Path(__file__).resolve().parent.parent
HEADER = "---\njupytext:\n  text_representation:\n    format_name: myst\nkernelspec:\n  name: python3\n---\n\n# T\n\n"


def _chapter(tmp_path: Path, *cells: str) -> Path:
    path = tmp_path / "t.md"
    path.write_text(HEADER + "\n\nText.\n\n".join(cells) + "\n\nThe end.\n")
    return path


def _cell(source: str, options: str = "") -> str:
    return f"```{{code-cell}} ipython3\n{options}{source}\n```"


def test_every_chapter_reads_back_as_written():
    for path in sorted((ROOT / "chapters").glob("*.md")):
        assert fc.Chapter.parse(path.read_text()).text() == path.read_text(), path.name


def test_code_is_wrapped_options_kept_and_a_second_run_changes_nothing(tmp_path):
    long_call = "result = some_function(" + ", ".join(f"argument_{i}" for i in range(12)) + ")"
    options = "---\ntags: [hide-input]\nmystnb:\n  figure:\n    caption: A figure.\n---\n"
    path = _chapter(tmp_path, _cell("def some_function(*a):\n    return a\n" + long_call, options))
    assert fc.main([str(path)]) == 0
    text = path.read_text()
    assert options in text and all(len(line) <= fc.LINE_LENGTH for line in text.splitlines())
    assert fc.main(["--check", str(path)]) == 0  # idempotent


def test_a_long_trailing_comment_moves_above_and_long_comments_wrap(tmp_path):
    source = ("# export: transformer/a_module_with_a_long_name/" + "x" * 60 + ".py\n"
              "y = 1  # " + "a shape comment " * 6 + "\n"
              "z = 2  # type: ignore[assignment]  " + "p" * 70 + "\n"
              "# Solution to exercise 1. " + "words " * 30)
    out = fc.format_sources([source])[0].split("\n")
    assert out[0].startswith("# export: ")  # never touched, however long
    assert out[1].startswith("# a shape comment") and "y = 1" in out
    moved = " ".join(line.removeprefix("# ") for line in out[1:out.index("y = 1")])
    assert moved == ("a shape comment " * 6).strip()  # the comment, wrapped, then the code
    assert any(line.startswith("z = 2  # type: ignore") for line in out)  # a pragma stays on its line
    solution = [line for line in out if line.startswith("# Solution") or line.startswith("# words")]
    assert solution[0].startswith("# Solution to exercise 1. words") and len(solution) >= 2
    assert all(len(line) <= fc.LINE_LENGTH for line in out[1:] if "type: ignore" not in line)


def test_long_docstrings_are_rewrapped_by_words(tmp_path):
    source = 'def f():\n    """' + "Return the thing " * 8 + '.\n\n    Args:\n        x: ' + "an argument " * 9 + '\n    """\n'
    out = fc.format_sources([source])[0]
    assert fc.same_code(source, out) and all(len(line) <= fc.LINE_LENGTH for line in out.splitlines())
    assert "\n    Args:\n        x: an argument" in out


def test_a_change_of_the_code_is_refused():
    assert fc.same_code("x = (1 +\n 2)  # c", "x = 1 + 2")
    assert not fc.same_code("x = 1 + 2", "x = 2 + 1")
    assert not fc.same_code("s = 'a  b'", "s = 'a b'")  # only docstrings are compared by their words


def test_magics_and_unparsable_cells_are_left_and_listed(tmp_path, capsys):
    magic = "%timeit " + "x" * 100
    path = _chapter(tmp_path, _cell(magic), _cell("def broken(:\n    " + "y" * 100))
    before = path.read_text()
    assert fc.main([str(path)]) == 0
    assert path.read_text() == before
    assert "left as written" in capsys.readouterr().out


def test_plumbing_moves_into_remove_input_cells_and_checks_stay(tmp_path):
    path = _chapter(
        tmp_path,
        _cell('warnings.filterwarnings("ignore")\nx = 2\nglue("x", x, display=False)\nassert x == 2'),
        # glue after a bare expression: moving it would put the expression's value on the page
        _cell('z = 1\nz\nglue("y", 3, display=False)'),
        _cell('# Solution to exercise 1.\nassert 1 == 1', ":tags: [hide-cell]\n\n"),
    )
    assert fc.main(["--tag-plumbing", "--label-solutions", str(path)]) == 0
    text = path.read_text()
    assert text.count(":tags: [remove-input]") == 2
    assert '\nx = 2\nassert x == 2\n```' in text  # the check stays visible, after the moved filter
    assert text.index('warnings.filterwarnings') < text.index("x = 2") < text.index('glue("x"')
    assert 'z = 1\nz\nglue("y", 3, display=False)\n```' in text
    assert "tags: [hide-cell]\nmystnb:\n  code_prompt_show: Solution\n" in text
    assert fc.main(["--check", "--tag-plumbing", "--label-solutions", str(path)]) == 0


def test_bad_arguments_exit_2(tmp_path):
    with pytest.raises(SystemExit) as stop:
        fc.main([str(tmp_path / "missing.md")])
    assert stop.value.code == 2


def test_a_glue_call_that_also_assigns_a_name_is_not_moved(tmp_path):
    # glue("x", y := 2, ...) defines y: an assert after it reads y, so moving the call past the
    # assert would break the cell (chapters/detection.md had one).
    path = _chapter(tmp_path, _cell('glue("x", y := 2, display=False)\nassert y == 2'))
    assert fc.main(["--tag-plumbing", str(path)]) == 0
    text = path.read_text()
    assert ":tags: [remove-input]" not in text
    assert 'glue("x", y := 2, display=False)\nassert y == 2\n```' in text


def test_glue_within_a_cell_moves_when_nothing_after_it_changes_what_it_reads(tmp_path):
    path = _chapter(
        tmp_path,
        _cell('x = 2\nglue("x", x + 1, display=False)\ny = len([x])\nprint(y)\nassert y == 1'),
        # x changes after the call (in place or rebound): the call stays where it is
        _cell('x = [2]\nglue("x", len(x), display=False)\nx.append(3)\nprint(x)'),
        _cell('z = 2\nglue("z", z, display=False)\nz = 3\nprint(z)'),
        # a clock read when the call runs: it stays
        _cell('t = 0\nglue("t", time.perf_counter() - t, display=False)\nu = 1\nprint(t)'),
        # a loop of glue() calls moves; the name it binds is bound anew before anything reads it
        _cell('d = {"a": 1}\nfor k, v in d.items():\n    glue(k, v, display=False)\nfor k in d:\n    print(k)'),
        # a loop of checks is a check, and stays on the page
        _cell('for q in range(2):\n    assert q < 2\nprint(1)'),
    )
    assert fc.main(["--tag-plumbing", str(path)]) == 0
    text = path.read_text()
    assert 'x = 2\ny = len([x])\nprint(y)\nassert y == 1\n```' in text
    assert text.index("assert y == 1") < text.index('glue("x", x + 1')
    assert 'glue("x", len(x), display=False)\nx.append(3)' in text
    assert 'glue("z", z, display=False)\nz = 3' in text
    assert 'glue("t", time.perf_counter() - t, display=False)\nu = 1' in text
    assert 'd = {"a": 1}\nfor k in d:\n    print(k)\n```' in text
    assert 'for q in range(2):\n    assert q < 2\nprint(1)\n```' in text
    assert text.count(":tags: [remove-input]") == 2
    assert fc.main(["--check", "--tag-plumbing", str(path)]) == 0


def test_folded_code_is_labelled_by_what_it_holds(tmp_path):
    figure = "---\ntags: [hide-input]\nmystnb:\n  figure:\n    caption: A figure.\n---\n"
    path = _chapter(
        tmp_path,
        _cell("import math\nimport torch", ":tags: [export, hide-input]\n\n"),
        _cell("import math\n_ = math.pi", ":tags: [hide-input]\n\n"),
        _cell("x = 1", figure),
        _cell("LIMIT = 3\ndef check(x):\n    return x\nclass A:\n    pass", ":tags: [hide-input]\n\n"),
        _cell("print(1)", ":tags: [hide-input]\n\n"),
        _cell("print(2)"),  # shown: no label
    )
    assert fc.main(["--label-code", str(path)]) == 0
    labels = re.findall(r'code_prompt_show: "(.*)"', path.read_text())
    assert labels == ["Imports", "Imports and set-up", "Code of the figure", "Code: check, A, LIMIT", "Code"]
    assert "tags: [export, hide-input]\nmystnb:\n" in path.read_text()
    assert fc.main(["--check", "--label-code", str(path)]) == 0


def _value(source: str) -> object:
    """What ``source``'s last line evaluates to, the statements before it run."""
    namespace: dict = {"x": 12.5, "name": "a name"}
    *body, last = source.strip().split("\n")
    exec("\n".join(body), namespace)  # noqa: S102 - the test's own literals
    return eval(last, namespace)  # noqa: S307


def test_long_strings_are_cut_at_spaces_and_say_the_same():
    words = " ".join(f"word{i}" for i in range(30))
    cases = [
        f'y = print(f"{{x:>10.2f}} {words} {{{{braces}}}} {{name!r}} {words}")',  # fields, {{ }}
        f'y = "{words} {words}"',  # outside brackets: the pieces get parentheses
        f'y = len(r"\\d+ {words} \\s")',  # raw
        f'y = ("{"x" * 100}")',  # no space: it stays long
    ]
    for source in cases:
        out = fc.format_sources([source])[0]
        assert fc.same_code(source, out), out
        long = [line for line in out.splitlines() if len(line) > fc.LINE_LENGTH]
        assert len(long) == (1 if "x" * 100 in source else 0), out
    # the cut string reads the same when run: Python is the reference
    string = f'f"{{x:>10.2f}} {words} {{{{braces}}}} {{name!r}} {words}"'
    cut = fc.split_long_strings(f"y = ({string})")
    assert cut.count("\n") >= 1 and _value(f"y = ({string})\ny") == _value(cut + "\ny")


def test_an_f_string_piece_without_a_field_is_a_plain_string():
    source = 'print(f"' + "text " * 20 + '{x}")'
    out = fc.split_long_strings(source)
    first, second = out.split("\n")
    assert first.lstrip().startswith('print("text') and second.lstrip().startswith('f"text')
    assert fc.same_code(source, out)


def test_short_tails_join_the_next_piece():
    source = 'raise ValueError(\n    f"{x} is " "bad, "\n    "very "\n    "bad"\n)'
    out = fc.join_short_pieces('raise ValueError(\n    "very "\n    "bad"\n)')
    assert out == 'raise ValueError(\n    "very bad"\n)'
    braces = 'print(\n    f"{x} "\n    "{not a field}"\n)'
    assert fc.join_short_pieces(braces) == braces  # an f would read the plain piece's braces
    assert fc.same_code(source, fc.format_sources([source])[0])


def test_docstrings_with_examples_wrap_their_prose_and_keep_the_examples():
    example = "        >>> f(1, " + ", ".join(["2"] * 40) + ")"
    source = ('def f(*a):\n    """' + "Return the thing " * 8 + '.\n\n    Args:\n        a: '
              + "an argument " * 9 + '\n        b: short.\n\n    Example:\n' + example + '\n        1\n    """\n')
    out = fc.format_sources([source])[0]
    assert fc.same_code(source, out) and example in out.split("\n")
    assert all(len(line) <= fc.LINE_LENGTH for line in out.splitlines() if ">>>" not in line)
    lines = out.split("\n")
    entry = next(i for i, line in enumerate(lines) if line.startswith("        a: an argument"))
    # an entry's words go on one step deeper, and the next entry stays an entry
    assert lines[entry + 1].startswith("            argument") and "        b: short." in lines
