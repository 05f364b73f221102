"""Tests for transformer/generation/text_measures.py (chapters/sampling.md): repeated windows and the
repeat rate against a brute-force search over pairs of positions, whole words against a scan character
by character, the real-word rate by hand, and clear errors for bad input."""

import random

import pytest

from transformer.generation.text_measures import (
    real_word_rate,
    repeat_rate,
    repeated_windows,
    repeats,
    whole_words,
    words_of,
)


def marks_by_pairs(text: str, n: int) -> list[bool]:
    """Window j is marked when some i with i + n <= j holds the same n characters: every pair tried."""
    return [
        any(text[i : i + n] == text[j : j + n] for i in range(j - n + 1))
        for j in range(len(text) - n + 1)
    ]


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("n", [1, 2, 3, 8])
def test_repeated_windows_match_a_search_over_pairs(seed, n):
    rng = random.Random(seed)
    for length in (0, n - 1, n, 2 * n, 60):
        text = "".join(rng.choice("ab c") for _ in range(max(length, 0)))
        assert repeated_windows(text, n) == marks_by_pairs(text, n)
        assert repeats(text, n) == any(marks_by_pairs(text, n))


def test_repeats_by_hand():
    assert repeated_windows("abcabc", n=3) == [False, False, False, True]
    # a run of one letter: "aaa" at 3 is the first window whose earlier copy ends before it starts
    assert repeated_windows("aaaaaa", n=3) == [False, False, False, True]
    assert repeats("to be or not to be", n=5) and not repeats("to be or not to be", n=6)
    assert repeated_windows("short", n=8) == [] and not repeats("short")


def test_repeat_rate_by_hand():
    texts = ["abcabc", "abcdef"]  # windows of 3: [F, F, F, T] and [F, F, F, F]
    assert repeat_rate(texts, n=3) == 1 / 8
    assert repeat_rate(texts, n=3, start=2) == 1 / 4  # windows at 2 and 3 of each
    assert repeat_rate(texts, n=3, stop=5) == 0.0  # windows at 0, 1, 2: they end by 5
    assert repeat_rate(texts, n=3, start=3, stop=6) == 1 / 2  # the windows at 3
    # the earlier copy may lie before start: "abc" at 3 repeats the one at 0
    assert repeat_rate(["abcabc"], n=3, start=3) == 1.0
    # a text too short for the stretch adds no window
    assert repeat_rate(["abcabc", "ab"], n=3, start=3) == 1.0


def test_repeat_rate_pools_windows_not_texts():
    rng = random.Random(0)
    texts = ["".join(rng.choice("abc ") for _ in range(rng.randrange(10, 40))) for _ in range(6)]
    marks = [mark for text in texts for mark in marks_by_pairs(text, 4)[5 : 20 - 4 + 1]]
    assert repeat_rate(texts, n=4, start=5, stop=20) == sum(marks) / len(marks)


def words_by_scan(text: str, start: int, stop: int) -> list[str]:
    """Whole words found by walking the characters: a word runs over letters and apostrophes."""
    lower, found, i = text.lower(), [], 0
    while i < len(lower):
        if lower[i].isascii() and (lower[i].isalpha() or lower[i] == "'"):
            j = i
            while j < len(lower) and lower[j].isascii() and (lower[j].isalpha() or lower[j] == "'"):
                j += 1
            if i > 0 and j < len(lower) and start <= i and j <= stop:
                found.append(lower[i:j])
            i = j
        else:
            i += 1
    return found


def test_whole_words_match_a_scan():
    text = "ing the King's men,\nO, 'tis Marcius! and so to bed: a"
    assert whole_words(text) == ["the", "king's", "men", "o", "'tis", "marcius", "and", "so", "to", "bed"]
    for start in range(0, len(text), 3):
        for stop in range(start, len(text) + 1, 4):
            assert whole_words(text, start, stop) == words_by_scan(text, start, stop), (start, stop)
    assert words_of(text) == ["ing", "the", "king's", "men", "o", "'tis", "marcius", "and", "so", "to", "bed", "a"]


def test_real_word_rate_by_hand():
    known = {"the", "king", "is", "dead"}
    assert real_word_rate(["the", "kinge", "is", "dead"], known) == 3 / 4
    assert real_word_rate(["dead", "dead"], frozenset(known)) == 1.0
    assert real_word_rate(("xx",), ["the"]) == 0.0  # any sequence of words, any collection


@pytest.mark.parametrize("call, error, message", [
    (lambda: repeated_windows(b"abc"), TypeError, "text must be a str, got bytes"),
    (lambda: repeated_windows("abc", n=0), ValueError, "n must be a positive int, got 0"),
    (lambda: repeats("abc", n=2.0), TypeError, "n must be a positive int, got float"),
    (lambda: repeat_rate("abcabc"), TypeError, r"texts must be a sequence of str \(a list\), got str"),
    (lambda: repeat_rate(["abc", 3]), TypeError, r"texts\[1\] must be a str, got int"),
    (lambda: repeat_rate(["abcabc"], start=-1), ValueError, "start must be a non-negative int, got -1"),
    (lambda: repeat_rate(["abcabc"], start=4, stop=4), ValueError, "stop must be > start=4, got 4"),
    (lambda: repeat_rate(["abc"], n=8), ValueError, r"no window of n=8 characters .* \(lengths \[3\]\)"),
    (lambda: repeat_rate([]), ValueError, "no window of n=8 characters"),
    (lambda: words_of(None), TypeError, "text must be a str, got NoneType"),
    (lambda: whole_words("a b", stop=-2), ValueError, "stop must be a non-negative int, got -2"),
    (lambda: real_word_rate("the", {"the"}), TypeError, "words must be a sequence of str"),
    (lambda: real_word_rate(["the"], "the"), TypeError, r"known must be a collection of str \(a set\), got str"),
    (lambda: real_word_rate([], {"the"}), ValueError, "words must hold at least one word"),
])
def test_bad_input_names_the_argument(call, error, message):
    with pytest.raises(error, match=message):
        call()
