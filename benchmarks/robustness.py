"""Every claim the book makes about a trained model, rerun over seeds and CPU arithmetic paths.

A training run is deterministic on one machine but not across machines: another CPU picks other
kernels (AVX-512 or AVX2, other MKL code paths), rounds differently, and a long run ends somewhere
else. A number the book asserts about a trained model must therefore hold for the whole spread of
runs, not for the one trajectory of the machine the book was built on.

Each chapter that trains defines its seed in one cell tagged ``parameters`` (``SEED = 0``). This
script executes the chapter itself, as a notebook, once per seed and arithmetic path, with that cell
replaced (``SEED = k``), and reads back the numbers the chapter glued (``myst_nb.glue``). Nothing
about the runs is copied here: the chapter is the experiment. For each claim below it prints the
threshold and the min / median / max over all runs, and for each chapter how many runs had a
failing cell (an ``assert`` that did not hold, say).

Arithmetic paths:
    native   torch's kernels for this CPU (AVX2 or AVX-512 on x86-64)
    default  ``ATEN_CPU_CAPABILITY=default``: torch's plain, non-vectorised kernels

    make robustness                                   # every chapter, seeds 0-7, both paths
    .venv/bin/python -m benchmarks.robustness --chapters training generation --seeds 0 1 --jobs 2
    .venv/bin/python -m benchmarks.robustness --table _build/robustness/results.json   # print again

Runs go two at a time (``--jobs``), each in its own kernel on one thread (``OMP_NUM_THREADS=1``). It is
a measurement, not a test: it exits 1 when a claim's worst case misses its threshold or a run has a
failing cell, and says which.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PATHS = {"native": {}, "default": {"ATEN_CPU_CAPABILITY": "default"}}
OPERATORS = {">": float.__gt__, ">=": float.__ge__, "<": float.__lt__, "<=": float.__le__}


@dataclass(frozen=True)
class Claim:
    """One asserted number: ``glued op threshold`` must hold in every run of ``chapter``."""

    chapter: str  # the chapter's file name, "training" (chapters/training.md)
    name: str  # the glue name the chapter records the number under
    op: str  # one of OPERATORS
    threshold: float
    text: str  # what the claim says, for the table

    def holds(self, value: float) -> bool:
        return OPERATORS[self.op](float(value), float(self.threshold))


# The chapters' asserts about trained models, each as the number it tests. Relations between two
# measured numbers (a < b) are glued as one number (b - a, or a / b) so that each row has a margin.
CLAIMS = [
    Claim("multihead_attention", "mh_two_worse", ">", 0.95, "two lookups: two heads, worse of the two accuracies"),
    Claim("multihead_attention", "mh_one_worse", "<", 0.6, "two lookups: one head, worse of the two accuracies"),
    Claim("multihead_attention", "mh_two_found", ">", 0.8, "two lookups: each asked position's best head weight"),
    Claim("add_and_norm", "warmup_stalled", ">", 0.5, "post-LN, constant peak rate: final loss / var(y)"),
    Claim("add_and_norm", "warmup_worst_trained", "<", 0.1, "the four other settings: worst final loss / stalled"),
    Claim("training_run", "test_exact_match", ">=", 0.98, "number words: exact match, 5,000 test numbers"),
    Claim("training_run", "tf_lag_100", ">", 0.2, "number words, step 100: token accuracy above exact match"),
    Claim("training_run", "short_error_excess", ">", 0.0, "number words: short numbers' error rate above six digits'"),
    Claim("training_run", "tf_underconfidence", ">", 0.05, "number words: token accuracy above mean confidence"),
    Claim("training_run", "short_recipe_lead", ">", 0.1, "number words below 1,000: exact match drawn length first above uniformly"),
    Claim("training_run", "length_test_exact_match", ">=", 0.98, "number words drawn length first: exact match, 5,000 test numbers"),
    Claim("training_run", "length_short_exact_match", ">=", 0.95, "number words drawn length first: 200 held-out numbers below 1,000"),
    Claim("generation", "gen_close_runner_up", "<", 0.05, "share of digits whose runner-up is above 0.1"),
    Claim("generation", "gen_last_layer_in_order", ">", 0.8, "last layer: steps that do not go back"),
    Claim("generation", "gen_last_layer_sharper", ">", 0.0, "last layer sharper than the first (weight)"),
    Claim("generation", "gen_cold_same_as_greedy", ">=", 0.99, "sampling at tau = 0.05: same as greedy"),
    Claim("generation", "gen_sampled_exact", ">", 0.35, "sampling at tau = 1: exact match, lower bound"),
    Claim("generation", "gen_sampled_exact", "<", 0.7, "sampling at tau = 1: exact match, upper bound"),
    Claim("generation", "gen_sampling_cost", ">", 0.2, "exact match lost at tau = 1 against tau = 0.05"),
    Claim("encoder_only", "brackets_test_accuracy", ">", 90, "brackets: test accuracy, 2,000 distinct (%)"),
    Claim("encoder_only", "brackets_train_test_gap", "<", 0.05, "brackets: |test - training accuracy|"),
    Claim("encoder_only", "brackets_min_seen", ">", 85, "brackets: worst trained length, distinct (%)"),
    Claim("encoder_only", "brackets_long_drop", ">", 0.0, "brackets: length 36 below trained - 0.15 (margin)"),
    Claim("encoder_only", "brackets_gram_margin", ">", 0.0, "brackets: windows between counts and model (margin)"),
    Claim("tagging", "tag_capitalised_margin", ">", 0.3, "tagging: Capitalised F1 above the best baseline's"),
    Claim("tagging", "tag_period_margin", ">", 0.3, "tagging: period F1 above the best baseline's"),
    Claim("tagging", "tag_comma_margin", ">", 0.1, "tagging: comma F1 (bar from validation) above the baselines'"),
    Claim("tagging", "tag_bar_gain", ">", 0.05, "tagging: comma F1, bar from validation, above the argmax's"),
    Claim("tagging", "tag_every_label_margin", ">", 0.0, "tagging: every label's F1 above both baselines' (margin)"),
    Claim("decoder_only", "lm_gain_nats", ">", 0.5, "characters: held-out loss below the unigram (nats)"),
    Claim("decoder_only", "lm_valid_rise", "<", 0.01, "characters: largest rise between validations"),
    Claim("decoder_only", "lm_context_steps", ">", 0.0, "characters: loss falls from 0 to 1-3 to 4-15"),
    Claim("decoder_only", "lm_context_first", ">", 0.0, "characters: first characters of context worth most"),
    Claim("sampling", "lm_repeat_share", ">", 0.4, "characters: greedy continuations that loop"),
    Claim("sampling", "lm_speaker_share", ">", 0.05, "characters: samples that start a new speaker"),
    Claim("sampling", "lm_best_tau", ">", 0.7, "characters: best temperature, lower bound"),
    Claim("sampling", "lm_best_tau", "<", 1.4, "characters: best temperature, upper bound"),
    Claim("sampling", "lm_nucleus_one", ">", 0.05, "characters: positions whose nucleus (p = 0.9) is one character"),
    Claim("sampling", "lm_nucleus_above_k", ">", 0.25, "characters: positions whose nucleus holds more than 5"),
    Claim("sampling", "lm_nucleus_cold_smaller", ">", 0.5, "characters: positions whose nucleus shrinks at tau = 0.5"),
    Claim("decoder_only", "lm_bigram_margin", ">", 0.0, "characters: position 0 near the bigram (margin)"),
    Claim("decoder_only", "lm_counts_lead", ">", 0.02, "characters: best k-gram counts ahead at 17-64 (bits)"),
    Claim("modern_decoder", "smollm2_loop_margin", ">", 0.05, "SmolLM2: greedy's repeated 4-grams above top-p 0.9's"),
    Claim("modern_decoder", "smollm2_nearer_real", ">", 0.0, "SmolLM2: top-p 0.9 nearer real text's repeats (margin)"),
    Claim("modern_decoder", "smollm2_char_margin", ">", 0.5, "SmolLM2: bits per character below the char model's"),
    Claim("train_short_test_long", "positions_relative_ahead", ">", 0.0, "positions: a relative scheme best on 0-31"),
    Claim("train_short_test_long", "positions_relative_ratio", "<", 1.05, "positions: relative, loss 64-127 / loss 0-31"),
    Claim("train_short_test_long", "positions_relative_steadiest", ">", 0.0, "positions: relative's ratio the lowest"),
    Claim("train_short_test_long", "positions_sinusoidal_jump", ">", 0.2, "positions: sinusoidal's jump at 32 (nats)"),
    Claim("train_short_test_long", "positions_learned_beats_sinusoidal", ">", 0.0, "positions: learned below sinusoidal, 64-127"),
    Claim("train_short_test_long", "positions_rotary_later", ">", 0.0, "positions: rotary below sinusoidal on 32-63"),
    Claim("train_short_test_long", "positions_rotary_behind", ">", 0.0, "positions: rotary above learned, relative on 64-127"),
    Claim("train_short_test_long", "positions_alibi_ratio", "<", 1.05, "positions: ALiBi, loss 64-127 / loss 0-31"),
    Claim("train_short_test_long", "positions_alibi_ahead_long", ">", 0.1, "positions: ALiBi below sinusoidal, learned, rotary on 64-127"),
    Claim("train_short_test_long", "positions_alibi_behind_relative", ">", 0.0, "positions: relative below ALiBi on every range"),
    Claim("train_short_test_long", "positions_alibi_slow_start", ">", 0.05, "positions: ALiBi above rotary, relative on 0-31"),
    Claim("train_short_test_long", "positions_wide_k_worse", ">", 0.02, "positions: relative k = 64 above k = 16 on 64-127"),
    Claim("train_short_test_long", "positions_wide_k_same", "<", 0.1, "positions: relative k = 64 within 0.1 of k = 16 on 0-31"),
    Claim("train_short_test_long", "long_repeat_below_play", ">", 0.01, "400 characters: samples' repeat rate below the play's"),
    Claim("train_short_test_long", "long_repeat_far_below_play", ">", 0.02, "400 characters: the same on characters 300-400"),
    Claim("train_short_test_long", "long_real_words_below_play", ">", 0.03, "400 characters: samples' real-word rate below the play's"),
    Claim("train_short_test_long", "long_samples_real_words_0_400", ">", 0.6, "400 characters: samples' real-word rate"),
    Claim("train_short_test_long", "long_samples_real_words_300_400", ">", 0.6, "400 characters: samples' real-word rate on 300-400"),
    Claim("train_short_test_long", "long_real_words_drop", "<", 0.12, "400 characters: real-word rate lost from 0-100 to 300-400"),
    Claim("vision", "vit_all_above", ">", 0.0, "digits: every model above 90% (margin)"),
    Claim("vision", "vit_cnn_ahead", ">", 0.0, "digits: CNN above both ViTs + 0.5 points (margin)"),
    Claim("vision", "vit_learned_ahead", ">", 0.0, "digits: learned positions above relative + 0.5 (margin)"),
    Claim("vision", "vit_learned_near_linear", ">", 0.0, "digits: learned ViT within 1.5 points of linear (margin)"),
    Claim("vision", "vit_layout_learned", ">", -0.5, "digits: learned positions, similarity-distance corr."),
    Claim("vision", "vit_local_learned", ">", 1.0, "digits: learned, layer 1 weight near / far"),
    Claim("vision", "vit_local_relative", ">", 0.8, "digits: relative, layer 1 weight near / far, lower"),
    Claim("vision", "vit_local_relative", "<", 1.4, "digits: relative, layer 1 weight near / far, upper"),
    Claim("vision", "vit_blank_spread_learned", ">", 0.01, "digits: learned, class token weighs blank patches apart"),
    Claim("vision", "vit_blank_spread_relative", "<", 1e-4, "digits: relative, blank patches weighed alike"),
    Claim("sentiment", "sentiment_below_published", ">", 0.0, "reviews: each interval but fine-tuned MiniLM's below 79.4"),
    Claim("sentiment", "sentiment_tuned_lead", ">", 0.0, "reviews: fine-tuned MiniLM above frozen MiniLM + 1 (margin)"),
    Claim("sentiment", "sentiment_tuned_small_lead", ">", 0.0, "reviews: fine-tuned MiniLM above bag of words, 2,000, + 4"),
    Claim("sentiment", "sentiment_tuned_below_cnn", ">", 0.0, "reviews: fine-tuned MiniLM's interval below Kim's 81.5"),
    Claim("sentiment", "sentiment_frozen_lead", ">", 0.0, "reviews: frozen MiniLM above bag of words, 2,000 labels, + 2"),
    Claim("sentiment", "sentiment_bag_lead", ">", 1.0, "reviews: bag of words above the book's encoder (points)"),
    Claim("sentiment", "sentiment_bag_lead", "<", 8.0, "reviews: bag of words above the book's encoder, upper"),
    Claim("sentiment", "sentiment_head_gap", "<", 1.5, "reviews: tuned head within 1.5 points of the raw one"),
    # SmolLM2 zero-shot: its scores are committed (benchmarks/sentiment_zero_shot_results.json), the same
    # at every seed and path; the trained models it is compared with are not
    Claim("sentiment", "zero_shot_positive_margin", ">", 0.0, "reviews: SmolLM2 zero-shot, s > 0 on over 75% of test"),
    Claim("sentiment", "zero_shot_unsure_margin", ">", 0.0, "reviews: SmolLM2, |s| > 2 on under 5% of test"),
    Claim("sentiment", "zero_shot_below_trained", ">", 0.0, "reviews: SmolLM2, s > 0, below every trained model - 2"),
    Claim("sentiment", "zero_shot_threshold_gain", ">", 0.0, "reviews: SmolLM2, threshold from valid, over 8 points"),
    Claim("sentiment", "zero_shot_above_chance", ">", 0.0, "reviews: SmolLM2, s > t, interval above 65%"),
    Claim("sentiment", "zero_shot_small_lead", ">", 0.0, "reviews: SmolLM2, s > t, above bag of words, 2,000, + 2"),
    Claim("sentiment", "zero_shot_below_published", ">", 0.0, "reviews: SmolLM2, s > t, interval below 79.4"),
    Claim("entities", "entities_minilm_lead", ">", 0.0, "tweets: frozen MiniLM's head above the gazetteer, + half-width"),
    Claim("entities", "entities_gazetteer_lead", ">", 0.0, "tweets: gazetteer above the book's encoder (F1 points)"),
    Claim("entities", "entities_tuned_lead", ">", 0.0, "tweets: fine-tuned MiniLM above frozen, paired interval's low end"),
    Claim("entities", "entities_tuned_holds_published", ">", 0.0, "tweets: fine-tuned MiniLM's interval holds WNUT 2016's ~52"),
    Claim("entities", "entities_below_published", ">", 0.0, "tweets: every other model's interval below WNUT 2016's ~52"),
    Claim("captioning", "cap_test_exact", ">", 0.9, "captions: exact match, held-out handwriting (greedy)"),
    Claim("captioning", "cap_comp_exact", ">", 0.85, "captions: exact match, held-out wordings (greedy)"),
    Claim("captioning", "cap_blind_exact", "<", 0.05, "captions: text-only baseline, exact match"),
    Claim("captioning", "cap_vs_blind", ">", 0.8, "captions: exact match above the text-only baseline"),
    Claim("captioning", "cap_vs_pipeline", ">", 0.0, "captions: exact match above the pipeline baseline"),
    Claim("captioning", "cap_attn_ratio", ">", 1.5, "captions: named digit / other digit, attention mass"),
    Claim("captioning", "cap_comp_worst_wording", ">", 0.5, "captions: exact match, hardest held-out wording"),
    Claim("drawing", "draw_judged", ">", 0.75, "drawings at tau 1 judged as the prompted digit"),
    Claim("drawing", "draw_judged_cold", ">", 0.85, "drawings at tau 0.8 judged as the prompted digit"),
    Claim("drawing", "draw_random", "<", 0.25, "drawings judged as a random prompt word"),
    Claim("drawing", "draw_greedy_margin", ">", 0.0, "greedy drawing likelier than the median sample (nats)"),
    Claim("drawing", "draw_held_margin", ">", 0.3, "drawer below the per-place baseline on held-out digits (bits per pixel)"),
    Claim("detection", "det_short_iou", ">", 0.35, "detection, build run: median IoU of each digit's matched box"),
    Claim("detection", "det_detr_ap50", ">", 0.5, "detection, committed DETR: AP@0.5 (pycocotools)"),
    Claim("detection", "det_detr_ap", ">", 0.3, "detection, committed DETR: AP@[.5:.95] (pycocotools)"),
    Claim("detection", "det_runs_median_lead", ">", 0.1, "detection: DETR's median run above the sliding window, AP@[.5:.95]"),
    Claim("detection", "det_runs_median_lead_50", "<", 0.03, "detection: DETR's median run does not lead the window at AP@0.5"),
    Claim("detection", "det_runs_median_lead_50", ">", -0.1, "detection: nor trails it by a tenth at AP@0.5"),
    Claim("detection", "det_runs_ink_lead", ">", 0.05, "detection: the ink's tight boxes above DETR's best run, AP@[.5:.95]"),
    Claim("detection", "det_runs_count_lead", ">", 1.0, "detection: DETR's worst run's counting above both windows' (points)"),
    Claim("detection", "det_query_spread", "<", 0.8, "detection: a query's box centres' spread / all queries'"),
    Claim("detection", "det_attn_ratio", ">", 2.0, "detection: attention on the matched digit's patches / uniform"),
    Claim("detection", "det_crowd_window_lead_50", ">", 0.08, "detection, 5-8 digits: the window's AP@0.5 above DETR's"),
    Claim("detection", "det_overlap_detr_lead", ">", 0.05, "detection, overlapping digits: DETR's AP@[.5:.95] above the window's"),
    Claim("detection", "det_crowd_ink_lead", ">", 0.04, "detection: the ink's tight box above DETR, AP@[.5:.95], least over 4 kinds of scene"),
    Claim("detection", "det_nms_ap_change", "<", 0.03, "detection: largest change of DETR's AP@[.5:.95] by NMS on its output"),
    Claim("detection", "det_crowd_nms_count_loss", ">", 1.0, "detection, 5-8 digits: counting points NMS costs DETR"),
    Claim("translation", "tr_live_first_loss", ">", 8.5, "Multi30k live run: first loss (a uniform guess: ln 8000 = 8.99)"),
    Claim("translation", "tr_live_last_loss", "<", 7.0, "Multi30k live run (100 steps): mean loss of the last 10 steps"),
    Claim("translation", "tr_test_bleu", ">=", 36.0, "committed model: test2016 BLEU, beam 4, on this CPU"),
    Claim("why_dot_product", "wdp_time_ratio", ">", 1.0, "additive / dot-product time, one thread, fastest size"),
    Claim("why_dot_product", "wdp_memory_ratio", ">", 10.0, "additive / dot-product bytes kept for backward, n = 256"),
    Claim("why_dot_product", "wdp_small_unscaled_vs_scaled", ">", 0.85, "lookup, d_k = 8: unscaled / scaled mean loss, lower"),
    Claim("why_dot_product", "wdp_small_unscaled_vs_scaled", "<", 1.15, "lookup, d_k = 8: unscaled / scaled mean loss, upper"),
    Claim("why_dot_product", "wdp_small_additive_vs_dot", ">", 1.3, "lookup, d_k = 8: additive / unscaled dot mean loss"),
    Claim("why_dot_product", "wdp_small_accuracy_gap", ">", 0.0, "lookup, d_k = 8: dot minus additive held-out accuracy"),
    Claim("why_dot_product", "wdp_large_unscaled_vs_additive", ">", 1.05, "lookup, d_k = 1024: unscaled dot / additive mean loss"),
    Claim("why_dot_product", "wdp_large_unscaled_vs_scaled", ">", 1.5, "lookup, d_k = 1024: unscaled / scaled mean loss"),
    Claim("why_dot_product", "wdp_large_additive_vs_scaled", ">", 1.2, "lookup, d_k = 1024: additive / scaled dot mean loss"),
    Claim("why_dot_product", "wdp_worst_scaled_accuracy", ">", 0.95, "lookup: scaled dot, worst held-out accuracy"),
    Claim("model", "mask_loss_forgotten", "<", 0.05, "reversal, causal mask forgotten: teacher-forced loss"),
    Claim("model", "mask_exact_forgotten", "<", 0.05, "reversal, causal mask forgotten: greedy exact match"),
    Claim("model", "mask_loss_kept", "<", 0.1, "reversal, causal mask kept: teacher-forced loss"),
    Claim("model", "mask_exact_kept", ">", 0.9, "reversal, causal mask kept: greedy exact match"),
    Claim("translation", "tr_beam_same", ">", 45, "committed model: test sentences beam 4 = greedy (%)"),
    Claim("translation", "tr_beam_p", ">", 0.05, "committed model: beam 4 against greedy, paired bootstrap p"),
    Claim("pretraining", "spam_header_accuracy", ">", 99, "email: bag of words on the headers, test accuracy (%)"),
    Claim("pretraining", "spam_bow_accuracy", ">", 95, "email: bag of words on subject and body, test accuracy (%)"),
    Claim("pretraining", "spam_header_gap", ">", 0.0, "email: headers' accuracy above subject and body's (points)"),
    Claim("pretraining", "mlm_loss_drop", ">", 1.0, "email MLM, short run: loss fall, first to last 20 steps (nats)"),
    Claim("pretraining", "mlm_committed_gap", "<", 1e-3, "email MLM, committed: |accuracy - recorded|"),
    Claim("pretraining", "mlm_committed_ratio", ">", 3.0, "email MLM, committed: accuracy / unigram baseline's"),
    Claim("pretraining", "mlm_long_gap", "<", 1e-3, "text MLM, longer run: |accuracy - recorded|, emails and captions"),
    Claim("pretraining", "mlm_long_accuracy", ">", 25, "text MLM, longer run: held-out email tokens filled in (%)"),
    Claim("pretraining", "mlm_long_margin", ">", 1.5, "text MLM: interval's low end above the 1,500-step model (points)"),
    Claim("classify_command", "cc_short_run_accuracy", ">", 0.88, "spam command, 100 steps: test accuracy"),
    Claim("classify_command", "cc_committed_accuracy", ">=", 0.95, "committed spam classifier: test accuracy"),
    Claim("classify_command", "cc_committed_gap", "<", 1e-9, "committed spam classifier: |accuracy - recorded|"),
    Claim("classify_command", "curve_f1_margin_32", ">", 0.05, "spam curve, 32 labels: pre-trained F1 above (a), (b)"),
    Claim("classify_command", "curve_f1_margin_128", ">", 0.05, "spam curve, 128 labels: pre-trained F1 above (a), (b)"),
    Claim("classify_command", "curve_best_accuracy", ">=", 95, "spam curve, all labels: best mean accuracy (%)"),
    Claim("classify_command", "curve_minilm_behind_32", ">", 0.05, "spam curve, 32 labels: (c) F1 above frozen MiniLM's"),
    Claim("classify_command", "curve_minilm_gap", "<", 0.05, "spam curve, 128 labels on: (c), (d) F1 within 0.05"),
    Claim("classify_command", "curve_tuned_lead", ">", 0, "spam curve, 128 labels on: fine-tuned MiniLM's worst F1 above the others' best"),
    Claim("classify_command", "curve_lead_32_low", ">", 0, "spam curve, 32 labels: (c)'s F1 lead, low end of its 95% interval over test sets"),
    Claim("classify_command", "curve_lead_128_low", "<", 0, "spam curve, 128 labels: the same interval's low end (it holds 0)"),
    Claim("classify_command", "curve_lead_128_high", ">", 0, "spam curve, 128 labels: the same interval's high end"),
    Claim("classify_command", "curve_near_max", "<", 0.8, "spam test emails: highest Jaccard with a training email"),
    Claim("classify_command", "curve_near_largest_drop", "<", 1.5, "spam curve, all labels: largest accuracy drop without near twins (points)"),
]


def chapter_path(name: str) -> Path:
    """``chapters/<name>.md``, refused when there is no such chapter."""
    path = ROOT / "chapters" / f"{name}.md"
    if not path.is_file():
        raise ValueError(f"no chapter {name!r}: {path} does not exist")
    return path


def run_one(name: str, seed: int, path_name: str, timeout: int) -> dict:
    """Execute one chapter with ``SEED = seed``; return its glued numbers and failing cells."""
    import nbclient  # noqa: PLC0415 (only in the worker: the parent needs no Jupyter)

    from tools.chapters import read_chapter  # noqa: PLC0415

    nb = read_chapter(chapter_path(name))
    cells = [cell for cell in nb.cells if "parameters" in cell.metadata.get("tags", [])]
    if len(cells) != 1:
        raise SystemExit(f"chapter {name} has {len(cells)} cells tagged 'parameters', expected 1")
    cells[0].source = f"SEED = {seed}"
    start = time.perf_counter()
    client = nbclient.NotebookClient(nb, timeout=timeout, kernel_name="python3", allow_errors=True,
                                     resources={"metadata": {"path": str(ROOT / "chapters")}})
    client.execute()
    glued, errors = {}, []
    for index, cell in enumerate(nb.cells):
        for output in cell.get("outputs", []):
            if output.get("output_type") == "error":
                errors.append(f"cell {index}: {output['ename']}: {output['evalue']}".strip())
            glue_name = output.get("metadata", {}).get("scrapbook", {}).get("name")
            plain = [value for key, value in output.get("data", {}).items() if key.endswith("text/plain")]
            if glue_name and plain:
                try:
                    glued[glue_name] = float(plain[0])
                except ValueError:
                    pass  # a glued string (a formatted figure): not a claim
    return {"chapter": name, "seed": seed, "path": path_name, "glued": glued, "errors": errors,
            "seconds": time.perf_counter() - start}


def launch(name: str, seed: int, path_name: str, timeout: int) -> dict:
    """``run_one`` in a child process whose environment selects the arithmetic path."""
    # One thread per run, so that two runs at a time share two cores without oversubscribing them.
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", **PATHS[path_name]}
    command = [sys.executable, "-m", "benchmarks.robustness", "--one", name, str(seed), path_name,
               "--timeout", str(timeout)]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        return {"chapter": name, "seed": seed, "path": path_name, "glued": {}, "seconds": 0.0,
                "errors": [f"the run itself failed: {done.stderr.strip().splitlines()[-1:]}"]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def table(results: list[dict], claims: list[Claim] = CLAIMS) -> tuple[str, bool]:
    """The Markdown table of ``claims`` over ``results``, and whether everything held."""
    lines = ["| ch. | claim | threshold | min | median | max | runs | worst run |",
             "|---|---|---|---|---|---|---|---|"]
    ok = True
    for claim in claims:
        runs = [(r["glued"][claim.name], r) for r in results if r["chapter"] == claim.chapter
                and claim.name in r["glued"]]
        expected = sum(r["chapter"] == claim.chapter for r in results)
        if not runs:
            if expected:
                lines.append(f"| {claim.chapter} | {claim.text} | {claim.op} {claim.threshold:g} | - | - | - | "
                             f"0/{expected} | never glued |")
                ok = False
            continue
        values = sorted(value for value, _ in runs)
        worst_value, worst = (min if claim.op.startswith(">") else max)(runs, key=lambda pair: pair[0])
        missed = sum(not claim.holds(value) for value in values)
        ok &= missed == 0 and len(runs) == expected
        lines.append(f"| {claim.chapter} | {claim.text} | {claim.op} {claim.threshold:g} | {values[0]:.4g} | "
                     f"{statistics.median(values):.4g} | {values[-1]:.4g} | {len(runs)}/{expected} | "
                     f"seed {worst['seed']}, {worst['path']}{'' if claim.holds(worst_value) else ' **MISSED**'} |")
    chapters = sorted({r["chapter"] for r in results})
    lines += ["", "| ch. | runs | runs with a failing cell | time per run (s), min - max |", "|---|---|---|---|"]
    for chapter in chapters:
        mine = [r for r in results if r["chapter"] == chapter]
        failing = [r for r in mine if r["errors"]]
        ok &= not failing
        seconds = [r["seconds"] for r in mine]
        lines.append(f"| {chapter} | {len(mine)} | {len(failing)} | {min(seconds):.0f} - {max(seconds):.0f} |")
    for r in results:
        for error in r["errors"]:
            lines.append(f"\nchapter {r['chapter']}, seed {r['seed']}, {r['path']}: {error[:300]}")
    return "\n".join(lines), ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chapters", nargs="*", default=sorted({claim.chapter for claim in CLAIMS}))
    parser.add_argument("--seeds", nargs="*", type=int, default=list(range(8)))
    parser.add_argument("--paths", nargs="*", default=list(PATHS), choices=list(PATHS))
    parser.add_argument("--jobs", type=int, default=2, help="runs at a time (default 2)")
    parser.add_argument("--timeout", type=int, default=1800, help="seconds a cell may take")
    parser.add_argument("--out", type=Path, default=ROOT / "_build" / "robustness" / "results.json")
    parser.add_argument("--table", type=Path, help="print the table of an earlier run's results and stop")
    parser.add_argument("--one", nargs=3, metavar=("CHAPTER", "SEED", "PATH"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        name, seed, path_name = args.one
        print(json.dumps(run_one(name, int(seed), path_name, args.timeout)))
        return 0
    if args.table:
        text, ok = table(json.loads(args.table.read_text()))
        print(text)
        return 0 if ok else 1
    import torch  # noqa: PLC0415

    jobs = [(name, seed, path_name) for name in args.chapters for path_name in args.paths for seed in args.seeds]
    print(f"{len(jobs)} runs ({len(args.chapters)} chapters x {len(args.paths)} paths x {len(args.seeds)} seeds), "
          f"{args.jobs} at a time; torch {torch.__version__}, native capability "
          f"{torch.backends.cpu.get_cpu_capability()}", flush=True)
    results, start = [], time.perf_counter()
    with ThreadPoolExecutor(args.jobs) as pool:
        futures = [pool.submit(launch, *job, args.timeout) for job in jobs]  # in the order given
        for future in futures:
            r = future.result()
            results.append(r)
            print(f"  chapter {r['chapter']} seed {r['seed']} {r['path']:7}: {r['seconds']:4.0f} s, "
                  f"{len(r['errors'])} failing cells", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))
    text, ok = table(results)
    print(f"\n{text}\n\n{len(jobs)} runs in {(time.perf_counter() - start) / 60:.1f} min; results in {args.out}")
    print("every claim held in every run" if ok else "SOME CLAIM DID NOT HOLD IN EVERY RUN (see above)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
