"""Tests for transformer/nn/text_encoder.py and transformer/interop/bert.py (chapters/pretrained_encoder.md),
and for ``from_huggingface`` on a ``BertModel`` (chapters/pretrained.md).

The references are independent of the package: ``transformers``' ``BertModel`` (read from the same
folder, or built from a small configuration with random weights), sentence-transformers' pooling written
out by hand on ``BertModel``'s output, and ``BertTokenizerFast`` built from the bare vocabulary. The
real weights are all-MiniLM-L6-v2, which ``make setup`` fetches into models/minilm: without them these
tests fail, saying so, rather than skip."""

import hashlib
import os

os.environ["HF_HUB_OFFLINE"] = "1"  # nothing in these tests may reach the network

import pytest
import torch
import torch.nn.functional as F
from transformers import BertConfig, BertForSequenceClassification, BertForTokenClassification, BertModel, BertTokenizerFast

from tools import fetch_minilm
from transformer import from_huggingface
from transformer.interop.bert import (MINILM_SHA256, BertClassifier, BertTagger, bert_names, embed_sentences, load_bert, load_minilm, mean_pool,
                                      minilm_folder, text_encoder_from_bert)
from transformer.nn.text_encoder import TextEncoder
from transformer.tasks.tagging import tagging_loss
from transformer.tasks.classifier import classification_loss
from transformer.training.loop import optimizer_step
from transformer.training.schedules import make_adam

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

SENTENCES = ["A man is playing a guitar.", "Someone is strumming a guitar.", "The cat sleeps on the sofa.",
             "A kitten is napping on the couch.", "Stock prices fell sharply today.", "Hi!"]


@pytest.fixture(scope="module")
def minilm():
    """(folder, book's model, tokenizer, BertModel) for all-MiniLM-L6-v2; a failure if it is not fetched."""
    try:
        folder = minilm_folder()
    except FileNotFoundError as err:
        pytest.fail(f"{err}. The tests of the real pretrained weights need them: run `make setup`.")
    model, tokenizer = load_minilm(folder)
    return folder, model, tokenizer, BertModel.from_pretrained(folder).eval()


def padded_batch(tokenizer, sentences=SENTENCES):
    encodings = tokenizer.encode_batch(sentences)
    ids = torch.tensor([e.ids for e in encodings])  # (N, S)
    mask = torch.tensor([e.attention_mask for e in encodings])  # (N, S), 1 = token
    assert (mask == 0).any(), "the batch must hold padding"
    return ids, mask


def random_bert(dtype=torch.float32, seed=0, **overrides):
    config = dict(vocab_size=50, hidden_size=24, num_hidden_layers=2, num_attention_heads=4, intermediate_size=40,
                  max_position_embeddings=32, type_vocab_size=3)
    model = BertModel(BertConfig(**{**config, **overrides})).to(dtype)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # far from the initialisation, so that a misplaced tensor shows
        for p in model.parameters():
            p.copy_(0.3 * torch.randn(p.shape, generator=generator, dtype=dtype))
    return model.eval()


def test_the_fetched_weights_are_the_pinned_ones(minilm):
    weights = minilm[0] / "model.safetensors"
    assert fetch_minilm.sha256(weights) == hashlib.sha256(weights.read_bytes()).hexdigest() == MINILM_SHA256
    # the value the issue gives for the sentence-transformers release, typed here, not imported
    assert MINILM_SHA256 == "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"


def test_minilm_hidden_states_equal_bert_models_on_a_padded_batch(minilm):
    _, model, tokenizer, hf = minilm
    ids, mask = padded_batch(tokenizer)
    with torch.no_grad():
        reference = hf(input_ids=ids, attention_mask=mask).last_hidden_state
        hidden = model(ids, attention_mask=mask)
    assert hidden.shape == reference.shape == (len(SENTENCES), ids.shape[1], 384)
    torch.testing.assert_close(hidden, reference, atol=1e-5, rtol=1e-5)
    assert (hidden - reference)[mask == 1].abs().max() < 1e-5  # at every token, absolutely


def test_from_huggingface_on_minilm_gives_the_loaders_model(minilm):
    _, model, tokenizer, hf = minilm
    converted = from_huggingface(hf)
    assert isinstance(converted, TextEncoder) and not converted.training
    ids, mask = padded_batch(tokenizer)
    with torch.no_grad():
        assert torch.equal(converted(ids, attention_mask=mask), model(ids, attention_mask=mask))
    assert sum(p.numel() for p in model.parameters()) == 22_565_376  # 22.7 M with BERT's pooler, left out


def test_padding_changes_nothing_at_the_tokens(minilm):
    _, model, tokenizer, _ = minilm
    ids, mask = padded_batch(tokenizer)
    short = int(mask.sum(1).argmin())
    length = int(mask[short].sum())
    with torch.no_grad():
        alone = model(ids[short:short + 1, :length])
        in_batch = model(ids, attention_mask=mask)[short:short + 1, :length]
    torch.testing.assert_close(in_batch, alone, atol=1e-5, rtol=1e-5)


def test_sentence_embeddings_equal_mean_pooling_written_out_on_bert_model(minilm):
    _, model, tokenizer, hf = minilm
    ids, mask = padded_batch(tokenizer)
    with torch.no_grad():
        hidden = hf(input_ids=ids, attention_mask=mask).last_hidden_state
    by_hand = torch.stack([hidden[i, mask[i] == 1].mean(0) for i in range(len(SENTENCES))])
    by_hand = by_hand / by_hand.norm(dim=-1, keepdim=True)
    embeddings = embed_sentences(model, tokenizer, SENTENCES)
    torch.testing.assert_close(embeddings, by_hand, atol=1e-5, rtol=0)
    torch.testing.assert_close(embeddings.norm(dim=-1), torch.ones(len(SENTENCES)))


def test_paraphrases_are_nearer_than_unrelated_sentences(minilm):
    _, model, tokenizer, _ = minilm
    e = embed_sentences(model, tokenizer, SENTENCES[:5])
    similarity = e @ e.T
    assert similarity[0, 1] > 0.6 and similarity[2, 3] > 0.6
    assert max(similarity[0, 2], similarity[0, 4], similarity[2, 4], similarity[1, 3]) < 0.3


def same_head_far_from_zero(reference, book):
    """Gives transformers' classification layer random weights far from zero, so that every gradient is
    clearly not zero, and the book's head the same ones."""
    classes = reference.classifier.out_features
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        reference.classifier.weight.copy_(0.05 * torch.randn(classes, 384, generator=generator))
        reference.classifier.bias.copy_(torch.linspace(-0.3, 0.3, classes))
        book.head.load_state_dict(reference.classifier.state_dict())


@pytest.mark.slow  # a step of MiniLM here and in transformers
def test_the_first_fine_tuning_step_equals_bert_for_sequence_classifications(minilm):
    """One AdamW step of the book's ``BertClassifier`` (make_adam, optimizer_step, classification_loss, as the
    sentiment chapter fine-tunes) against ``BertForSequenceClassification`` on the same weights and head: its
    encoder, dropout and classification layer, the mean over the tokens written out in place of its [CLS]
    pooler (which the book's classifier does not use); dropout off on both (eval mode)."""
    folder, _, tokenizer, _ = minilm
    reference = BertForSequenceClassification.from_pretrained(folder, num_labels=2).eval()
    book = BertClassifier(load_minilm(folder)[0], num_classes=2).eval()
    same_head_far_from_zero(reference, book)
    ids, mask = padded_batch(tokenizer)
    labels = torch.tensor([1, 1, 0, 0, 0, 1])
    settings = dict(lr=5e-5, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01)
    names = {f"bert.{theirs}": f"encoder.{ours}" for theirs, ours in bert_names(6).items()}
    names |= {"classifier.weight": "head.weight", "classifier.bias": "head.bias"}
    before = {name: p.detach().clone() for name, p in reference.named_parameters()}

    adamw = torch.optim.AdamW(reference.parameters(), **settings)
    hidden = reference.bert(input_ids=ids, attention_mask=mask).last_hidden_state  # (N, S, 384)
    pooled = torch.stack([hidden[i, mask[i] == 1].mean(0) for i in range(len(ids))])  # (N, 384)
    expected = F.cross_entropy(reference.classifier(reference.dropout(pooled)), labels)
    expected.backward()
    expected_norm = torch.nn.utils.clip_grad_norm_(reference.parameters(), 1.0)
    adamw.step()

    lr = settings.pop("lr")
    optimizer, scheduler = make_adam(book.parameters(), lambda step: 1.0, lr, **settings)
    loss, _, grad_norm = optimizer_step(book, (ids, labels), optimizer, scheduler, classification_loss, clip=1.0)

    assert isinstance(optimizer, torch.optim.AdamW)
    assert loss == pytest.approx(expected.item(), abs=1e-5) and loss > 0.1
    assert grad_norm == pytest.approx(expected_norm.item(), rel=1e-4) and grad_norm > 1  # the clip acted
    ours = dict(book.named_parameters())
    assert set(ours) == set(names.values())
    for theirs, name in names.items():
        after = reference.get_parameter(theirs).detach()
        # the step itself, to 1/200 of the rate (an entry moves by up to about lr)
        torch.testing.assert_close(ours[name].detach() - before[theirs], after - before[theirs],
                                   atol=lr / 200, rtol=0, msg=lambda m: f"{name}: {m}")
    moved = (book.encoder.encoder.layers[0].self_attn.w_q.weight - before["bert.encoder.layer.0.attention.self.query.weight"])
    assert moved.abs().max() > lr / 2


@pytest.mark.slow  # MiniLM forward and backward here and in transformers
def test_the_tagger_and_its_gradients_equal_bert_for_token_classifications(minilm):
    """The book's ``BertTagger`` (as the entities chapter fine-tunes it, with ``tagging_loss``) against
    ``BertForTokenClassification`` on the same weights and head: the logits of every token of a padded
    batch, the loss over the labelled tokens (padding and later pieces -100, as transformers' own loss
    ignores them), and the gradient of every weight; dropout off on both (eval mode)."""
    folder, _, tokenizer, _ = minilm
    reference = BertForTokenClassification.from_pretrained(folder, num_labels=5).eval()
    book = BertTagger(load_minilm(folder)[0], num_classes=5).eval()
    same_head_far_from_zero(reference, book)
    generator = torch.Generator().manual_seed(0)
    ids, mask = padded_batch(tokenizer)
    labels = torch.randint(0, 5, ids.shape, generator=generator)
    labels[mask == 0] = -100
    labels[:, 1::3] = -100  # pieces without a label, as after a word's first
    outputs = reference(input_ids=ids, attention_mask=mask, labels=labels)
    outputs.loss.backward()

    logits = book(ids)  # (N, S, 5)
    loss, metrics = tagging_loss(book, (ids, labels))
    loss.backward()

    labelled = labels != -100
    torch.testing.assert_close(logits[mask == 1], outputs.logits[mask == 1], atol=1e-5, rtol=1e-5)
    assert loss.item() == pytest.approx(outputs.loss.item(), abs=1e-5) and loss.item() > 0.5
    right = (outputs.logits.argmax(-1) == labels)[labelled].float().mean()
    assert metrics["accuracy"].item() == pytest.approx(right.item())
    names = {f"bert.{theirs}": f"encoder.{ours}" for theirs, ours in bert_names(6).items()}
    names |= {"classifier.weight": "head.weight", "classifier.bias": "head.bias"}
    ours = dict(book.named_parameters())
    assert set(ours) == set(names.values())
    for theirs, name in names.items():
        expected = reference.get_parameter(theirs).grad
        torch.testing.assert_close(ours[name].grad, expected, atol=1e-5, rtol=1e-3, msg=lambda m: f"{name}: {m}")
    assert book.encoder.encoder.layers[0].self_attn.w_q.weight.grad.abs().max() > 1e-4


def test_the_tokenizer_gives_bert_tokenizer_fasts_ids(minilm):
    _, _, tokenizer, _ = minilm
    reference = BertTokenizerFast(vocab=tokenizer.get_vocab(), do_lower_case=True)
    texts = SENTENCES + ["Transformers' self-attention isn't recurrent!", "Café naïve RÉSUMÉ, 3.14 e-mails",
                         "unaffable antidisestablishmentarianism", "  spaces\tand\nnewlines  "]
    ours = [e.ids for e in tokenizer.encode_batch(texts)]
    assert ours == reference(texts, padding=True)["input_ids"]
    assert ours[0][0] == reference.cls_token_id and reference.sep_token_id in ours[0]


def test_the_tokenizer_cuts_at_256_tokens(minilm):
    _, model, tokenizer, _ = minilm
    (encoding,) = tokenizer.encode_batch(["word " * 400])
    assert len(encoding.ids) == 256 and encoding.ids[-1] == tokenizer.token_to_id("[SEP]")
    assert embed_sentences(model, tokenizer, ["word " * 400]).shape == (1, 384)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_small_random_bert_with_segments_and_padding(dtype):
    hf = random_bert(dtype)
    ours = from_huggingface(hf)
    assert isinstance(ours, TextEncoder) and next(ours.parameters()).dtype == dtype
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 50, (4, 12), generator=generator)
    types = torch.randint(0, 3, (4, 12), generator=generator)
    mask = torch.ones_like(ids)
    mask[1, 9:], mask[2, 3:], mask[3, 1:] = 0, 0, 0
    with torch.no_grad():
        reference = hf(input_ids=ids, attention_mask=mask, token_type_ids=types).last_hidden_state
        hidden = ours(ids, attention_mask=mask, token_type_ids=types)
        without_types = ours(ids, attention_mask=mask)
        reference_without = hf(input_ids=ids, attention_mask=mask).last_hidden_state
    tolerance = 1e-5 if dtype == torch.float32 else 1e-10
    torch.testing.assert_close(hidden, reference, atol=tolerance, rtol=tolerance)
    torch.testing.assert_close(without_types, reference_without, atol=tolerance, rtol=tolerance)
    assert mean_pool(hidden, mask).shape == (4, 24)


def test_the_mode_is_kept_and_dropout_acts_in_training():
    hf = random_bert(hidden_dropout_prob=0.5).train()
    ours = from_huggingface(hf)
    assert ours.training
    ids = torch.randint(1, 50, (2, 8))
    assert not torch.equal(ours(ids), ours(ids))


def test_the_name_table_covers_every_tensor_of_a_bert_model():
    hf = random_bert()
    names = bert_names(hf.config.num_hidden_layers)
    assert set(names) == {k for k in hf.state_dict() if not k.startswith("pooler.")}
    assert set(names.values()) == set(TextEncoder(50, 24, 4, 40, 2, max_len=32, num_token_types=3).state_dict())


@pytest.mark.parametrize("field, value", [("position_embedding_type", "relative_key"), ("is_decoder", True),
                                          ("add_cross_attention", True), ("hidden_act", "gelu_new")])
def test_a_bert_the_encoder_cannot_express_is_refused_naming_the_field(field, value):
    config = random_bert().config.to_dict() | {field: value}
    with pytest.raises(ValueError, match=f"BertConfig.{field} = {value!r} cannot be represented"):
        text_encoder_from_bert(config, random_bert().state_dict())


def test_a_state_dict_that_is_not_berts_is_refused():
    hf = random_bert()
    state = dict(hf.state_dict())
    del state["encoder.layer.1.output.dense.bias"]
    with pytest.raises(ValueError, match=r"1 tensors missing \(\['encoder.layer.1.output.dense.bias'\]\)"):
        text_encoder_from_bert(hf.config.to_dict(), state)
    state = dict(hf.state_dict()) | {"cls.predictions.bias": torch.zeros(50)}
    with pytest.raises(ValueError, match="1 unexpected"):
        text_encoder_from_bert(hf.config.to_dict(), state)
    state = dict(hf.state_dict()) | {"embeddings.word_embeddings.weight": torch.zeros(51, 24)}
    with pytest.raises(ValueError, match=r"embeddings.word_embeddings.weight: .* shape \(51, 24\), .* \(50, 24\)"):
        text_encoder_from_bert(hf.config.to_dict(), state)


def test_the_encoders_inputs_are_checked():
    model = TextEncoder(50, 24, 4, 40, 1, max_len=16, num_token_types=0, embedding_norm=False)
    ids = torch.randint(0, 50, (2, 5))
    assert model(ids).shape == (2, 5, 24) and model.embed_norm is None
    with pytest.raises(ValueError, match="no token types"):
        model(ids, token_type_ids=torch.zeros_like(ids))
    with pytest.raises(ValueError, match="attention_mask must have the shape of input_ids"):
        model(ids, attention_mask=torch.ones(2, 4))
    with pytest.raises(ValueError, match="more than the model's max_len=16"):
        model(torch.zeros(1, 17, dtype=torch.long))
    with pytest.raises(ValueError, match="token_type_ids must lie in"):
        TextEncoder(50, 24, 4, 40, 1, max_len=16)(ids, token_type_ids=torch.full_like(ids, 2))
    with pytest.raises(ValueError, match="eps"):
        TextEncoder(50, 24, 4, 40, 1, norm_eps=0.0)
    assert {m.eps for m in TextEncoder(50, 24, 4, 40, 2).modules() if hasattr(m, "eps")} == {1e-12}


def test_a_missing_model_says_to_run_make_setup(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no book above: models/minilm is looked for here
    with pytest.raises(FileNotFoundError, match="run `make setup`"):
        minilm_folder()


def test_other_weights_in_the_folder_are_refused(minilm, tmp_path):
    folder = minilm[0]
    for name in ("config.json", "tokenizer.json"):
        (tmp_path / name).symlink_to(folder / name)
    (tmp_path / "model.safetensors").write_bytes(b"not the weights")
    with pytest.raises(ValueError, match="is not all-MiniLM-L6-v2's"):
        load_minilm(tmp_path)
    with pytest.raises(ValueError, match="model_type must be 'bert'"):
        (tmp_path / "config.json").unlink()
        (tmp_path / "config.json").write_text('{"model_type": "gpt2"}')
        load_bert(tmp_path)
