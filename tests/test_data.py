"""Tests of transformer.tasks.numbers: number words, vocabularies, splits and batches."""

import numpy as np
import pytest
import torch

from transformer import padding_mask
from transformer.training.batch import Batch
from transformer.training.vocab import Vocab
from transformer.tasks.numbers import (batches, make_batch, number_to_words, numbers_with_digits, source_vocab,
                                       split_numbers, split_numbers_by_length, target_vocab)

# Written out by hand, British usage: "and" before the last part of a group.
KNOWN = {
    0: "zero",
    7: "seven",
    13: "thirteen",
    20: "twenty",
    21: "twenty-one",
    99: "ninety-nine",
    100: "one hundred",
    101: "one hundred and one",
    110: "one hundred and ten",
    999: "nine hundred and ninety-nine",
    1000: "one thousand",
    1001: "one thousand and one",
    1010: "one thousand and ten",
    1100: "one thousand one hundred",
    1005: "one thousand and five",
    2020: "two thousand and twenty",
    12345: "twelve thousand three hundred and forty-five",
    40000: "forty thousand",
    100000: "one hundred thousand",
    100100: "one hundred thousand one hundred",
    101000: "one hundred and one thousand",
    110011: "one hundred and ten thousand and eleven",
    999999: "nine hundred and ninety-nine thousand nine hundred and ninety-nine",
}

_UNITS = {w: i for i, w in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
    "sixteen seventeen eighteen nineteen".split())}
_TENS = {w: 10 * i for i, w in enumerate("twenty thirty forty fifty sixty seventy eighty ninety".split(), start=2)}


def parse(text: str) -> int:
    """An independent reader of number words: accumulate, multiply at "hundred" and "thousand"."""
    total, current = 0, 0
    for word in text.split():
        if word == "and":
            continue
        if word == "hundred":
            current *= 100
        elif word == "thousand":
            total, current = total + current * 1000, 0
        elif "-" in word:
            tens, units = word.split("-")
            assert tens in _TENS and 1 <= _UNITS[units] <= 9, word
            current += _TENS[tens] + _UNITS[units]
        elif word in _TENS:
            current += _TENS[word]
        else:
            current += _UNITS[word]
    return total + current


def expected_ands(n: int) -> int:
    """How many times British English says "and" in n, from the digits."""
    thousands, rest = divmod(n, 1000)
    count = int(thousands >= 100 and thousands % 100 != 0)
    count += int(rest >= 100 and rest % 100 != 0)
    count += int(thousands > 0 and 0 < rest < 100)
    return count


SAMPLE = list(range(0, 2001)) + list(range(0, 1_000_000, 97)) + [999_999, 100_001, 990_099]


@pytest.mark.parametrize("n, words", KNOWN.items())
def test_number_to_words_known_cases(n, words):
    assert number_to_words(n) == words


def test_words_parse_back_to_the_number():
    for n in SAMPLE:
        assert parse(number_to_words(n)) == n, n


def test_and_appears_where_british_usage_puts_it():
    for n in SAMPLE:
        words = number_to_words(n).split()
        assert words.count("and") == expected_ands(n), n
        assert words[0] != "and" and words[-1] != "and"
        assert n == 0 or "zero" not in words  # "zero" only ever stands alone


def test_hyphenated_tens_and_units_are_one_word():
    assert number_to_words(45).split() == ["forty-five"]
    assert "forty-five" in number_to_words(45_045).split()


def test_numpy_integers_are_accepted():
    assert number_to_words(np.int64(12345)) == KNOWN[12345]


@pytest.mark.parametrize("bad", [3.0, "5", True, None])
def test_number_to_words_rejects_non_integers(bad):
    with pytest.raises(TypeError, match="n must be an int"):
        number_to_words(bad)


@pytest.mark.parametrize("bad", [-1, 1_000_000, 10**12])
def test_number_to_words_rejects_out_of_range(bad):
    with pytest.raises(ValueError, match=rf"n must be an int in \[0, 999999\], got {bad}"):
        number_to_words(bad)


def test_specials_come_first():
    for vocab in (source_vocab(), target_vocab(), Vocab(["a", "b"])):
        assert (vocab.pad_id, vocab.bos_id, vocab.eos_id) == (0, 1, 2)
        assert vocab.itos[:3] == ["<pad>", "<bos>", "<eos>"]


def test_vocab_sizes_and_source_words_are_exactly_the_generated_words():
    src = source_vocab()
    words = {w for n in range(0, 1_000_000, 7) for w in number_to_words(n).split()}
    assert set(src.itos[3:]) == words and len(src) == 3 + 103
    assert target_vocab().itos[3:] == list("0123456789") and len(target_vocab()) == 13


def test_encode_decode_round_trip():
    src, tgt = source_vocab(), target_vocab()
    for n in SAMPLE[::50]:
        words = number_to_words(n)
        ids = src.encode(words)
        assert len(ids) == len(words.split()) and min(ids) >= 3
        assert src.decode(ids) == words
        assert tgt.decode(tgt.encode(str(n))) == str(n)
        assert tgt.decode(torch.tensor(tgt.encode(str(n)))) == str(n)  # a tensor works too


def test_decode_drops_specials_and_stops_at_eos():
    tgt = target_vocab()
    one, two, three = (tgt.stoi[c] for c in "123")
    assert tgt.decode([tgt.bos_id, one, two, tgt.eos_id, three]) == "12"
    assert tgt.decode([one, tgt.pad_id, two]) == "12"
    assert tgt.decode([]) == ""


def test_tokenize_words_and_characters():
    assert source_vocab().tokenize("one  hundred and\tfive") == ["one", "hundred", "and", "five"]
    assert target_vocab().tokenize("105") == ["1", "0", "5"]


def test_unknown_word_raises_naming_it():
    with pytest.raises(ValueError, match="unknown word 'fourty'"):
        source_vocab().encode("one hundred and fourty")
    with pytest.raises(ValueError, match="unknown char 'x'"):
        target_vocab().encode("1x3")
    with pytest.raises(ValueError, match="unknown word '<pad>'"):  # specials are not text
        source_vocab().encode("<pad> one")


def test_bad_vocab_arguments():
    with pytest.raises(ValueError, match="split must be"):
        Vocab(["a"], split="bytes")
    with pytest.raises(ValueError, match="distinct"):
        Vocab(["a", "a"])
    with pytest.raises(ValueError, match="distinct"):
        Vocab(["<eos>"])
    with pytest.raises(ValueError, match="every token must be a char"):
        Vocab(["ab"], split="char")
    with pytest.raises(TypeError, match="text must be a str"):
        source_vocab().encode(5)
    with pytest.raises(ValueError, match=r"ids must lie in \[0, 13\)"):
        target_vocab().decode([3, 13])


def test_splits_are_disjoint_sized_and_seeded():
    train, valid, test = split_numbers(5000, 300, 700, seed=3)
    assert (len(train), len(valid), len(test)) == (5000, 300, 700)
    sets = [set(train), set(valid), set(test)]
    assert [len(s) for s in sets] == [5000, 300, 700]  # no repeats inside a split
    assert not sets[0] & sets[1] and not sets[0] & sets[2] and not sets[1] & sets[2]
    assert all(0 <= n <= 999_999 and isinstance(n, int) for n in train + valid + test)
    assert split_numbers(5000, 300, 700, seed=3) == (train, valid, test)
    assert split_numbers(5000, 300, 700, seed=4)[2] != test


def test_splits_can_take_every_number():
    train, valid, test = split_numbers(600_000, 200_000, 200_000)
    assert sorted(train + valid + test) == list(range(1_000_000))


def test_numbers_with_digits_cover_the_million_once():
    lengths = [numbers_with_digits(k) for k in range(1, 7)]
    assert [len(r) for r in lengths] == [10, 90, 900, 9_000, 90_000, 900_000]
    assert [n for r in lengths for n in r] == list(range(1_000_000))
    for bad in (0, 7, True, 2.0):
        with pytest.raises(ValueError, match=r"k must be an int in \[1, 6\]"):
            numbers_with_digits(bad)


def test_length_first_split_draws_every_length_alike_and_holds_out_short_numbers():
    train, valid, test, short_test = split_numbers_by_length(12_000, 300, 700, seed=3)
    # validation and test: split_numbers' own, for the same arguments
    assert (valid, test) == split_numbers(12_000, 300, 700, seed=3)[1:]
    assert len(train) == 12_000 and len(set(short_test)) == len(short_test) == 200
    assert [sum(len(str(n)) == k for n in short_test) for k in (1, 2, 3)] == [2, 18, 180]
    assert not (set(valid) | set(test) | set(short_test)) & set(train)
    counts = [sum(len(str(n)) == k for n in train) for k in range(1, 7)]
    assert all(abs(c - 2_000) < 150 for c in counts), counts  # a sixth each
    # the short numbers that may be trained on repeat: 8 of one digit share about 2,000 draws
    assert len({n for n in train if n < 10}) == 8
    assert split_numbers_by_length(12_000, 300, 700, seed=3) == (train, valid, test, short_test)
    assert split_numbers_by_length(12_000, 300, 700, seed=4)[3] != short_test


def test_length_first_split_refuses_bad_sizes_as_split_numbers_does():
    with pytest.raises(ValueError, match="train_size must be an int >= 0"):
        split_numbers_by_length(-1, 10, 10)
    with pytest.raises(ValueError, match="more than the 1000000 numbers"):
        split_numbers_by_length(999_999, 1, 1)


@pytest.mark.parametrize("sizes, message", [
    ((-1, 10, 10), "train_size must be an int >= 0"),
    ((10, 1.5, 10), "valid_size must be an int >= 0"),
    ((10, 10, True), "test_size must be an int >= 0"),
    ((999_999, 1, 1), "more than the 1000000 numbers"),
])
def test_bad_split_sizes(sizes, message):
    with pytest.raises(ValueError, match=message):
        split_numbers(*sizes)


def test_batch_shapes_masks_and_shift():
    src_vocab, tgt_vocab = source_vocab(), target_vocab()
    numbers = [7, 1005, 12345, 999_999, 40]
    batch = make_batch(numbers, src_vocab, tgt_vocab)
    assert isinstance(batch, Batch)
    S = max(len(number_to_words(n).split()) for n in numbers)
    T = max(len(str(n)) for n in numbers) + 1
    assert batch.src.shape == (5, S) and batch.tgt_in.shape == batch.tgt_out.shape == (5, T)
    assert batch.src.dtype == batch.tgt_in.dtype == batch.tgt_out.dtype == torch.long
    assert torch.equal(batch.src_mask, padding_mask(batch.src, 0)) and batch.src_mask.shape == (5, 1, 1, S)
    assert torch.equal(batch.tgt_mask, padding_mask(batch.tgt_in, 0)) and batch.tgt_mask.shape == (5, 1, 1, T)
    for row, n in enumerate(numbers):
        digits = [tgt_vocab.stoi[c] for c in str(n)]
        words = [src_vocab.stoi[w] for w in number_to_words(n).split()]
        pad_t, pad_s = [0] * (T - len(digits) - 1), [0] * (S - len(words))
        assert batch.src[row].tolist() == words + pad_s
        assert batch.tgt_in[row].tolist() == [1] + digits + pad_t
        assert batch.tgt_out[row].tolist() == digits + [2] + pad_t
        # the shift by one: the input at t + 1 is the target at t, up to the end token
        assert batch.tgt_in[row, 1:len(digits) + 1].tolist() == batch.tgt_out[row, :len(digits)].tolist()


def test_batch_on_a_device_and_to():
    batch = make_batch([5, 50], source_vocab(), target_vocab(), device="meta")
    assert all(t.device.type == "meta" for t in batch)
    moved = make_batch([5, 50], source_vocab(), target_vocab()).to("meta")
    assert isinstance(moved, Batch) and all(t.device.type == "meta" for t in moved)


def test_batches_cover_every_number_once_in_a_seeded_order():
    src_vocab, tgt_vocab = source_vocab(), target_vocab()
    numbers = list(range(1000, 1100))
    out = list(batches(numbers, 32, src_vocab, tgt_vocab, seed=5))
    assert [b.src.shape[0] for b in out] == [32, 32, 32, 4]
    seen = [int(tgt_vocab.decode(row)) for b in out for row in b.tgt_out]
    assert sorted(seen) == numbers and seen != numbers  # all of them, shuffled
    again = [int(tgt_vocab.decode(row)) for b in batches(numbers, 32, src_vocab, tgt_vocab, seed=5) for row in b.tgt_out]
    assert again == seen
    ordered = [int(tgt_vocab.decode(row)) for b in batches(numbers, 32, src_vocab, tgt_vocab, shuffle=False)
               for row in b.tgt_out]
    assert ordered == numbers


def test_bad_batch_input():
    src_vocab, tgt_vocab = source_vocab(), target_vocab()
    with pytest.raises(ValueError, match="numbers must not be empty"):
        make_batch([], src_vocab, tgt_vocab)
    with pytest.raises(ValueError, match=r"numbers\[1\] must be an int in \[0, 999999\], got -2"):
        make_batch([1, -2], src_vocab, tgt_vocab)
    with pytest.raises(TypeError, match=r"numbers\[0\] must be an int"):
        make_batch([2.5], src_vocab, tgt_vocab)
    with pytest.raises(TypeError, match="numbers must be an iterable of ints"):
        make_batch("123", src_vocab, tgt_vocab)
    with pytest.raises(ValueError, match="batch_size must be a positive int"):
        next(batches([1, 2], 0, src_vocab, tgt_vocab))
    with pytest.raises(ValueError, match="numbers must not be empty"):
        next(batches([], 4, src_vocab, tgt_vocab))
