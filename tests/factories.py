"""Small, seeded models shared by the test modules."""

import torch

from transformer import DecoderLayer, EncoderLayer, LayerOptions, Transformer
from torch_reference import randomise

# The size of the encoder and decoder tests (test_encoder.py, test_decoder.py).
D_MODEL, NUM_HEADS, D_FF = 8, 2, 16

# The vocabularies of the small Transformer (test_model.py, test_decoding.py); 0 is padding.
SRC_VOCAB, TGT_VOCAB, PAD = 13, 11, 0


def random_module(module_class, norm_first=False, num_layers=3, seed=0, dropout=0.0, **kwargs):
    """An EncoderLayer, Encoder, DecoderLayer or Decoder of the test size (a stack of ``num_layers``),
    built under ``seed`` with ``LayerOptions(norm_first=norm_first)``, with random biases and LayerNorm
    gains so that comparisons see them; ``kwargs`` (such as ``cross_attention``) go to the constructor as well."""
    torch.manual_seed(seed)
    stack = () if module_class in (EncoderLayer, DecoderLayer) else (num_layers,)
    return randomise(module_class(*stack, D_MODEL, NUM_HEADS, D_FF, dropout=dropout,
                                  options=LayerOptions(norm_first=norm_first), **kwargs))


def small_transformer(seed=0, **changes) -> Transformer:
    """A Transformer built under ``seed``, in eval mode: d_model 16, 4 heads, 2 layers, d_ff 32, no dropout,
    the vocabularies above; ``changes`` replace any of these arguments or add others."""
    options = dict(src_vocab_size=SRC_VOCAB, tgt_vocab_size=TGT_VOCAB, d_model=16, num_heads=4, num_layers=2,
                   d_ff=32, dropout=0.0, pad_id=PAD)
    options.update(changes)
    torch.manual_seed(seed)
    return Transformer(**options).eval()
