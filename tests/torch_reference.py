"""Copying the package's weights into torch.nn's Transformer layers, for the comparison tests."""

import torch

# Our parameter names -> torch.nn's (beyond the stacked in_proj of W_q, W_k, W_v).
RENAMES = {"cross_attn": "multihead_attn", "feed_forward.w_1": "linear1",
           "feed_forward.w_2": "linear2", "w_o": "out_proj"}


def torch_names(tensors):
    """Our parameter names -> torch.nn's: W_q, W_k, W_v rows stacked into in_proj_*, the rest renamed."""
    renamed = {}
    for name, tensor in tensors.items():
        if ".w_k." in name or ".w_v." in name:
            continue
        if ".w_q." in name:
            prefix, kind = name.split(".w_q.")
            tensor = torch.cat([tensors[f"{prefix}.w_{p}.{kind}"] for p in "qkv"])
            name = f"{prefix}.in_proj_{kind}"
        for ours, theirs in RENAMES.items():
            name = name.replace(ours, theirs)
        renamed[name] = tensor
    return renamed


def randomise(module):
    """Random biases and LayerNorm gains (fresh ones are 0 and 1), so that copying them is tested."""
    with torch.no_grad():
        for name, p in module.named_parameters():
            if "norm" in name and name.endswith("weight"):
                p.normal_(1.0, 0.2)
            elif name.endswith("bias"):
                p.normal_(0.0, 0.2)
    return module
