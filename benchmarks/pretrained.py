"""Marian and GPT-2 at their real sizes, with random weights, converted to the package's classes.

No download: each model is built by ``transformers`` from a configuration with the sizes of a real
checkpoint, its weights drawn at random (far from their initialisation, biases and gains too), then
converted with ``transformer.interop.huggingface_in.from_huggingface``. The script prints, for each, the
parameter counts, the time to build and to convert, and the largest absolute difference between the
two models' float32 logits on one batch (a padded source batch for Marian), and writes them to
``benchmarks/pretrained_results.json``, which the chapter "Pretrained weights" quotes.

    OMP_NUM_THREADS=1 python benchmarks/pretrained.py

Sizes: opus-mt-de-en (d_model 512, 6 + 6 layers, 8 heads, d_ff 2048, swish, vocabulary 58,101) and
GPT-2 small (d_model 768, 12 layers, 12 heads, vocabulary 50,257, 1,024 positions).
"""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from transformers import GPT2Config, GPT2LMHeadModel, MarianConfig, MarianMTModel

from transformer.interop.huggingface_in import from_huggingface

RESULTS = Path(__file__).with_name("pretrained_results.json")
OPUS_MT_DE_EN = dict(vocab_size=58101, d_model=512, encoder_layers=6, decoder_layers=6,
                     encoder_attention_heads=8, decoder_attention_heads=8, encoder_ffn_dim=2048,
                     decoder_ffn_dim=2048, max_position_embeddings=512, activation_function="swish",
                     scale_embedding=True, pad_token_id=58100, decoder_start_token_id=58100, eos_token_id=0)
GPT2_SMALL = dict(vocab_size=50257, n_embd=768, n_layer=12, n_head=12, n_positions=1024)


def randomise(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Random weights of the order of trained ones: matrices 0.02-0.05, biases 0.02, gains near 1."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "embed_positions" in name:
                continue
            noise = torch.randn(p.shape, generator=generator)
            if name.endswith("bias"):
                p.copy_(0.02 * noise)
            elif "layer_norm" in name or name.split(".")[-2].startswith("ln"):
                p.copy_(1.0 + 0.1 * noise)
            else:
                p.copy_(0.05 * noise)
        for name, buffer in model.named_buffers():
            if name == "final_logits_bias":
                buffer.copy_(0.1 * torch.randn(buffer.shape, generator=generator))
    return model.eval()


def count(model: torch.nn.Module) -> int:
    """Parameters, each shared tensor once, Marian's fixed sinusoidal tables left out."""
    seen = {id(p): p for name, p in model.named_parameters() if "embed_positions" not in name}
    return sum(p.numel() for p in seen.values())


def measure(name: str, build, inputs) -> dict:
    start = time.perf_counter()
    hf = randomise(build())
    built = time.perf_counter() - start
    start = time.perf_counter()
    ours = from_huggingface(hf)
    converted = time.perf_counter() - start
    with torch.no_grad():
        reference, logits = inputs(hf, ours)
    result = dict(parameters_reference=count(hf), parameters_ours=count(ours),
                  max_abs_logit_difference=(logits - reference).abs().max().item(),
                  max_abs_logit=reference.abs().max().item(), build_s=round(built, 2), convert_s=round(converted, 2))
    print(f"{name}: {result}")
    return result


def marian_inputs(hf, ours):
    generator = torch.Generator().manual_seed(1)
    src = torch.randint(1, 58100, (4, 24), generator=generator)  # (B, S)
    src[1, 17:] = 58100  # padding on the right, as MarianTokenizer pads
    src[3, 9:] = 58100
    attention_mask = (src != 58100).long()
    tgt = torch.randint(1, 58100, (4, 16), generator=generator)
    tgt[:, 0] = 58100  # the decoder's start token
    reference = hf(input_ids=src, attention_mask=attention_mask, decoder_input_ids=tgt).logits
    return reference, ours(src, tgt, src_mask=(attention_mask == 0)[:, None, None, :])


def gpt2_inputs(hf, ours):
    tokens = torch.randint(0, 50257, (2, 64), generator=torch.Generator().manual_seed(1))
    return hf(tokens).logits, ours(tokens)


def main() -> None:
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, {platform.processor() or platform.machine()}, "
          f"{torch.get_num_threads()} thread(s)")
    results = {
        "opus-mt-de-en": measure("opus-mt-de-en", lambda: MarianMTModel(MarianConfig(**OPUS_MT_DE_EN)), marian_inputs),
        "gpt2": measure("gpt2", lambda: GPT2LMHeadModel(GPT2Config(**GPT2_SMALL)), gpt2_inputs),
    }
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
