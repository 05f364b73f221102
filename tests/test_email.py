"""Tests for transformer/tasks/email.py and transformer/tasks/baselines.py (chapters/pretraining.md)."""

import re
from email.message import EmailMessage
from pathlib import Path

import pytest
import torch

from transformer.tasks.baselines import bag_of_words, fit_logistic_regression, word_vocabulary, words
from transformer.tasks.email import (FOLDERS, Email, corpus_folder, duplicate_groups, email_headers, email_text,
                                     html_to_text, read_emails, split_emails)

pytestmark = pytest.mark.usefixtures("one_thread")
ROOT = Path(__file__).resolve().parent.parent


def test_no_code_of_the_book_names_a_folder_of_the_later_collection():
    later = re.compile(r"(spam|easy-ham|hard-ham)-" + "2")  # written in two pieces so that this file does not match
    sources = [*ROOT.glob("transformer/**/*.py"), ROOT / "chapters/pretraining.md", *ROOT.glob("benchmarks/*.py"),
               *ROOT.glob("tests/*.py"), *ROOT.glob("models/spam*/*")]
    named = [str(path) for path in sources if path.is_file() and later.search(path.read_text(errors="replace"))]
    assert named == []
    assert set(FOLDERS) == {"spam-1", "easy-ham-1", "hard-ham-1"}


def test_html_to_text_keeps_the_text_and_drops_scripts_styles_and_tags():
    markup = ("<html><head><title>T</title><style>p {color: red}</style></head><body><p>Buy <b>now</b> &amp; "
              "save</p><script>var x = 1;</script><div>Line   two</div><br>end</body></html>")
    assert html_to_text(markup) == "Buy now & save\n\nLine two\n\nend"


def test_email_text_decodes_mime_parts_and_leaves_headers_out():
    message = EmailMessage()
    message["Subject"] = "=?utf-8?q?Caf=C3=A9?= offer"
    message["X-Spam-Status"] = "Yes, hits=12.0"
    message.set_content("Grüße aus Köln\n", charset="utf-8", cte="base64")
    message.add_alternative("<p>the html</p>", subtype="html")
    message.add_attachment(b"not text", maintype="application", subtype="octet-stream", filename="a.bin")
    raw = message.as_bytes()
    assert b"R3L8" in raw or b"base64" in raw  # the body is encoded in the raw bytes
    text = email_text(raw)
    assert text == "Café offer\nGrüße aus Köln"  # the plain part preferred, the attachment and headers left out
    assert "X-Spam-Status: Yes" in email_headers(raw) and "X-Spam" not in text


def test_email_text_reads_html_when_there_is_no_plain_part():
    message = EmailMessage()
    message["Subject"] = "Hi"
    message.set_content("<p>Hello <i>you</i></p><p>bye</p>", subtype="html", cte="quoted-printable")
    assert email_text(message.as_bytes()) == "Hi\nHello you\n\nbye"
    with pytest.raises(TypeError, match="bytes"):
        email_text("a str")  # type: ignore[arg-type]


def test_duplicate_groups_finds_exact_and_near_copies_only():
    base = " ".join(f"word{i}" for i in range(200))
    texts = [base, "something else entirely " * 20, base.upper(), base.replace("word7 ", "other "),
             " ".join(f"word{i}" for i in range(100, 300))]
    # 2: the same words (case ignored); 3: one word changed, Jaccard of 5-shingles ~ 0.95; 4: half the same, ~ 0.33
    assert duplicate_groups(texts) == [0, 1, 0, 0, 4]


def test_split_is_disjoint_deterministic_and_fixed_by_the_file():
    mails = [Email("spam-1", f"{i:05d}.{i * 7919:032x}.txt", 1, f"text number {i} " * 10, "") for i in range(200)]
    splits = split_emails(mails)
    again = split_emails(list(reversed(mails)))
    for name in splits:
        assert {m.name for m in splits[name]} == {m.name for m in again[name]}
    assert sum(map(len, splits.values())) == 200
    assert {m.name for m in splits["test"]} == {m.name for m in mails if m.key % 10 == 0}


def test_logistic_regression_matches_a_hand_written_gradient_descent():
    texts = ["cheap pills now", "meeting at noon", "cheap offer now", "lunch at noon", "pills offer", "noon meeting"]
    y = torch.tensor([1, 0, 1, 0, 1, 0])
    vocabulary = word_vocabulary(texts, min_count=1)
    x = bag_of_words(texts, vocabulary)
    assert x.sum(dim=1).tolist() == [len(set(words(t))) for t in texts]
    model = fit_logistic_regression(x, y, weight_decay=0.1, steps=200)
    # the same objective minimised by plain gradient descent, written out
    w, b = torch.zeros(x.shape[1], 2, dtype=torch.float64), torch.zeros(2, dtype=torch.float64)
    xd = x.double()
    for _ in range(20000):
        p = torch.softmax(xd @ w + b, dim=1)
        p[torch.arange(6), y] -= 1
        w -= 0.5 * (xd.T @ p / 6 + 0.1 * w)
        b -= 0.5 * p.mean(dim=0)
    assert torch.allclose(model.weight.T.double(), w, atol=1e-3)
    assert torch.allclose(model.bias.double(), b, atol=1e-3)


@pytest.mark.slow  # reads every email of the corpus (10 s on the busy 2-core machine)
def test_the_corpus_reads_as_version_0_2_3():
    emails = read_emails()
    assert [sum(m.folder == f for m in emails) for f in FOLDERS] == [500, 2500, 250]
    assert corpus_folder().is_dir()
