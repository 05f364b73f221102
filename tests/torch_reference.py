"""torch.nn's Transformer layers holding the package's weights: the reference of the comparison tests
(test_encoder.py, test_decoder.py) and the other side of benchmarks/speed.py."""

import torch
from torch import nn

from transformer import Decoder, DecoderLayer, Encoder, EncoderLayer
from transformer.interop.torch_nn import torch_names


def randomise(module):
    """Random biases and LayerNorm gains (fresh ones are 0 and 1), so that copying them is tested."""
    with torch.no_grad():
        for name, p in module.named_parameters():
            if "norm" in name and name.endswith("weight"):
                p.normal_(1.0, 0.2)
            elif name.endswith("bias"):
                p.normal_(0.0, 0.2)
    return module


def torch_counterpart(ours, d_model, num_heads, d_ff, dropout=0.0):
    """torch.nn's module for our EncoderLayer, Encoder, DecoderLayer or Decoder, holding its weights.

    The sizes are the caller's; ReLU, batch first, and our module's norm_first and number of layers (a
    pre-LN stack ends in a LayerNorm, as ours does). Loading is strict: every weight copied, none left over.
    """
    if isinstance(ours, (EncoderLayer, DecoderLayer)):
        first = ours
    elif isinstance(ours, (Encoder, Decoder)):
        first = ours.layers[0]
    else:
        raise TypeError(f"no torch.nn counterpart for {type(ours).__name__}")
    encoder = isinstance(ours, (EncoderLayer, Encoder))
    layer = (nn.TransformerEncoderLayer if encoder else nn.TransformerDecoderLayer)(
        d_model, num_heads, d_ff, dropout=dropout, activation="relu", batch_first=True, norm_first=first.norm_first)
    if ours is first:
        ref = layer
    else:
        norm = nn.LayerNorm(d_model) if first.norm_first else None
        ref = (nn.TransformerEncoder(layer, len(ours.layers), norm=norm, enable_nested_tensor=False) if encoder
               else nn.TransformerDecoder(layer, len(ours.layers), norm=norm))
    ref.load_state_dict(torch_names(dict(ours.named_parameters())))
    return ref


def assert_same_values_and_grads(ours, ref, inputs, run_ours, run_ref):
    """Outputs, input gradients and parameter gradients of our module and torch's agree.

    ``run_ours(*inputs)`` and ``run_ref(*inputs)`` call the two modules; the inputs require grad.
    """
    out, ref_out = run_ours(*inputs), run_ref(*inputs)
    torch.testing.assert_close(out, ref_out)
    torch.manual_seed(2)
    probe = torch.randn_like(out)  # a loss whose gradient is not trivially zero through a LayerNorm
    n = len(inputs)
    grads = torch.autograd.grad((out * probe).sum(), [*inputs, *ours.parameters()])
    ref_grads = torch.autograd.grad((ref_out * probe).sum(), [*inputs, *ref.parameters()])
    for g, ref_g in zip(grads[:n], ref_grads[:n]):
        torch.testing.assert_close(g, ref_g)
    mapped = torch_names(dict(zip([name for name, _ in ours.named_parameters()], grads[n:])))
    ref_named = dict(zip([name for name, _ in ref.named_parameters()], ref_grads[n:]))
    assert mapped.keys() == ref_named.keys()
    for name in mapped:
        torch.testing.assert_close(mapped[name], ref_named[name], msg=name)
