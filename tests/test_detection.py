"""Detection as set prediction (chapters/detection.md): scenes, boxes, matching, set loss, detector."""

import itertools

import pytest
import torch

from transformer.nn.detector import DigitDetector
from transformer.tasks.detection import (CANVAS, DIGIT_SIZES, MAX_DIGITS, _place_squares, box_cxcywh_to_xyxy, box_iou, box_xyxy_to_cxcywh,
                                         check_boxes, coco_average_precision, detection_loss, generalized_box_iou,
                                         hungarian_match, make_digit_scenes, match_cost, non_maximum_suppression,
                                         predicted_set, set_loss, tight_box, train_detector)
from transformer.tasks.digits import load_digits


@pytest.fixture(scope="module")
def digits():
    images, labels = load_digits()
    return images[:300], labels[:300]


@pytest.fixture(scope="module")
def scenes(digits):
    return make_digit_scenes(*digits, count=200, seed=5)


# --- scenes


def test_every_box_is_the_tight_box_of_the_pixels_its_digit_covers(scenes):
    for image, classes, boxes in zip(scenes.images, scenes.classes, scenes.boxes):
        assert 1 <= len(classes) <= MAX_DIGITS and len(boxes) == len(classes)
        corners = (box_cxcywh_to_xyxy(boxes) * CANVAS).round().long()  # (k, 4) pixels, ends excluded
        assert torch.allclose(box_cxcywh_to_xyxy(boxes) * CANVAS, corners.float(), atol=1e-4)  # whole pixels
        ink = image[0] > 0
        covered = torch.zeros_like(ink)
        for x0, y0, x1, y1 in corners.tolist():
            inside = ink[y0:y1, x0:x1]
            # tight: ink on the first and last row and column of the box
            assert inside[0].any() and inside[-1].any() and inside[:, 0].any() and inside[:, -1].any()
            assert not covered[y0:y1, x0:x1].any()  # digits' boxes do not overlap
            covered[y0:y1, x0:x1] = True
        assert not (ink & ~covered).any()  # every inked pixel lies in some digit's box


def test_scenes_are_deterministic_and_seeded(digits):
    a, b = make_digit_scenes(*digits, count=20, seed=1), make_digit_scenes(*digits, count=20, seed=1)
    c = make_digit_scenes(*digits, count=20, seed=2)
    assert torch.equal(a.images, b.images) and all(torch.equal(x, y) for x, y in zip(a.boxes, b.boxes))
    assert not torch.equal(a.images, c.images)


def test_scenes_vary_in_count_and_size(scenes):
    counts = {len(c) for c in scenes.classes}
    assert counts == set(range(1, MAX_DIGITS + 1))
    heights = torch.cat(scenes.boxes)[:, 3] * CANVAS
    assert heights.min() <= 8 and heights.max() >= 11


def test_tight_box_and_bad_scene_input(digits):
    pixels = torch.zeros(5, 6)
    pixels[1, 2] = pixels[3, 4] = 0.5
    assert tight_box(pixels).tolist() == [2, 1, 5, 4]
    with pytest.raises(ValueError, match="no non-zero pixel"):
        tight_box(torch.zeros(3, 3))
    with pytest.raises(ValueError, match="shape"):
        make_digit_scenes(torch.zeros(2, 1, 16, 16), torch.tensor([1, 2]), 3, 0)
    with pytest.raises(ValueError, match="one integer digit"):
        make_digit_scenes(digits[0][:2], torch.tensor([1.0, 2.0]), 3, 0)


def test_the_default_scenes_are_those_made_before_the_crowded_options(scenes):
    # recorded from make_digit_scenes before it took digits= and overlap= (commit 41be2ad)
    assert sum(len(c) for c in scenes.classes) == 486
    assert torch.cat(scenes.classes)[:12].tolist() == [6, 8, 5, 8, 7, 3, 0, 9, 9, 7, 8, 9]
    assert (torch.cat(scenes.boxes)[:2] * CANVAS).tolist() == [[12.5, 20.5, 7.0, 7.0], [26.5, 20.5, 7.0, 9.0]]
    assert scenes.images.double().sum().item() == pytest.approx(13531.2038, abs=1e-3)


@pytest.mark.parametrize("overlap", [0.0, 0.25, 0.5])
def test_squares_share_at_most_the_allowed_overlap(overlap):
    generator, shared = torch.Generator().manual_seed(0), []
    for _ in range(30):
        squares = _place_squares(6, overlap, generator)
        assert len(squares) == 6
        for x, y, size in squares:
            assert DIGIT_SIZES[0] <= size <= DIGIT_SIZES[1] and 0 <= x <= CANVAS - size and 0 <= y <= CANVAS - size
        for (x, y, s), (u, v, r) in itertools.combinations(squares, 2):
            inter = max(0, min(x + s, u + r) - max(x, u)) * max(0, min(y + s, v + r) - max(y, v))
            assert inter <= overlap * min(s, r) ** 2
            shared.append(inter / min(s, r) ** 2)
    # the bound is reached, not merely respected: overlapping scenes do overlap
    assert max(shared) > overlap - 0.15 if overlap else max(shared) == 0


def test_crowded_scenes_hold_the_asked_number_of_digits_and_overlap(digits):
    crowded = make_digit_scenes(*digits, count=60, seed=3, digits=(5, 8), overlap=0.25)
    assert {len(c) for c in crowded.classes} == set(range(5, 9))
    overlapping = 0
    for classes, boxes in zip(crowded.classes, crowded.boxes):
        corners = box_cxcywh_to_xyxy(boxes)
        assert len(boxes) == len(classes) and bool(((corners >= 0) & (corners <= 1)).all())
        overlapping += int((box_iou(corners, corners).triu(diagonal=1) > 0).sum())
    assert overlapping > 60  # many pairs of digits share pixels
    # the ink of a digit under another stays visible: the darker of the two
    assert float(crowded.images.max()) <= 1.0
    exact = make_digit_scenes(*digits, count=30, seed=3, digits=(3, 3))
    assert all(len(c) == 3 for c in exact.classes)


@pytest.mark.parametrize("arguments, error, message", [
    (dict(digits=(0, 4)), ValueError, r"digits must be \(fewest, most\).*got \(0, 4\)"),
    (dict(digits=(5, 4)), ValueError, r"digits must be .*got \(5, 4\)"),
    (dict(digits=4), ValueError, r"digits must be .*got 4"),
    (dict(digits=(1.0, 4)), ValueError, r"digits must be .*got \(1.0, 4\)"),
    (dict(overlap=1.0), ValueError, r"overlap must be a number in \[0, 1\), got 1.0"),
    (dict(overlap=-0.1), ValueError, r"overlap must be .*got -0.1"),
    (dict(overlap="0.2"), TypeError, r"overlap must be a number in \[0, 1\), got '0.2'"),
])
def test_bad_crowding_arguments_are_refused_by_name(digits, arguments, error, message):
    with pytest.raises(error, match=message):
        make_digit_scenes(*digits, count=2, seed=0, **arguments)


# --- boxes


def _torchvision_giou(a, b):
    """torchvision.ops.generalized_box_iou's formula, written out pair by pair in plain Python."""
    out = torch.zeros(len(a), len(b), dtype=torch.float64)
    for i, (ax0, ay0, ax1, ay1) in enumerate(a.tolist()):
        for j, (bx0, by0, bx1, by1) in enumerate(b.tolist()):
            inter = max(0.0, min(ax1, bx1) - max(ax0, bx0)) * max(0.0, min(ay1, by1) - max(ay0, by0))
            union = (ax1 - ax0) * (ay1 - ay0) + (bx1 - bx0) * (by1 - by0) - inter
            hull = (max(ax1, bx1) - min(ax0, bx0)) * (max(ay1, by1) - min(ay0, by0))
            out[i, j] = inter / union - (hull - union) / hull
    return out


def _random_corners(n, generator):
    xy = torch.rand(n, 2, generator=generator, dtype=torch.float64) * 0.6
    return torch.cat([xy, xy + 0.05 + torch.rand(n, 2, generator=generator, dtype=torch.float64) * 0.4], dim=1)


def test_conversions_invert_each_other_and_match_hand_values():
    assert box_cxcywh_to_xyxy(torch.tensor([0.5, 0.4, 0.2, 0.6])).tolist() == pytest.approx([0.4, 0.1, 0.6, 0.7])
    boxes = _random_corners(10, torch.Generator().manual_seed(0))
    torch.testing.assert_close(box_cxcywh_to_xyxy(box_xyxy_to_cxcywh(boxes)), boxes)


def test_iou_and_giou_hand_computed():
    a = torch.tensor([[0.0, 0.0, 2.0, 2.0]])
    b = torch.tensor([[1.0, 1.0, 3.0, 3.0], [0.0, 0.0, 2.0, 2.0], [3.0, 0.0, 4.0, 1.0]])
    # overlap 1 of union 7; the same box; apart: hull 4 x 2 = 8, union 5
    assert box_iou(a, b)[0].tolist() == pytest.approx([1 / 7, 1.0, 0.0])
    assert generalized_box_iou(a, b)[0].tolist() == pytest.approx([1 / 7 - 2 / 9, 1.0, 0.0 - 3 / 8])


def test_giou_equals_torchvisions_formula_written_out():
    generator = torch.Generator().manual_seed(1)
    a, b = _random_corners(7, generator), _random_corners(5, generator)
    torch.testing.assert_close(generalized_box_iou(a, b), _torchvision_giou(a, b))
    assert (generalized_box_iou(a, b) <= box_iou(a, b)).all()


@pytest.mark.parametrize("boxes, message", [
    (torch.tensor([[0.5, 0.5, 0.4, 0.6]]), "inverted"),
    (torch.tensor([[0.1, 0.1, 0.2]]), r"\(n, 4\)"),
    (torch.tensor([[0, 0, 1, 1]]), "floating-point"),
    (torch.tensor([[0.1, float("nan"), 0.2, 0.3]]), "finite"),
])
def test_bad_boxes_are_refused(boxes, message):
    with pytest.raises(ValueError, match=message):
        box_iou(boxes, boxes)


def test_boxes_outside_the_image_are_refused_where_they_must_be_fractions():
    check_boxes("b", torch.tensor([[-0.1, 0.0, 0.5, 0.5]]))  # a prediction may reach outside
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        check_boxes("b", torch.tensor([[-0.1, 0.0, 0.5, 0.5]]), unit=True)


def test_non_maximum_suppression_keeps_the_best_of_overlapping_boxes():
    boxes = torch.tensor([[0.0, 0.0, 1.0, 1.0], [0.05, 0.0, 1.0, 1.0], [2.0, 2.0, 3.0, 3.0], [0.0, 0.0, 0.5, 1.0]])
    scores = torch.tensor([0.5, 0.9, 0.3, 0.8])
    assert non_maximum_suppression(boxes, scores, 0.5).tolist() == [1, 3, 2]
    assert non_maximum_suppression(boxes, scores, 1.0).tolist() == [1, 3, 0, 2]


# --- matching


def _brute_force(cost):
    """The least total cost of a one-to-one matching, over every choice of predictions in every order."""
    Q, k = cost.shape
    return min(sum(cost[q, j] for j, q in enumerate(rows)) for rows in itertools.permutations(range(Q), k))


@pytest.mark.parametrize("Q, k", [(1, 1), (3, 1), (3, 3), (4, 2), (5, 3), (6, 4)])
def test_hungarian_matching_is_the_least_cost_of_all_permutations(Q, k):
    generator = torch.Generator().manual_seed(10 * Q + k)
    for _ in range(10):
        cost = torch.randn(Q, k, generator=generator, dtype=torch.float64)
        rows, columns = hungarian_match(cost)
        assert len(set(rows.tolist())) == k and sorted(columns.tolist()) == list(range(k))
        assert cost[rows, columns].sum().item() == pytest.approx(_brute_force(cost).item())


def test_more_objects_than_predictions_is_refused():
    with pytest.raises(ValueError, match="3 objects but the model makes only 2 predictions"):
        hungarian_match(torch.zeros(2, 3))


def test_match_cost_is_class_l1_and_giou():
    logits = torch.log(torch.tensor([[0.7, 0.2, 0.1]]))  # one prediction, classes 0, 1 and "no object"
    box = torch.tensor([[0.5, 0.5, 0.2, 0.2]])
    target = torch.tensor([[0.6, 0.5, 0.2, 0.2]])
    giou = generalized_box_iou(box_cxcywh_to_xyxy(box), box_cxcywh_to_xyxy(target)).item()  # 1/3 - 0
    assert giou == pytest.approx(1 / 3)
    cost = match_cost(logits, box, torch.tensor([1]), target)
    assert cost.item() == pytest.approx(-0.2 + 5 * 0.1 - 2 / 3)


# --- the set loss


def _predictions(B=2, Q=5, C=3, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(B, Q, C + 1, generator=generator), torch.rand(B, Q, 4, generator=generator) * 0.4 + 0.3


def test_set_loss_ignores_the_order_of_objects_and_of_predictions():
    logits, boxes = _predictions()
    classes = [torch.tensor([0, 2]), torch.tensor([1])]
    targets = [torch.tensor([[0.3, 0.3, 0.2, 0.2], [0.7, 0.6, 0.1, 0.3]]), torch.tensor([[0.5, 0.5, 0.4, 0.4]])]
    loss, _ = set_loss(logits, boxes, classes, targets)
    again, _ = set_loss(logits, boxes, [c.flip(0) for c in classes], [t.flip(0) for t in targets])
    order = torch.tensor([3, 0, 4, 1, 2])
    shuffled, _ = set_loss(logits[:, order], boxes[:, order], classes, targets)
    torch.testing.assert_close(loss, again)
    torch.testing.assert_close(loss, shuffled)


def test_set_loss_of_a_perfect_prediction_is_the_class_loss_alone():
    classes, targets = [torch.tensor([1])], [torch.tensor([[0.5, 0.5, 0.2, 0.2]])]
    logits = torch.full((1, 3, 4), -20.0)
    logits[0, :, 3] = 20.0  # "no object" everywhere ...
    logits[0, 1] = torch.tensor([-20.0, 20.0, -20.0, -20.0])  # ... but for prediction 1: class 1
    boxes = torch.full((1, 3, 4), 0.3)
    boxes[0, 1] = targets[0][0]
    loss, parts = set_loss(logits, boxes, classes, targets)
    assert loss.item() < 1e-6 and parts["l1"].item() == 0 and parts["giou"].item() < 1e-6


def test_set_loss_weights_no_object_by_a_tenth():
    logits = torch.zeros(1, 2, 3)  # uniform over 2 classes and "no object": each log-prob -log 3
    classes, targets = [torch.tensor([0])], [torch.tensor([[0.5, 0.5, 0.2, 0.2]])]
    _, parts = set_loss(logits, torch.full((1, 2, 4), 0.5), classes, targets)
    # weighted mean: (1 * log 3 + 0.1 * log 3) / (1 + 0.1) = log 3
    assert parts["class"].item() == pytest.approx(torch.log(torch.tensor(3.0)).item())


def test_set_loss_with_an_image_without_objects():
    logits, boxes = _predictions()
    loss, parts = set_loss(logits, boxes, [torch.tensor([], dtype=torch.long), torch.tensor([2])],
                           [torch.zeros(0, 4), torch.tensor([[0.5, 0.5, 0.2, 0.2]])])
    assert loss.isfinite() and parts["l1"] > 0
    loss, parts = set_loss(logits, boxes, [torch.tensor([], dtype=torch.long)] * 2, [torch.zeros(0, 4)] * 2)
    assert loss.isfinite() and parts["l1"].item() == 0
    loss.backward() if loss.requires_grad else None


@pytest.mark.parametrize("target, message", [
    (torch.tensor([[0.95, 0.5, 0.2, 0.2]]), r"\[0, 1\]"),  # reaches past the right edge
    (torch.tensor([[0.5, 0.5, -0.2, 0.2]]), "inverted"),  # negative width
])
def test_set_loss_refuses_bad_target_boxes(target, message):
    logits, boxes = _predictions(B=1)
    with pytest.raises(ValueError, match=message):
        set_loss(logits, boxes, [torch.tensor([0])], [target])


def test_set_loss_refuses_more_objects_than_queries_and_bad_classes():
    logits, boxes = _predictions(B=1, Q=2)
    many = torch.tensor([[0.2, 0.2, 0.1, 0.1]]).repeat(3, 1)
    with pytest.raises(ValueError, match="3 objects but the model makes only 2"):
        set_loss(logits, boxes, [torch.tensor([0, 1, 2])], [many])
    with pytest.raises(ValueError, match="classes must lie in 0..2"):
        set_loss(logits, boxes, [torch.tensor([3])], [many[:1]])


# --- the detector


def test_detector_shapes_and_queries_decoded_without_order():
    torch.manual_seed(0)
    model = DigitDetector(num_queries=6, d_model=32, d_ff=64).eval()
    images = torch.rand(3, 1, 32, 32)
    logits, boxes = model(images)
    assert logits.shape == (3, 6, 11) and boxes.shape == (3, 6, 4) and ((boxes > 0) & (boxes < 1)).all()
    with torch.no_grad():
        memory = model.encode(images)
        queries = model.queries.expand(3, -1, -1)
        torch.testing.assert_close(model.decode_layers(memory)[-1], model.decoder(queries, memory))
        order = torch.tensor([5, 2, 0, 1, 4, 3])
        model.queries.copy_(model.queries[order])  # permute the queries: the outputs permute alike
        logits2, boxes2 = model(images)
    torch.testing.assert_close(logits2, logits[:, order], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(boxes2, boxes[:, order], rtol=1e-5, atol=1e-5)


def test_detection_loss_trains_one_scene(scenes):
    torch.manual_seed(0)
    model = DigitDetector(num_queries=4, d_model=32, d_ff=64, encoder_layers=1, decoder_layers=1)
    batch = (scenes.images[:4], scenes.classes[:4], scenes.boxes[:4])
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    first = None
    for _ in range(60):
        loss, _ = detection_loss(model, batch)
        first = loss.item() if first is None else first
        optimizer.zero_grad(), loss.backward(), optimizer.step()
    assert loss.item() < 0.5 * first


def _small_detector():
    torch.manual_seed(0)
    return DigitDetector(num_queries=4, d_model=16, num_heads=2, d_ff=32, encoder_layers=1, decoder_layers=1)


def test_a_killed_training_resumes_from_its_checkpoint_to_the_same_weights(scenes, tmp_path, monkeypatch):
    whole = _small_detector()
    expected = train_detector(whole, scenes, steps=6, batch_size=4, warmup=2, seed=3)
    calls = []

    def killed_after_four_steps(model, batch):
        calls.append(1)
        if len(calls) == 5:  # the fifth step: a kill after the save at step 4
            raise KeyboardInterrupt
        return detection_loss(model, batch)

    import transformer.tasks.detection as detection
    with monkeypatch.context() as patch:
        patch.setattr(detection, "detection_loss", killed_after_four_steps)
        with pytest.raises(KeyboardInterrupt):
            train_detector(_small_detector(), scenes, 6, batch_size=4, warmup=2, seed=3,
                           checkpoint=tmp_path / "run.pt", save_every=2)
    resumed = _small_detector()  # a new process: fresh weights, then the checkpoint of step 4
    history = train_detector(resumed, scenes, 6, batch_size=4, warmup=2, seed=3, checkpoint=tmp_path / "run.pt",
                             save_every=2)
    assert history["step"] == [1, 2, 3, 4, 5, 6]
    assert history["loss"] == expected["loss"]  # bit for bit: resume restores the random state too
    for name, value in whole.state_dict().items():
        assert torch.equal(resumed.state_dict()[name], value), name
    with pytest.raises(ValueError, match="cannot resume from .*run.pt: it was trained with other settings: seed=3 there, "
                                         "4 here$"):
        train_detector(_small_detector(), scenes, 6, batch_size=4, warmup=2, seed=4, checkpoint=tmp_path / "run.pt")


def _command(name):
    """models/digit-detector/NAME.py as a module, to run its main() in this process."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "models" / "digit-detector" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"detector_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("command, arguments, message", [
    ("train", ["--steps", "0"], "--steps must be a positive number, got 0"),
    ("train", ["--out", "{tmp}/file"], "--out must be a folder, got the file {tmp}/file"),
    ("evaluate", ["{tmp}"], "no checkpoint at {tmp}/model.pt"),
    ("evaluate", ["{tmp}/no-such-folder"], "no checkpoint at {tmp}/no-such-folder/model.pt"),
    ("evaluate", ["{tmp}/checkpoint"], "{tmp}/checkpoint/model.pt is a training state's (no model described) "
                                       "checkpoint, not a detector's"),
])
def test_the_detector_commands_refuse_bad_input_in_one_line(command, arguments, message, tmp_path, monkeypatch, capsys):
    (tmp_path / "file").write_text("not a folder")
    (tmp_path / "checkpoint").mkdir()
    torch.save({"model": {}, "step": 3}, tmp_path / "checkpoint" / "model.pt")  # a checkpoint, not a detector
    monkeypatch.setattr("sys.argv", [f"{command}.py", *(a.format(tmp=tmp_path) for a in arguments)])
    with pytest.raises(SystemExit) as ended:
        _command(command).main()
    assert ended.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"{command}.py: {message.format(tmp=tmp_path)}"]


# --- evaluation


def test_coco_average_precision_of_the_truth_is_one_and_of_nothing_zero(scenes):
    classes, boxes = scenes.classes[:30], scenes.boxes[:30]
    perfect = [(torch.ones(len(c)), c, b) for c, b in zip(classes, boxes)]
    assert coco_average_precision(perfect, classes, boxes) == {"AP": 1.0, "AP50": 1.0, "AP75": 1.0}
    wrong = [(torch.ones(len(c)), (c + 1) % 10, b) for c, b in zip(classes, boxes)]
    assert coco_average_precision(wrong, classes, boxes)["AP50"] == 0.0
    empty = [(torch.zeros(0), torch.zeros(0, dtype=torch.long), torch.zeros(0, 4))] * 30
    assert coco_average_precision(empty, classes, boxes)["AP"] == 0.0
    with pytest.raises(ValueError, match="one entry per image"):
        coco_average_precision(perfect[:2], classes, boxes)


def test_the_predicted_set_undoes_the_down_weighting_of_no_object():
    probs = torch.tensor([[[0.05, 0.9, 0.05], [0.3, 0.0, 0.7], [0.85, 0.0, 0.15], [0.95, 0.0, 0.05]]])  # p(none) last
    assert predicted_set(probs.log()).tolist() == [[True, False, False, True]]  # p(none) < 0.1 / 1.1
    assert predicted_set(probs.log(), no_object_weight=1.0).tolist() == [[True, False, True, True]]


@pytest.mark.slow  # the committed detector over a split
def test_the_committed_detector_reproduces_its_recorded_scores():
    """models/digit-detector/results.json, recomputed from the committed weights (a few seconds)."""
    import json
    from pathlib import Path

    folder = Path(__file__).resolve().parent.parent / "models" / "digit-detector"
    recorded = json.loads((folder / "results.json").read_text())
    measured = _command("evaluate").scores(folder)
    for key in ("AP", "AP50", "AP75", "counting"):
        assert measured[key] == pytest.approx(recorded[key], abs=0.005), key


def test_the_runs_file_holds_every_seed_on_both_paths_and_the_committed_run():
    """models/digit-detector/seeds.json, which the chapter's second row reads: seeds 0-3 x both arithmetic paths,
    the committed run among them with the scores results.json records."""
    import json
    from pathlib import Path

    folder = Path(__file__).resolve().parent.parent / "models" / "digit-detector"
    runs = json.loads((folder / "seeds.json").read_text())["runs"]
    assert sorted((run["seed"], run["path"]) for run in runs) == [(s, p) for s in range(4) for p in ("default", "native")]
    committed = [run for run in runs if run["source"] == "model.pt (committed)"]
    recorded = json.loads((folder / "results.json").read_text())
    assert len(committed) == 1 and (committed[0]["seed"], committed[0]["path"]) == (0, "native")
    assert all(committed[0][key] == recorded[key] for key in ("AP", "AP50", "AP75", "counting"))
    assert all(0 <= run[key] <= 1 for run in runs for key in ("AP", "AP50", "AP75", "counting"))
