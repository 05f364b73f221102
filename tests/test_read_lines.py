"""Tests for transformer/files.py (chapters/subwords.md): reading the user's text lines."""

import io

import pytest

from transformer.files import read_lines


def test_utf8_lines_are_read_as_python_reads_them(tmp_path):
    text = "Ein Hund läuft.\r\nZwei Kinder\u2028spielen.\n\n\u6f22 字\nno newline at the end"
    path = tmp_path / "de.txt"
    path.write_bytes(text.encode("utf-8"))
    expected = text.encode("utf-8").decode("utf-8").replace("\r\n", "\n").split("\n")  # \u2028 is no line end here
    assert read_lines(path, what="de.txt") == expected == read_lines(str(path), what="de.txt")
    assert read_lines(io.BytesIO(text.encode("utf-8")), what="stdin") == expected
    assert read_lines(io.StringIO(text), what="stdin") == expected  # a text stream without bytes
    assert read_lines(io.BytesIO(b""), what="stdin") == []


def test_a_byte_order_mark_is_dropped():
    assert read_lines(io.BytesIO(b"\xef\xbb\xbfEin Hund.\n"), what="stdin") == ["Ein Hund."]


def test_a_line_that_is_not_utf8_is_named_with_its_number_and_bytes(tmp_path):
    path = tmp_path / "latin.txt"
    path.write_bytes("gut\nGrün\nüber Straße\n".encode("latin-1"))
    with pytest.raises(ValueError) as err:
        read_lines(path, what=f"--train-src {path}")
    assert str(err.value) == (f"--train-src {path}, line 2: the bytes b'\\xfc' at byte 3 are not UTF-8 "
                              "(1 more line is not UTF-8 either)")


def test_replace_keeps_every_line_and_reports_each_replaced_one(capsys):
    data = b"a\xffb\nok\n\xc3\n\xe2\x82\n"  # a bad byte, a good line, two cut sequences
    assert read_lines(io.BytesIO(data), what="stdin", errors="replace") == \
        data.decode("utf-8", "replace").split("\n")[:4]  # the reference: Python's replacement
    reported = capsys.readouterr().err.splitlines()
    assert [line.split(":")[0] for line in reported] == ["stdin, line 1", "stdin, line 3", "stdin, line 4"]
    assert reported[2] == "stdin, line 4: the bytes b'\\xe2\\x82' at byte 1 are not UTF-8: replaced by U+FFFD"


def test_lone_surrogates_of_a_text_stream_are_bad_bytes():
    escaped = b"Gr\xfcn\n".decode("utf-8", "surrogateescape")  # how a C-locale stdin hands over Latin-1
    with pytest.raises(ValueError, match=r"stdin, line 1: the bytes b'\\xfc' at byte 3 are not UTF-8"):
        read_lines(io.StringIO(escaped), what="stdin")
    with pytest.raises(ValueError, match="stdin, line 1: the bytes"):
        read_lines(io.StringIO("a\ud800b"), what="stdin")


def test_a_file_that_cannot_be_read_is_named(tmp_path):
    with pytest.raises(ValueError, match=r"^--train-src .*missing.txt: cannot be read: No such file or directory$"):
        read_lines(tmp_path / "missing.txt", what=f"--train-src {tmp_path / 'missing.txt'}")
    with pytest.raises(ValueError, match=r"^folder: cannot be read: Is a directory$"):
        read_lines(tmp_path, what="folder")


def test_errors_must_be_strict_or_replace():
    with pytest.raises(ValueError, match="errors must be 'strict' or 'replace', got 'ignore'"):
        read_lines(io.BytesIO(b""), what="stdin", errors="ignore")


def test_parallel_files_pair_up_or_are_refused_by_name(tmp_path):
    from transformer.files import read_parallel

    (tmp_path / "de").write_text("Ein Hund.\nZwei Kinder.\n", encoding="utf-8")
    (tmp_path / "en").write_text("A dog.\r\nTwo children.", encoding="utf-8")
    assert read_parallel("--src", tmp_path / "de", "--tgt", tmp_path / "en") == (
        ["Ein Hund.", "Zwei Kinder."], ["A dog.", "Two children."])
    for text, message in (("A dog.\n", "--tgt {}/bad has 1 lines but --src has 2"),
                          ("", "--tgt {}/bad is empty"), ("A dog.\n\t\n", "--tgt {}/bad, line 2: the line is empty"),
                          ("A d\xf6g.\nTwo.\n", "--tgt {}/bad, line 1: the bytes b'\\xf6' at byte 4 are not UTF-8")):
        (tmp_path / "bad").write_bytes(text.encode("latin-1"))
        with pytest.raises(ValueError) as err:
            read_parallel("--src", tmp_path / "de", "--tgt", tmp_path / "bad")
        assert str(err.value).startswith(message.format(tmp_path)), err.value
