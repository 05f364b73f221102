"""`make lint`'s size advice (tools/sizes.py): the modules over 300 lines and the chapters over 900,
listed and never failing."""

from tools import sizes


def write(path, lines: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("x = 1\n" * lines)


def test_long_modules_and_chapters_are_listed_and_init_is_not(tmp_path):
    write(tmp_path / "transformer" / "nn" / "long.py", 301)
    write(tmp_path / "transformer" / "nn" / "short.py", 300)
    write(tmp_path / "transformer" / "nn" / "__init__.py", 500)  # re-exports only: no size
    write(tmp_path / "chapters" / "long.md", 901)
    write(tmp_path / "chapters" / "short.md", 900)
    found = sizes.oversized(tmp_path)
    assert found == [("transformer/nn/long.py", 301, 300), ("chapters/long.md", 901, 900)]
    assert sizes.advice(found) == [
        "sizes: transformer/nn/long.py has 301 lines, more than 300 (split it into modules of one idea each; "
        "advice, not an error)",
        "sizes: chapters/long.md has 901 lines, more than 900 (split it, or cut repetition; advice, not an error)"]


def test_nothing_to_say_is_one_line_and_the_command_never_fails(capsys):
    assert sizes.advice([]) == ["sizes: every module within 300 lines, every chapter within 900"]
    assert sizes.main() == 0
    assert capsys.readouterr().out.startswith("sizes: ")
