"""Tests for transformer/tasks/masked_lm.py (chapters/pretraining.md) and its committed models, models/spam-mlm and
models/text-mlm."""

import json
import shlex
import math
from pathlib import Path

import pytest
import torch

from transformer.tasks.classifier import SequenceClassifier
from transformer.tasks.masked_lm import (CAPTIONS_PER_TEXT, IGNORE_INDEX, MASK_TOKEN, MaskedLanguageModel, caption_texts,
                                         classifier_from_mlm, first_tokens, load_mlm, mask_tokens, mlm_accuracy, mlm_loss,
                                         mlm_right, token_windows, train_mlm, unigram_entropy, unigram_guess)
from transformer.training.checkpoint import SaveCheckpoint, load_checkpoint
from transformer.training.loop import Evaluate

pytestmark = pytest.mark.usefixtures("one_thread")
ROOT = Path(__file__).resolve().parent.parent
MASK, FIRST, V = 3, 4, 50


def small_mlm(seed=0, vocab_size=V):
    torch.manual_seed(seed)
    return MaskedLanguageModel(vocab_size, d_model=16, num_heads=2, d_ff=32, num_layers=2, dropout=0.0, max_len=32)


@pytest.mark.parametrize("seed", [0, 1])
def test_the_masking_rule_has_the_papers_proportions(seed):
    n = 400_000
    tokens = torch.randint(FIRST, V, (n // 100, 100))
    tokens[:, 90:] = 0  # padding: never chosen
    inputs, targets = mask_tokens(tokens, MASK, FIRST, V, generator=torch.Generator().manual_seed(seed))
    chosen = targets != IGNORE_INDEX
    real = tokens != 0
    assert not (chosen & ~real).any() and torch.equal(inputs[~real], tokens[~real])
    assert torch.equal(targets[chosen], tokens[chosen])  # the target is the original token
    assert torch.equal(inputs[~chosen], tokens[~chosen])  # what is not chosen is left alone
    k = int(chosen.sum())
    masked = inputs[chosen] == MASK
    kept = inputs[chosen] == tokens[chosen]
    replaced = ~masked & ~kept
    # binomial standard errors: sqrt(p (1 - p) / n); 5 of them is a margin a correct rule misses once in ~3 million
    for share, p, count in [(k / int(real.sum()), 0.15, int(real.sum())), (masked.float().mean(), 0.8, k),
                            (replaced.float().mean(), 0.1 * (1 - 1 / (V - FIRST)), k),
                            (kept.float().mean(), 0.1 + 0.1 / (V - FIRST), k)]:
        assert abs(float(share) - p) < 5 * (p * (1 - p) / count) ** 0.5, (share, p)
    random_ids = inputs[chosen][replaced]
    assert random_ids.min() >= FIRST and random_ids.max() < V  # never <pad>, never <mask>
    # the random tokens are uniform over [FIRST, V): a chi-squared test on their counts
    counts = torch.bincount(random_ids - FIRST, minlength=V - FIRST).double()
    expected = counts.sum() / (V - FIRST)
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 100  # 45 degrees of freedom: P(chi2 > 100) < 1e-5


def test_the_loss_is_taken_at_chosen_positions_only():
    model = small_mlm().eval()
    tokens = torch.randint(FIRST, V, (3, 12))
    targets = torch.full_like(tokens, IGNORE_INDEX)
    targets[0, 2], targets[2, 7] = 9, 11
    loss, metrics = mlm_loss(model, (tokens, targets))
    logits = model(tokens)
    expected = torch.nn.functional.cross_entropy(torch.stack([logits[0, 2], logits[2, 7]]), torch.tensor([9, 11]))
    assert torch.allclose(loss, expected, atol=1e-6)
    assert 0 <= float(metrics["accuracy"]) <= 1


@pytest.mark.slow  # trains a masked LM
def test_padding_changes_no_output_and_the_model_learns_a_copy_task():
    model = small_mlm().eval()
    tokens = torch.randint(FIRST, V, (2, 10))
    padded = torch.cat([tokens, torch.zeros(2, 5, dtype=torch.long)], dim=1)
    assert torch.allclose(model(tokens), model(padded)[:, :10], atol=1e-5)
    # each sequence repeats one token: a masked token is any other token of its row
    rows = torch.randint(FIRST, V, (512, 1)).expand(512, 16).clone()
    history = train_mlm(model, rows, MASK, FIRST, steps=200, batch_size=32, lr=3e-3, warmup=10)
    assert sum(history["accuracy"][-10:]) / 10 > 0.7  # the unigram guess: 1 in 46
    assert mlm_accuracy(model, rows[:64], MASK, FIRST) > 0.7


def test_the_classifier_takes_the_pretrained_encoder():
    mlm = small_mlm()
    classifier = classifier_from_mlm(mlm, num_classes=3)
    assert isinstance(classifier, SequenceClassifier) and classifier.pooling == "mean"
    for name, value in mlm.state_dict().items():
        if not name.startswith("head."):
            assert torch.equal(classifier.state_dict()[name], value), name
    tokens = torch.randint(FIRST, V, (2, 7))
    h = mlm.encode(tokens)  # the mean of the pre-trained outputs, through the new head
    assert torch.allclose(classifier.eval()(tokens), classifier.head(h.mean(dim=1)), atol=1e-5)


def test_a_classifier_may_read_past_the_mlms_positions_which_are_the_papers_sinusoids():
    mlm = small_mlm()  # max_len 32
    short, longer = classifier_from_mlm(mlm, max_len=32), classifier_from_mlm(mlm, max_len=80)
    longer.head.load_state_dict(short.head.state_dict())
    tokens = torch.randint(FIRST, V, (2, 32))
    assert torch.allclose(short.eval()(tokens), longer.eval()(tokens), atol=1e-6)  # same first positions
    # rows 32..79 are new, and follow the paper's formula: PE(pos, 2i) = sin(pos / 10000^(2i/d))
    table, d = longer.positional_encoding.table.reshape(80, -1), 16
    pos, i = torch.arange(80.0)[:, None], torch.arange(0, d, 2.0)
    assert torch.allclose(table[:, 0::2], torch.sin(pos / 10000 ** (i / d)), atol=1e-5)
    assert torch.allclose(table[:, 1::2], torch.cos(pos / 10000 ** (i / d)), atol=1e-5)
    assert longer.eval()(torch.randint(FIRST, V, (2, 80))).shape == (2, 2)
    with pytest.raises(ValueError, match="max_len"):
        short(torch.randint(FIRST, V, (1, 33)))


def test_token_windows_and_first_tokens():
    from tokenizers import Tokenizer, models, pre_tokenizers

    tokenizer = Tokenizer(models.WordLevel({"<pad>": 0, "a": 1, "b": 2, "<unk>": 3}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    texts = ["a b " * 10, "b\n\na", "a " * 3]
    windows = token_windows(texts, tokenizer, length=8, min_length=3)
    assert windows.shape == (3 + 1, 8)  # 20 tokens -> 8, 8, 4; "b a" too short; "a a a" -> 3
    assert windows[2].tolist() == [1, 2, 1, 2, 0, 0, 0, 0] and windows[3].tolist() == [1, 1, 1, 0, 0, 0, 0, 0]
    assert first_tokens(texts, tokenizer, 4).tolist() == [[1, 2, 1, 2], [2, 1, 0, 0], [1, 1, 1, 0]]


@pytest.mark.slow  # the committed model over the validation emails (15 s on the busy 2-core machine)
def test_the_committed_model_reproduces_its_figures(email_splits):

    folder = ROOT / "models" / "spam-mlm"
    recorded = json.loads((folder / "results.json").read_text())
    model, tokenizer = load_mlm(folder)
    mask_id = tokenizer.token_to_id(MASK_TOKEN)
    valid = [mail.text for mail in email_splits["valid"]]
    windows = token_windows(valid, tokenizer, model.settings["max_len"])
    assert len(windows) == recorded["windows"]["valid"]
    assert abs(mlm_accuracy(model, windows, mask_id, FIRST) - recorded["valid_mlm_accuracy"]) < 1e-3
    assert recorded["valid_mlm_accuracy"] > 3 * recorded["valid_unigram_accuracy"]


@pytest.mark.slow  # the longer run's model over the validation emails and captions
def test_the_longer_run_reproduces_its_figures(email_splits):

    folder = ROOT / "models" / "text-mlm"
    recorded = json.loads((folder / "results.json").read_text())
    model, tokenizer = load_mlm(folder)
    mask_id = tokenizer.token_to_id(MASK_TOKEN)
    emails = token_windows([m.text for m in email_splits["valid"]], tokenizer, 64)
    captions = token_windows(caption_texts("val"), tokenizer, 64)
    assert (len(emails), len(captions)) == (recorded["windows"]["valid"], recorded["caption_windows"]["valid"])
    assert abs(mlm_accuracy(model, emails, mask_id, FIRST) - recorded["valid_mlm_accuracy"]) < 1e-3
    assert abs(mlm_accuracy(model, captions, mask_id, FIRST) - recorded["valid_caption_accuracy"]) < 1e-3
    # the curve ends at the recorded figures, and the emails' accuracy is past the 1,500-step model's
    assert recorded["curve"]["step"][-1] == recorded["steps"]
    assert recorded["curve"]["valid_emails"][-1] == recorded["valid_mlm_accuracy"]
    short = json.loads((ROOT / "models" / "spam-mlm" / "results.json").read_text())
    assert recorded["valid_mlm_accuracy"] > short["valid_mlm_accuracy"] + 0.02
    assert recorded["valid_mlm_accuracy"] > 5 * recorded["valid_unigram_accuracy"]
    assert recorded["curve"]["train_loss"][-1] < recorded["unigram_nats"] - 1.0
    assert recorded["valid_mlm_accuracy"] >= 0.25  # the aim: a quarter of the masked tokens


def test_the_unigram_yardsticks_against_hand_counts():
    train = torch.tensor([[5, 5, 5, 6, 0], [7, 5, 6, 0, 0]])  # 5 four times, 6 twice, 7 once; 0 is padding
    valid = torch.randint(FIRST, 10, (200, 20))
    unigram, accuracy = unigram_guess(train, valid, MASK, FIRST, 10)
    _, targets = mask_tokens(valid, MASK, FIRST, 10, generator=torch.Generator().manual_seed(0))
    chosen = targets[targets != IGNORE_INDEX]
    assert unigram == 5 and accuracy == pytest.approx((chosen == 5).sum().item() / len(chosen))
    p = torch.tensor([4, 2, 1], dtype=torch.float64) / 7
    assert unigram_entropy(train, 10) == pytest.approx(-(p * p.log()).sum().item())
    assert unigram_entropy(torch.arange(1, 9)[None], 10) == pytest.approx(math.log(8))  # uniform over 8


def test_mlm_right_is_the_accuracy_token_by_token():
    model, windows = small_mlm().eval(), torch.randint(FIRST, V, (40, 12))
    right = mlm_right(model, windows, MASK, FIRST, batch_size=16)
    _, targets = mask_tokens(windows[:16], MASK, FIRST, V, generator=torch.Generator().manual_seed(0))
    assert right.dtype == torch.bool and len(right) > (targets != IGNORE_INDEX).sum()  # every batch's chosen tokens
    assert mlm_accuracy(model, windows, MASK, FIRST, batch_size=16) == right.sum().item() / len(right)


def test_captions_are_joined_eight_at_a_time_in_file_order():
    from transformer.tasks.multi30k import load_multi30k

    english = load_multi30k("val")[1]
    texts = caption_texts("val")
    assert CAPTIONS_PER_TEXT == 8 and len(texts) == -(-len(english) // 8)
    assert texts[0] == " ".join(english[:8]) and texts[-1] == " ".join(english[8 * (len(texts) - 1):])
    with pytest.raises(ValueError, match="split must be one of"):
        caption_texts("tset")


def test_train_mlm_hands_its_run_to_callbacks_that_measure_and_save(tmp_path):
    model, rows = small_mlm(), torch.randint(FIRST, V, (64, 16))
    measured = []

    def measure(step):
        measured.append((step, model.training))
        return {}

    history = train_mlm(model, rows, MASK, FIRST, steps=6, batch_size=8, warmup=2,
                        callbacks=[Evaluate(measure, 3), SaveCheckpoint(tmp_path / "run.pt", 3)])
    assert measured == [(3, True), (6, True)] and len(history["loss"]) == 6
    saved = load_checkpoint(tmp_path / "run.pt", kind="masked_lm")
    assert isinstance(saved, MaskedLanguageModel)
    for name, value in model.state_dict().items():
        assert torch.equal(saved.state_dict()[name], value), name


def test_the_learning_curves_claims_hold_in_its_committed_results():
    results = json.loads((ROOT / "benchmarks" / "spam_curve_results.json").read_text())
    runs = results["runs"]
    models = ("bag of words", "encoder from scratch", "pre-trained encoder", "frozen MiniLM + linear",
              "fine-tuned MiniLM")
    sizes = sorted({run["labels"] for run in runs})
    # the five models at every size, three seeds each, made by the recorded commands
    assert sizes == [32, 128, 512, results["train_emails"]] and len(runs) == 5 * 4 * 3
    assert {(run["model"], run["labels"]) for run in runs} == {(m, n) for m in models for n in sizes}
    made = [(m, n) for record in results["records"] for m in record["models"] for n in record["labels"]]
    assert sorted(made) == sorted({(m, n) for m in models for n in sizes})
    for record in results["records"]:  # each command, run again, makes its record's models and no other
        words = shlex.split(record["command"])
        after = words[words.index("--models") + 1:]
        named = after[:next((i for i, word in enumerate(after) if word.startswith("--")), len(after))]
        assert named == record["models"]

    def mean(model, size, metric):
        values = [run[metric] for run in runs if run["model"] == model and run["labels"] == size]
        assert len(values) == 3
        return sum(values) / 3

    for size in sizes[:2]:  # few labels: pre-training finds more spam than no pre-training
        assert mean(models[2], size, "spam_f1") > max(mean(m, size, "spam_f1") for m in models[:2]) + 0.05
    assert max(mean(m, sizes[-1], "accuracy") for m in models) >= 0.95
    # the frozen MiniLM with a linear head: far less spam found than the fine-tuned encoder with 32 labels, level
    # with it (within 0.05 of F1) from 128 on
    assert mean(models[2], 32, "spam_f1") > mean(models[3], 32, "spam_f1") + 0.05
    for size in sizes[1:]:
        assert abs(mean(models[2], size, "spam_f1") - mean(models[3], size, "spam_f1")) < 0.05

    def lead(size):  # the worst seed of the fine-tuned MiniLM against the best seed of any other model
        f1 = {m: [run["spam_f1"] for run in runs if run["model"] == m and run["labels"] == size] for m in models}
        return min(f1[models[4]]) - max(max(f1[m]) for m in models[:4])

    # fine-tuned end to end, MiniLM leads at every seed from 128 labels on, and not with 32
    assert all(lead(size) > 0 for size in sizes[1:]) and lead(32) < 0


@pytest.mark.slow  # reads every email of the corpus (about 10 s)
def test_the_learning_curves_figures_follow_from_its_recorded_predictions(email_splits):
    """Each run's accuracy, spam F1 and interval are computed again from its predictions and the test
    labels (F1 by the formula; the interval by a binomial's normal approximation, which the percentile
    bootstrap should match within half a point at 331 emails), and what validation chose is in range."""

    results = json.loads((ROOT / "benchmarks" / "spam_curve_results.json").read_text())
    labels = [m.label for m in email_splits["test"]]
    n = len(labels)
    for run in results["runs"]:
        guess = [int(c) for c in run["predicted"]]
        assert len(guess) == n == results["test_emails"]
        right = sum(g == t for g, t in zip(guess, labels))
        tp = sum(g == t == 1 for g, t in zip(guess, labels))
        wrong = n - right
        assert run["accuracy"] == pytest.approx(right / n, abs=1e-6)
        assert run["spam_f1"] == pytest.approx(2 * tp / (2 * tp + wrong), abs=1e-9)
        low, high = run["accuracy_interval"]
        p = right / n
        half = 1.96 * (p * (1 - p) / n) ** 0.5
        assert low <= p <= high and abs(low - (p - half)) < 0.005 and abs(high - (p + half)) < 0.005
        if "of_steps" in run:  # (e): as many emails as (b) and (c) see, to the nearest whole pass, in batches of 16
            assert 0 < run["step"] <= run["of_steps"] and run["of_steps"] % (run["labels"] // 16) == 0
            assert abs(16 * run["of_steps"] - 32 * results["steps"]) <= run["labels"] / 2
        elif "step" in run:  # (b) and (c): a validation step, at most the budget
            assert run["step"] % results["eval_every"] == 0 or run["step"] == results["steps"]
            assert 0 < run["step"] <= results["steps"]
        else:  # (a) and (d): a weight decay from the grid
            assert run["weight_decay"] in results["weight_decays"]
        assert 0.5 < run["valid_accuracy"] <= 1


@pytest.mark.slow  # MiniLM reads 363 emails (about half a minute on one thread)
def test_a_point_of_the_frozen_minilm_curve_is_reproduced(email_splits):
    """The (d) point at 32 labels, seed 0, computed again: MiniLM's embeddings of the sampled training
    emails and of every test email, and a logistic regression on them; and that regression's predictions
    against a hand-written one (plain gradient descent on the same loss) on the same fixed features."""
    from benchmarks.spam_curve import minilm_features, sample, scores
    from transformer.tasks.baselines import fit_logistic_regression

    results = json.loads((ROOT / "benchmarks" / "spam_curve_results.json").read_text())
    (record,) = [r for r in results["records"] if "frozen MiniLM + linear" in r["models"]]
    (recorded,) = [run for run in results["runs"]
                   if run["model"] == "frozen MiniLM + linear" and run["labels"] == 32 and run["seed"] == 0]
    splits = email_splits
    train_y = torch.tensor([m.label for m in splits["train"]])
    test_y = torch.tensor([m.label for m in splits["test"]])
    rows = sample(train_y, 32, 0)
    x = minilm_features([splits["train"][i].text for i in rows], record["minilm_tokens"])  # (32, 384)
    test_x = minilm_features([m.text for m in splits["test"]], record["minilm_tokens"])  # (331, 384)
    decay = recorded["weight_decay"]  # chosen on the validation emails
    head = fit_logistic_regression(x, train_y[rows], weight_decay=decay)
    with torch.no_grad():
        predicted = head(test_x).argmax(dim=-1)
    got = scores(predicted, test_y)
    assert abs(got["accuracy"] - recorded["accuracy"]) <= 1 / len(test_y) + 1e-6  # one email may flip on another CPU
    assert abs(got["spam_f1"] - recorded["spam_f1"]) < 0.05
    assert sum(str(int(v)) != c for v, c in zip(predicted, recorded["predicted"])) <= 1
    # the hand-written reference: mean cross-entropy + decay / 2 |W|^2, by gradient descent from zero
    w, b, y = torch.zeros(384, 2, dtype=torch.float64), torch.zeros(2, dtype=torch.float64), train_y[rows]
    xd, onehot = x.double(), torch.nn.functional.one_hot(y, 2).double()
    for _ in range(3000):
        p = torch.softmax(xd @ w + b, dim=-1)
        w -= 2.0 * (xd.T @ (p - onehot) / len(y) + decay * w)
        b -= 2.0 * (p - onehot).mean(dim=0)
    reference = (test_x.double() @ w + b).argmax(dim=-1)
    assert (reference == predicted).float().mean() >= 0.99


@pytest.mark.slow  # MiniLM trains 4 steps of 16 emails (seconds)
def test_the_start_of_a_fine_tuned_minilm_run_of_the_curve_is_reproduced(email_splits):
    """The (e) run at 32 labels, seed 0, started again: the same 32 emails, their first WordPieces, the same
    head and order, and its first 4 steps (fine_tune's ``stop``) give the recorded losses (the record holds
    every step's loss of the whole run)."""
    from benchmarks.spam_curve import fine_tune_minilm, sample
    from transformer.interop.bert import load_minilm
    from transformer.tasks.fine_tuning import wordpieces

    results = json.loads((ROOT / "benchmarks" / "spam_curve_results.json").read_text())
    (record,) = [r for r in results["records"] if r["models"] == ["fine-tuned MiniLM"] and 32 in r["labels"]]
    (recorded,) = [run for run in results["runs"]
                   if run["model"] == "fine-tuned MiniLM" and run["labels"] == 32 and run["seed"] == 0]
    assert len(recorded["loss"]) == recorded["of_steps"] == 300  # 150 passes of 2 steps: 4,800 emails
    splits = email_splits
    labels = torch.tensor([m.label for m in splits["train"]])
    rows = sample(labels, 32, 0)
    tokenizer = load_minilm()[1]
    tokenizer.enable_truncation(record["minilm_tokens"])
    pieces = wordpieces(tokenizer, [splits["train"][i].text for i in rows])
    checks = results["steps"] // results["eval_every"]
    _, history = fine_tune_minilm(pieces, labels[rows], ([], torch.tensor([])), 32 * results["steps"], checks,
                                  seed=0, stop=4)
    assert history["loss"] == pytest.approx(recorded["loss"][:4], rel=1e-3)
    assert history["valid_step"] == []  # a stopped run is not validated


def test_load_mlm_names_a_file_that_is_not_a_saved_model(tmp_path):
    (tmp_path / "model.pt").write_bytes(b"not a model")
    with pytest.raises(ValueError, match=r"model\.pt cannot be read as a torch checkpoint: it is not a torch"):
        load_mlm(tmp_path)


def test_settings_are_plain_values_that_a_weights_only_file_can_hold(tmp_path):
    # LayerOptions also holds builders (norm, feed_forward, self_attention): classes, which a weights-only
    # checkpoint refuses as pickled code, so the settings a checkpoint saves leave them out.
    from transformer.nn.encoder_only import MaskedLanguageModel

    mlm = MaskedLanguageModel(50, d_model=16, num_heads=2, d_ff=32, num_layers=1, max_len=8)
    assert all(isinstance(value, (bool, int, float, str)) for value in mlm.settings.values()), mlm.settings
    torch.save({"settings": mlm.settings}, tmp_path / "settings.pt")
    assert torch.load(tmp_path / "settings.pt", weights_only=True)["settings"] == mlm.settings
