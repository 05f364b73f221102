"""Format the chapters' code cells so that a page can show them: lines of at most 88 columns.

At 1280 px the book's code column fits about 88 characters; a longer line scrolls sideways. This
command rewrites the source of every ```{code-cell} block of ``chapters/*.md`` and leaves the rest of
the file, the cells' options (``:tags:`` lines or a ``---`` block) included, as it is:

1. ``ruff format`` with a line length of 88 (``RUFF_FORMAT``: the chapters' own settings, not the
   package's 120 columns of pyproject.toml, which this command does not read);
2. a trailing comment that makes its line too long moves onto its own line above the code (not a
   ``# type:``, ``# noqa`` or ``# fmt:`` pragma, which must stay where it is);
3. a comment line longer than 88 columns is wrapped, keeping its indentation and its ``# `` or ``#: ``
   prefix; the ``# export: ...`` line that starts an exported cell is never touched;
4. a docstring line longer than 88 columns is re-wrapped by words (doctest examples and literal
   blocks keep their lines);
5. a one-line string literal that makes its line too long is cut at a space into two adjacent
   literals, which Python joins back into one (in parentheses of their own outside brackets); a short
   tail joins the next piece when the two fit on one line.

Steps 1-5 repeat until the cell no longer changes, so a second run changes nothing. A cell with
IPython magics (``%``, ``!``) or that does not parse is left as it is and listed. Formatting never
changes what a cell does: the cell's syntax tree after formatting (comments are not in it;
docstrings compared by their words) must equal the original's, or the command refuses to write the
chapter and exits 1. A literal without a space (a hash) stays long; the report gives the share of
code lines over 88 columns per chapter, before and after.

``--tag-plumbing`` also takes build plumbing off the page without hiding any check: a leading run of
warning filters (``warnings.filterwarnings(...)``) moves into a cell of its own tagged
``remove-input`` before the cell, and the quiet ``glue(..., display=False)`` calls (and loops of
nothing but them) into one after it. A call moves when it would glue the same value there: when it
is followed by nothing but other such calls, ``assert`` statements and ``print``/``assert_close``
calls, or when it reads no clock and no later statement of the cell can change what it reads (none
assigns it, calls a method that may change it, or passes it to a function that might; see
``_movable_glue``). A call that cannot move stays on the page (the test of the conventions lists
it), to be split by hand. A cell that holds nothing else is tagged instead. ``--label-solutions`` gives each hidden solution cell the toggle label
"Solution" (the label of the solutions in words, the dropdown admonitions). ``--label-code`` gives
each folded code cell (``hide-input``) a toggle label that says what it holds (``code_label``:
"Imports", "Code of the figure", ...), where MyST-NB would write "Show code cell source" on each.

Usage: python -m tools.format_chapters [--check] [--tag-plumbing] [--label-solutions] [--label-code] [CHAPTER.md ...]
Exit status: 0 done (or, with --check, nothing to change), 1 a chapter would change (--check) or a
cell's syntax tree would change (refused), 2 bad arguments.
"""

from __future__ import annotations

import argparse
import ast
import io
import re
import subprocess
import sys
import tempfile
import tokenize
from dataclasses import dataclass, field
from pathlib import Path

from tools.chapters import chapter_paths

#: The column limit: what the book's code column shows at 1280 px.
LINE_LENGTH = 88
#: ruff's formatter with the chapters' settings (--isolated: pyproject.toml's 120 columns are the package's).
RUFF_FORMAT = [sys.executable, "-m", "ruff", "format", "--isolated", "--line-length", str(LINE_LENGTH),
               "--target-version", "py310", "--quiet"]
FENCE = re.compile(r"^(`{3,})\{code-cell\}")
#: Trailing comments that must stay on their line: they speak to a tool about that line.
PRAGMA = re.compile(r"#\s*(type:|noqa|fmt:|pragma|pyright:|mypy:)")
PLUMBING_TAG = "remove-input"
#: Statements that may follow a moved glue() call: they read values, and change none.
READ_ONLY_CALLS = {"print", "torch.testing.assert_close", "assert_close"}
#: The hidden solution cells' toggle, in both states: the title of the dropdown solutions (whose
#: "Click to show" hint _config.yml turns off), so that every solution reads the same.
SOLUTION_PROMPT = {"code_prompt_show": "Solution", "code_prompt_hide": "Solution"}


class Refused(Exception):
    """Formatting would change a cell's syntax tree; the message names the chapter and the cell."""


@dataclass
class Cell:
    """A code cell of a chapter: its option lines as written, and its source."""

    options: list[str]
    source: str
    fence: str
    line: int  # 1-based line of the ```{code-cell} line in the original file


@dataclass
class Chapter:
    """A chapter as alternating text (a list of lines) and code cells."""

    parts: list  # str (a run of lines, joined) or Cell
    skipped: list[str] = field(default_factory=list)

    @classmethod
    def parse(cls, text: str) -> Chapter:
        lines = text.split("\n")
        parts: list = []
        prose: list[str] = []
        i = 0
        while i < len(lines):
            match = FENCE.match(lines[i])
            if not match:
                prose.append(lines[i])
                i += 1
                continue
            prose.append(lines[i])
            parts.append("\n".join(prose))
            prose = []
            start, fence = i, match.group(1)
            i += 1
            options: list[str] = []
            if i < len(lines) and lines[i] == "---":
                end = lines.index("---", i + 1)
                options, i = lines[i:end + 1], end + 1
            elif i < len(lines) and lines[i].startswith(":"):
                while i < len(lines) and lines[i].startswith(":"):
                    options.append(lines[i])
                    i += 1
                if i < len(lines) and lines[i] == "":
                    options.append("")
                    i += 1
            end = lines.index(fence, i)
            parts.append(Cell(options, "\n".join(lines[i:end]), fence, start + 1))
            prose, i = [lines[end]], end + 1
        parts.append("\n".join(prose))
        return cls(parts)

    def text(self) -> str:
        out = []
        for part in self.parts:
            if isinstance(part, Cell):
                out.append("\n".join(part.options + ([part.source] if part.source else [])))
            else:
                out.append(part)
        return "\n".join(out)

    @property
    def cells(self) -> list[Cell]:
        return [part for part in self.parts if isinstance(part, Cell)]


def wide_lines(source: str) -> tuple[int, int]:
    """(code lines, lines over LINE_LENGTH columns) of a cell's source."""
    lines = source.splitlines()
    return len(lines), sum(len(line) > LINE_LENGTH for line in lines)


def has_magic(source: str) -> bool:
    return any(line.lstrip().startswith(("%", "!")) for line in source.splitlines())


def parses(source: str) -> bool:
    try:
        ast.parse(source)
    except SyntaxError:
        return False
    return True


def ruff_format(sources: list[str]) -> list[str | None]:
    """Each source formatted by ruff (None where ruff fails), in one ruff process for all of them."""
    with tempfile.TemporaryDirectory() as tmp:
        paths = [Path(tmp) / f"cell_{i}.py" for i in range(len(sources))]
        for path, source in zip(paths, sources):
            path.write_text(source + "\n")
        if paths:
            subprocess.run(RUFF_FORMAT + [str(p) for p in paths], capture_output=True, text=True)
        out: list[str | None] = []
        for path, source in zip(paths, sources):
            formatted = path.read_text().rstrip("\n")
            out.append(formatted if parses(formatted) else None)
        return out


def _string_rows(source: str) -> set[int]:
    """Rows (1-based) that continue a string begun on an earlier row: a comment cannot go above them."""
    rows: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.STRING and tok.end[0] > tok.start[0]:
            rows.update(range(tok.start[0] + 1, tok.end[0] + 1))
    return rows


def _comment_prefix(comment: str) -> str | None:
    """The prefix a wrapped comment keeps ("# " or "#: "), or None for a comment not to wrap."""
    for prefix in ("#: ", "# "):
        if comment.startswith(prefix):
            return prefix
    return None


#: Comment lines that start an item of their own: nothing is joined onto them.
ITEM = re.compile(r"^(- |\* |\d+[.)] |[A-Za-z_][\w.]*: |[(\[].*(->|@))")


def _cut(line: str) -> int:
    """The last space at or before LINE_LENGTH that is not inside an inline literal (````x y````
    or ```x y```), or -1."""
    cut = line.rfind(" ", 0, LINE_LENGTH + 1)
    while cut > 0 and (line[:cut].count("``") % 2 or line[:cut].replace("``", "").count("`") % 2):
        cut = line.rfind(" ", 0, cut)
    return cut


def move_trailing_comments(source: str) -> str:
    """Put a trailing comment that makes its line longer than LINE_LENGTH on its own line above."""
    lines = source.split("\n")
    inside_string = _string_rows(source)
    comments = [tok for tok in tokenize.generate_tokens(io.StringIO(source).readline)
                if tok.type == tokenize.COMMENT]
    for tok in reversed(comments):  # from the bottom, so that earlier rows keep their numbers
        row, col = tok.start
        line, comment = lines[row - 1], tok.string
        code = line[:col]
        if len(line) <= LINE_LENGTH or not code.strip() or PRAGMA.match(comment) or row in inside_string \
                or (row > 1 and lines[row - 2].endswith("\\")):
            continue
        if _comment_prefix(comment) is None:
            comment = "# " + comment[1:].lstrip()
        lines[row - 1:row] = [_indent(line) + comment, code.rstrip()]
    return "\n".join(lines)


def wrap_comment_lines(source: str) -> str:
    """Wrap the comment lines longer than LINE_LENGTH: the words past the limit start the next line
    of the same comment (or a line of their own), keeping the indentation and the prefix."""
    lines = source.split("\n")
    alone = {tok.start[0] - 1 for tok in tokenize.generate_tokens(io.StringIO(source).readline)
             if tok.type == tokenize.COMMENT and not tok.line[:tok.start[1]].strip()}
    flags = [i in alone for i in range(len(lines))]
    i = 0
    while i < len(lines):
        line = lines[i]
        comment, indent = line.lstrip(), _indent(line)
        prefix = _comment_prefix(comment) if flags[i] else None
        if (len(line) <= LINE_LENGTH or prefix is None or (i == 0 and comment.startswith("# export:"))):
            i += 1
            continue
        cut = _cut(line)
        if cut <= len(indent) + len(prefix):
            i += 1
            continue
        head, rest = line[:cut].rstrip(), line[cut + 1:].strip()
        following = lines[i + 1] if i + 1 < len(lines) else ""
        body = following.lstrip()[len(prefix):]
        if (i + 1 < len(lines) and flags[i + 1] and _indent(following) == indent
                and following.lstrip().startswith(prefix) and body.strip() and not ITEM.match(body)):
            lines[i + 1] = f"{indent}{prefix}{rest} {body.strip()}"
        else:
            lines.insert(i + 1, f"{indent}{prefix}{rest}")
            flags.insert(i + 1, True)
        lines[i] = head
        i += 1
    return "\n".join(lines)


def fix_comments(source: str) -> str:
    """Move trailing comments that make a line too long above it, and wrap long comment lines."""
    return wrap_comment_lines(move_trailing_comments(source))



def _docstrings(tree: ast.AST) -> list[ast.Constant]:
    """The docstrings of a module and of its functions and classes."""
    found = []
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and body
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            found.append(body[0].value)
    return found


#: Docstring lines that no other line may be joined onto: doctests, list items, headings, entries.
NOT_PROSE = re.compile(r"^\s*(>>>|\.\.\.|[-*+] |\d+\. |[A-Z][a-z]+:$|\*{0,2}\w+( \([^)]*\))?: )")


#: The first line of an entry of an ``Args:`` or ``Attributes:`` section: a name, a colon, words.
ENTRY = re.compile(r"^\s*\*{0,2}\w+( \([^)]*\))?: \S")


def _indent(line: str) -> str:
    return line[: len(line) - len(line.lstrip())]


def _frozen_rows(block: list[str]) -> set[int]:
    """Rows of a docstring that must keep their line breaks: doctest examples (from a ``>>>`` line to
    the next blank line, their expected output included) and literal blocks (the lines indented
    deeper than a line that ends with ``::``)."""
    frozen: set[int] = set()
    example, literal_indent = False, None
    for i, line in enumerate(block):
        stripped = line.strip()
        if literal_indent is not None:
            if not stripped or len(_indent(line)) > literal_indent:
                frozen.add(i)
                continue
            literal_indent = None
        if stripped.startswith(">>>"):
            example = True
        elif not stripped:
            example = False
        if example:
            frozen.add(i)
        if stripped.endswith("::"):
            literal_indent = len(_indent(line))
    return frozen


def wrap_docstrings(source: str) -> str:
    """Re-wrap the docstring lines longer than LINE_LENGTH: the words past the limit start the next
    line of the same paragraph (or a line of their own). Doctest examples and literal blocks
    (``::``) keep their lines (``_frozen_rows``); the prose around them is wrapped."""
    lines = source.split("\n")
    for doc in sorted(_docstrings(ast.parse(source)), key=lambda d: -d.lineno):
        first, last = doc.lineno - 1, (doc.end_lineno or doc.lineno) - 1
        block = lines[first:last + 1]
        if all(len(line) <= LINE_LENGTH for line in block) or any(line.endswith("\\") for line in block):
            continue
        frozen = [i in _frozen_rows(block) for i in range(len(block))]
        # the body's own indentation: an entry of a section is indented deeper
        base = min((len(_indent(line)) for line in block[1:] if line.strip()), default=0)
        i = 0
        while i < len(block):
            line, indent = block[i], _indent(block[i])
            cut = _cut(line)
            if len(line) <= LINE_LENGTH or frozen[i] or (i > 0 and NOT_PROSE.match(line) and ": " not in line) \
                    or cut <= len(indent) + 4:
                i += 1
                continue
            head, rest = line[:cut].rstrip(), line[cut + 1:].strip()
            following = block[i + 1] if i + 1 < len(block) else ""
            deeper = following.strip() and len(_indent(following)) > len(indent)
            # an entry's words go on indented one step deeper ("    x: the input ..." then "        more")
            entry = i > 0 and len(indent) > base and ENTRY.match(line)
            continuation = (_indent(following) if deeper else indent + "    ") if entry else indent
            if (following.strip() and _indent(following) == continuation and not NOT_PROSE.match(following)
                    and not frozen[i + 1] and following.strip()[:3] not in ('"""', "'''")):
                block[i + 1] = f"{continuation}{rest} {following.strip()}"
            else:
                block.insert(i + 1, f"{continuation}{rest}")
                frozen.insert(i + 1, False)
            block[i] = head
            i += 1
        lines[first:last + 1] = block
    return "\n".join(lines)


class _Docstrings(ast.NodeTransformer):
    """Docstrings compared by their words: ruff normalises their indentation, and wrap_docstrings
    moves their line breaks."""

    def _clean(self, node):
        self.generic_visit(node)
        body = getattr(node, "body", None)
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                and isinstance(body[0].value.value, str):
            body[0].value.value = " ".join(body[0].value.value.split())
        return node

    visit_Module = visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _clean


def same_code(before: str, after: str) -> bool:
    """Whether two sources have the same syntax tree (comments aside, docstrings normalised)."""
    def tree(source: str) -> str:
        return ast.dump(_Docstrings().visit(ast.parse(source)))
    return tree(before) == tree(after)


#: A one-line string literal: its prefix (``f``, ``r``, ``b``, ...) and its quote.
STRING_START = re.compile(r"^([rRbBfFuU]{0,2})(['\"])")


def _string_cut(literal: str, room: int) -> int | None:
    """Where to cut a one-line string literal so that its first piece, closed by its quote, is at
    most ``room`` characters: just after the last space that fits, outside an f-string's ``{...}``
    and not escaped; None when there is none (or the literal is triple-quoted)."""
    prefix, quote = STRING_START.match(literal).groups()  # type: ignore[union-attr]
    if literal[len(prefix):len(prefix) + 3] == quote * 3:
        return None
    formatted, depth, cut, i = "f" in prefix.lower(), 0, None, len(prefix) + 1
    while i < len(literal) - 1 and i + 1 < room:  # i + 1: the piece keeps the space, then its quote
        char = literal[i]
        if char == "\\":
            i += 2
            continue
        if formatted and char in "{}":
            if depth == 0 and literal[i + 1:i + 2] == char:  # {{ or }}: a brace, not a field
                i += 2
                continue
            depth += 1 if char == "{" else -1
        elif char == " " and depth == 0 and literal[len(prefix) + 1:i].strip():
            cut = i + 1
        i += 1
    return cut if cut is not None and literal[cut:-1] else None


def _piece(prefix: str, quote: str, body: str) -> str:
    """A string literal of ``body``: an f-string piece without a field loses its ``f``."""
    if "{" not in body and "}" not in body:
        prefix = prefix.replace("f", "").replace("F", "")
    return f"{prefix}{quote}{body}{quote}"


def split_long_strings(source: str) -> str:
    """Cut each one-line string literal that makes its line longer than LINE_LENGTH into two,
    at a space, the second on the next line: Python joins adjacent literals into one, so the
    code is the same (``same_code`` checks it). A literal outside brackets gets parentheses, so
    that its line may break; ruff then lays the pieces out. Repeats until no literal can be cut."""
    for _ in range(50):
        lines = source.split("\n")
        depth, found = 0, None
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type == tokenize.OP and tok.string in "([{":
                depth += 1
            elif tok.type == tokenize.OP and tok.string in ")]}":
                depth -= 1
            elif (tok.type == tokenize.STRING and tok.start[0] == tok.end[0]
                  and len(lines[tok.start[0] - 1]) > LINE_LENGTH):
                (row, start), end = tok.start, tok.end[1]
                # outside brackets the pieces go in parentheses of their own, one column further
                cut = _string_cut(tok.string, LINE_LENGTH - start - (depth == 0))
                if cut is not None:
                    found = row, start, end, cut, depth == 0
                    break
        if found is None:
            return source
        row, start, end, cut, bare = found
        line = lines[row - 1]
        literal = line[start:end]
        prefix, quote = STRING_START.match(literal).groups()  # type: ignore[union-attr]
        first = _piece(prefix, quote, literal[len(prefix) + 1:cut])
        second = _piece(prefix, quote, literal[cut:-1])
        opening, closing = ("(", ")") if bare else ("", "")
        lines[row - 1:row] = [line[:start] + opening + first,
                              " " * (start + len(opening)) + second + closing + line[end:]]
        source = "\n".join(lines)
    return source


#: A line that starts with a one-line string literal: indentation, prefix, quote, body, the rest.
LITERAL_LINE = re.compile(r"""^(\s*)([rRbBfFuU]{0,2})(['"])((?:\\.|(?!\3).)*)\3(.*)$""")


def _joined(first: re.Match, second: re.Match) -> str | None:
    """One literal of two adjacent ones (``first`` alone on its line), or None when they cannot
    be one: other quotes or prefixes, or a plain piece with braces that an ``f`` would read."""
    (p1, q1, b1), (p2, q2, b2) = first.group(2, 3, 4), second.group(2, 3, 4)
    if q1 != q2:
        return None
    letters = {p1.lower().replace("f", ""), p2.lower().replace("f", "")}
    if len(letters) != 1:
        return None
    formatted = "f" in (p1 + p2).lower()
    if formatted and any("f" not in p.lower() and ("{" in b or "}" in b) for p, b in ((p1, b1), (p2, b2))):
        return None
    prefix = ("f" if formatted else "") + letters.pop()
    return f"{prefix}{q1}{b1}{b2}{q1}"


def join_short_pieces(source: str) -> str:
    """Join a string literal alone on its line with the literal that starts the next line (at the
    same indentation) when the two fit on one line: cutting long strings leaves short tails."""
    lines = source.split("\n")
    strings = _string_rows(source)
    i = 0
    while i + 1 < len(lines):
        first, second = LITERAL_LINE.match(lines[i]), LITERAL_LINE.match(lines[i + 1])
        if (first and second and not first.group(5).strip() and first.group(1) == second.group(1)
                and i + 1 not in strings and i + 2 not in strings and lines[i].strip()[-3:] not in ('"""', "'''")):
            joined = _joined(first, second)
            if joined is not None and len(first.group(1) + joined + second.group(5)) <= LINE_LENGTH:
                lines[i:i + 2] = [first.group(1) + joined + second.group(5)]
                continue
        i += 1
    return "\n".join(lines)


def format_sources(sources: list[str]) -> list[str]:
    """ruff, then the comment fixes and the long strings cut, until nothing changes (at most 8
    rounds). Long lines give up their trailing comments first, so that ruff does not split code to
    make room for a comment."""
    current = [fix_comments(source) for source in sources]
    for _ in range(8):
        formatted = ruff_format(current)
        nxt = [fix_comments(wrap_docstrings(join_short_pieces(split_long_strings(f)))) if f is not None else c
               for f, c in zip(formatted, current)]
        if nxt == current:
            break
        current = nxt
    return current


# --- build plumbing ------------------------------------------------------------------------------

def _call_name(statement: ast.stmt) -> str | None:
    if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Call):
        return ast.unparse(statement.value.func)
    return None


def _is_quiet_glue(statement: ast.stmt) -> bool:
    if _call_name(statement) != "glue":
        return False
    call = statement.value  # type: ignore[attr-defined]
    if any(isinstance(node, ast.NamedExpr) for node in ast.walk(call)):
        return False  # it also assigns a name (glue("x", y := ...)): what follows may read it
    return any(k.arg == "display" and isinstance(k.value, ast.Constant) and k.value.value is False
               for k in call.keywords)


def _is_filter(statement: ast.stmt) -> bool:
    name = _call_name(statement)
    return name in ("warnings.filterwarnings", "warnings.simplefilter")


def _reads_only(statement: ast.stmt) -> bool:
    return isinstance(statement, ast.Assert) or _call_name(statement) in READ_ONLY_CALLS or _is_quiet_glue(statement)


#: Calls whose value may depend on when they run: a glue() call reading one of them stays where it is.
UNSTABLE_CALLS = re.compile(r"(^|\.)(perf_counter|time|monotonic|process_time|next|pop|popleft|rand\w*)$")
#: Calls that only read their arguments: a later statement may pass them a name a moved glue() reads.
PURE_CALLS = {"len", "print", "sorted", "list", "tuple", "set", "dict", "sum", "min", "max", "str", "repr",
              "float", "int", "round", "abs", "zip", "enumerate", "range", "isinstance", "any", "all",
              "glue", "assert_close", "torch.testing.assert_close", "math.exp", "math.log", "math.sqrt"}

#: Methods that only read their object.
READ_METHODS = {"item", "tolist", "mean", "median", "sum", "std", "max", "min", "numel", "size", "keys",
                "values", "items", "get", "split", "join", "format", "count", "index", "startswith", "endswith"}


def _quiet_glue_loop(statement: ast.stmt) -> bool:
    """A ``for`` loop that does nothing but quiet glue() calls (``for name, value in ...: glue(...)``)."""
    return (isinstance(statement, ast.For) and not statement.orelse
            and all(_is_quiet_glue(s) or _quiet_glue_loop(s) for s in statement.body))


def _walk(node: ast.AST, names: set[str]):
    """``ast.walk``, but not into a comprehension that binds one of ``names`` (its own, local name)."""
    if isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)) and any(
            isinstance(target, ast.Name) and target.id in names
            for generator in node.generators for target in ast.walk(generator.target)):
        return
    yield node
    for child in ast.iter_child_nodes(node):
        yield from _walk(child, names)


def _rebinds_first(statements: list[ast.stmt], name: str) -> bool:
    """Whether the first of ``statements`` to name ``name`` binds it anew (a loop's target, or an
    assignment whose value does not read it) before anything reads it: then no statement sees the
    value a moved loop leaves in it."""
    for statement in statements:
        if not any(isinstance(node, ast.Name) and node.id == name for node in _walk(statement, {name})):
            continue
        if isinstance(statement, ast.For):
            target, reads = statement.target, statement.iter
        elif isinstance(statement, ast.Assign):
            target, reads = ast.Tuple(elts=statement.targets, ctx=ast.Store()), statement.value
        else:
            return False
        return (any(isinstance(node, ast.Name) and node.id == name for node in ast.walk(target))
                and not any(isinstance(node, ast.Name) and node.id == name for node in ast.walk(reads)))
    return True


def _changes(statement: ast.stmt, names: set[str]) -> bool:
    """Whether ``statement`` could rebind or change in place a value one of ``names`` holds.

    It could when it assigns or deletes the name (or an attribute or item of it), calls a method of
    it other than ``READ_METHODS``, or passes it by name
    to a call other than ``PURE_CALLS`` (an item or attribute passed on is taken to be read only)."""
    def root(node: ast.AST) -> str | None:
        while isinstance(node, (ast.Attribute, ast.Subscript, ast.Starred)):
            node = node.value
        return node.id if isinstance(node, ast.Name) else None

    for node in _walk(statement, names):
        if isinstance(node, (ast.Name, ast.Attribute, ast.Subscript)) and isinstance(node.ctx, (ast.Store, ast.Del)):
            if root(node) in names:
                return True
        elif isinstance(node, ast.Call):
            if (isinstance(node.func, ast.Attribute) and node.func.attr not in READ_METHODS
                    and root(node.func.value) in names):
                return True
            if ast.unparse(node.func) not in PURE_CALLS and any(
                    isinstance(a, ast.Name) and a.id in names for a in [*node.args, *(k.value for k in node.keywords)]):
                return True
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            return True
    return False


def _movable_glue(statement: ast.stmt, after: list[ast.stmt]) -> bool:
    """Whether a quiet glue() call (or a loop of them) gives the same value after the statements ``after``.

    It does when it calls nothing whose value depends on the time it runs, and when no statement
    after it can change a value it reads (``_changes``) or reads a name its loop binds before binding
    it anew."""
    if not (_is_quiet_glue(statement) or _quiet_glue_loop(statement)):
        return False
    if any(isinstance(node, ast.Call) and UNSTABLE_CALLS.search(ast.unparse(node.func))
           for node in ast.walk(statement)):
        return False
    called = {id(node.func) for node in ast.walk(statement) if isinstance(node, ast.Call)}
    called |= {id(node.value) for node in ast.walk(statement)
               if isinstance(node, ast.Attribute) and id(node) in called}  # math in math.log(...)
    read = {node.id for node in ast.walk(statement)
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and id(node) not in called}
    bound = {node.id for node in ast.walk(statement) if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store)}
    read -= bound  # the loop's own names: what they held before the loop is not read
    return (not any(_changes(later, read) for later in after)
            and all(_rebinds_first(after, name) for name in bound))


def _tags(cell: Cell) -> list[str]:
    for line in cell.options:
        match = re.match(r"^:?tags:\s*\[(.*)\]\s*$", line)
        if match:
            return [t.strip() for t in match.group(1).split(",") if t.strip()]
    return []


def _with_tag(cell: Cell, tag: str) -> list[str]:
    tags = _tags(cell) + [tag]
    if not cell.options:
        return [f":tags: [{', '.join(tags)}]", ""]
    options = list(cell.options)
    for i, line in enumerate(options):
        if re.match(r"^:?tags:", line):
            options[i] = re.sub(r"\[.*\]", f"[{', '.join(tags)}]", line)
            return options
    if options[0] == "---":
        return [options[0], f"tags: [{', '.join(tags)}]"] + options[1:]
    return [f":tags: [{', '.join(tags)}]"] + options


def _segment(source: str, statements: list[ast.stmt]) -> str:
    lines = source.split("\n")
    start = statements[0].lineno - 1
    end = statements[-1].end_lineno or statements[-1].lineno
    # with the comment lines just above the first statement
    while start > 0 and lines[start - 1].lstrip().startswith("#"):
        start -= 1
    return "\n".join(lines[start:end])


def split_plumbing(chapter: Chapter) -> int:
    """Move leading warning filters and trailing quiet glue() calls into remove-input cells; the count."""
    moved = 0
    parts: list = []
    for part in chapter.parts:
        if not isinstance(part, Cell) or has_magic(part.source) or not parses(part.source):
            parts.append(part)
            continue
        tags = _tags(part)
        if (any(t in tags for t in ("export", "hide-input", "hide-cell", "remove-input", "remove-cell"))
                or part.source.lstrip().startswith(("# Solution", "# export:"))):
            parts.append(part)
            continue
        body = ast.parse(part.source).body
        head = 0
        while head < len(body) and _is_filter(body[head]):
            head += 1
        tail = len(body)
        while tail > head and _reads_only(body[tail - 1]):
            tail -= 1
        inner = [s for i, s in enumerate(body[head:tail], head) if _movable_glue(s, body[i + 1:])]
        trailing = [s for s in body[tail:] if _is_quiet_glue(s)]
        rest = [s for s in body[head:] if s not in inner and s not in trailing]
        last_shown = rest and isinstance(rest[-1], ast.Expr) and _call_name(rest[-1]) not in READ_ONLY_CALLS
        if trailing and last_shown and body[-1] is not rest[-1]:
            trailing = []  # the moved glue was what kept the last expression's value off the page
            rest = [s for s in body[head:] if s not in inner]
        glue = [s for s in body if s in inner or s in trailing]
        if not rest:  # nothing but plumbing: tag the cell itself
            parts.append(Cell(_with_tag(part, PLUMBING_TAG), part.source, part.fence, part.line))
            moved += 1
            continue
        if head == 0 and not glue:
            parts.append(part)
            continue
        lines = part.source.split("\n")
        keep = [i for i in range(len(lines))]
        drop: set[int] = set()
        for statement in body[:head] + glue:
            first = statement.lineno - 1
            while first > 0 and lines[first - 1].lstrip().startswith("#") and first - 1 not in drop:
                first -= 1
            drop.update(range(first, statement.end_lineno or statement.lineno))
        remaining = "\n".join(lines[i] for i in keep if i not in drop).strip("\n")
        remaining = re.sub(r"\n{3,}", "\n\n\n", remaining)
        header = [f":tags: [{PLUMBING_TAG}]", ""]
        if head:
            filters = _segment(part.source, body[:head])
            parts.append(Cell(header, filters, part.fence, part.line))
            parts.append(f"{part.fence}\n\n{part.fence}{{code-cell}} ipython3")
        parts.append(Cell(part.options, remaining, part.fence, part.line))
        if glue:
            parts.append(f"{part.fence}\n\n{part.fence}{{code-cell}} ipython3")
            parts.append(Cell(header, "\n".join(_segment(part.source, [s]) for s in glue), part.fence, part.line))
        moved += 1
    chapter.parts = _merge_text(parts)
    return moved


def _merge_text(parts: list) -> list:
    merged: list = []
    for part in parts:
        if merged and isinstance(part, str) and isinstance(merged[-1], str):
            merged[-1] = merged[-1] + "\n" + part
        else:
            merged.append(part)
    return merged


def code_label(cell: Cell) -> str:
    """The toggle label of a folded code cell (``hide-input``): what the code is, so that the bars
    on a page say what each one holds instead of "Show code cell source" every time.

    "Imports" (and "Imports and set-up" when other statements are among them), "Code of the figure"
    for a figure's cell, the names a cell defines ("Code: check_inputs, ..."), or "Code"."""
    body = ast.parse(cell.source).body
    imports = sum(isinstance(s, (ast.Import, ast.ImportFrom)) for s in body)
    if body and imports == len(body):
        return "Imports"
    if imports and 2 * imports >= len(body):
        return "Imports and set-up"
    if any(line.strip() == "figure:" for line in cell.options):
        return "Code of the figure"
    names = [s.name for s in body if isinstance(s, (ast.FunctionDef, ast.ClassDef))]
    names += [t.id for s in body if isinstance(s, (ast.Assign, ast.AnnAssign))
              for t in (s.targets if isinstance(s, ast.Assign) else [s.target]) if isinstance(t, ast.Name)
              and t.id.isupper()]
    if names:
        return "Code: " + ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
    return "Code"


def _set_prompt(cell: Cell, prompt: dict[str, str]) -> None:
    lines = [f"  {key}: {value}" for key, value in prompt.items()]
    if cell.options and cell.options[0] == "---":
        if any(line.startswith("mystnb:") for line in cell.options):
            at = next(i for i, line in enumerate(cell.options) if line.startswith("mystnb:")) + 1
            cell.options[at:at] = lines
        else:
            cell.options[-1:-1] = ["mystnb:"] + lines
    else:
        rest = [line[1:] for line in cell.options if line.startswith(":")]
        cell.options = ["---", *rest, "mystnb:", *lines, "---"]


def label_code(chapter: Chapter) -> int:
    """Give each folded code cell (``hide-input``) without a label its ``code_label``; the count."""
    changed = 0
    for cell in chapter.cells:
        if "hide-input" not in _tags(cell) or any("code_prompt_show" in line for line in cell.options):
            continue
        if has_magic(cell.source) or not parses(cell.source):
            continue
        label = code_label(cell)
        _set_prompt(cell, {"code_prompt_show": f'"{label}"', "code_prompt_hide": f'"{label}"'})
        changed += 1
    return changed


def label_solutions(chapter: Chapter) -> int:
    """Give each hidden solution cell the toggle label "Solution"; the count of cells changed."""
    changed = 0
    for cell in chapter.cells:
        if "hide-cell" not in _tags(cell) or not cell.source.lstrip().startswith("# Solution"):
            continue
        if any("code_prompt_show" in line for line in cell.options):
            continue
        _set_prompt(cell, SOLUTION_PROMPT)
        changed += 1
    return changed


# --- the command ---------------------------------------------------------------------------------

@dataclass
class Report:
    name: str
    lines_before: int = 0
    wide_before: int = 0
    lines_after: int = 0
    wide_after: int = 0
    skipped: list[str] = field(default_factory=list)
    plumbing: int = 0
    solutions: int = 0
    labels: int = 0


def format_chapter(path: Path, tag_plumbing: bool = False, solutions: bool = False,
                   labels: bool = False) -> tuple[str, Report]:
    """The chapter's new text and what changed; raises Refused if a cell's syntax tree would change."""
    text = path.read_text()
    chapter = Chapter.parse(text)
    assert chapter.text() == text, f"{path}: the chapter does not read back as written"
    report = Report(path.name)
    for cell in chapter.cells:
        n, w = wide_lines(cell.source)
        report.lines_before += n
        report.wide_before += w
    if tag_plumbing:
        report.plumbing = split_plumbing(chapter)
    if solutions:
        report.solutions = label_solutions(chapter)
    if labels:
        report.labels = label_code(chapter)
    todo = []
    for cell in chapter.cells:
        if has_magic(cell.source) or not parses(cell.source):
            report.skipped.append(f"{path.name}:{cell.line}")
        else:
            todo.append(cell)
    for cell, new in zip(todo, format_sources([c.source for c in todo])):
        if not same_code(cell.source, new):
            raise Refused(f"{path.name}:{cell.line}: formatting would change the cell's code; not written")
        cell.source = new
    for cell in chapter.cells:
        n, w = wide_lines(cell.source)
        report.lines_after += n
        report.wide_after += w
    return chapter.text(), report


def _share(wide: int, lines: int) -> str:
    return f"{wide:5d}/{lines:5d} = {wide / max(lines, 1):6.1%}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.format_chapters", description=__doc__.split("\n")[0])
    parser.add_argument("chapters", nargs="*", type=Path, help="chapters to format (default: all of _toc.yml)")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a chapter would change")
    parser.add_argument("--tag-plumbing", action="store_true", help="move glue() calls and warning filters into remove-input cells")
    parser.add_argument("--label-solutions", action="store_true", help='label hidden solution cells "Solution"')
    parser.add_argument("--label-code", action="store_true", help="label each folded code cell by what it holds")
    args = parser.parse_args(argv)
    paths = args.chapters or chapter_paths(Path.cwd())
    for path in paths:
        if not path.is_file():
            parser.error(f"chapters: expected a chapter file, got {str(path)!r}")
    total = Report("all")
    changed = []
    try:
        for path in paths:
            new, report = format_chapter(path, args.tag_plumbing, args.label_solutions, args.label_code)
            if new != path.read_text():
                changed.append(path)
                if not args.check:
                    path.write_text(new)
            print(f"{report.name:28s} over {LINE_LENGTH}: before {_share(report.wide_before, report.lines_before)}"
                  f"  after {_share(report.wide_after, report.lines_after)}"
                  + (f"  plumbing moved {report.plumbing}" if report.plumbing else "")
                  + (f"  solutions labelled {report.solutions}" if report.solutions else "")
                  + (f"  code toggles labelled {report.labels}" if report.labels else ""))
            for key in ("lines_before", "wide_before", "lines_after", "wide_after"):
                setattr(total, key, getattr(total, key) + getattr(report, key))
            total.skipped += report.skipped
    except Refused as err:
        print(f"refused: {err}", file=sys.stderr)
        return 1
    print(f"{'all':28s} over {LINE_LENGTH}: before {_share(total.wide_before, total.lines_before)}"
          f"  after {_share(total.wide_after, total.lines_after)}")
    if total.skipped:
        print(f"left as written (magics, or not Python): {', '.join(total.skipped)}")
    if args.check and changed:
        print(f"would change: {', '.join(str(p) for p in changed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
