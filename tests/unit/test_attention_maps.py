"""nmt/engines/attention_maps.py: the attention weights kept beside the model are distributions
over the allowed keys, the outputs equal the fused attention's, and turning it off leaves the
model exactly as it was."""

import torch
from test_model import batch, tiny_cfg

from nmt.engines.attention_maps import attention_maps, keep_attention
from nmt.model import MultiHeadAttention, make_model


def test_attention_maps_are_distributions():
    torch.manual_seed(0)
    model = make_model(tiny_cfg(), 50, 50, 0, True).eval()
    src, tgt = batch()
    keep_attention(model, True)
    with torch.no_grad():
        kept = model(src, tgt)
    maps = attention_maps(model)
    keep_attention(model, False)
    with torch.no_grad():
        fused = model(src, tgt)
    torch.testing.assert_close(kept, fused, atol=1e-5, rtol=1e-5)
    assert [len(v) for v in maps.values()] == [2, 2, 2]
    enc, dec, cross = maps["encoder_self"][0], maps["decoder_self"][0], maps["encoder_decoder"][0]
    assert enc.shape == (3, 4, 7, 7) and dec.shape == (3, 4, 6, 6) and cross.shape == (3, 4, 6, 7)
    torch.testing.assert_close(cross.sum(-1), torch.ones(3, 4, 6))
    assert cross[0, :, :, -2:].abs().max() == 0  # padded source positions get no attention
    assert dec[0, 0].triu(diagonal=1).abs().max() == 0  # no attention to the future


def test_turned_off_the_model_is_fused_again_bit_for_bit():
    torch.manual_seed(0)
    model = make_model(tiny_cfg(), 50, 50, 0, True).eval()
    src, tgt = batch()
    with torch.no_grad():
        before = model(src, tgt)
        keep_attention(model, True)
        model(src, tgt)
        keep_attention(model, False)
        after = model(src, tgt)
    assert torch.equal(before, after)
    layers = [m for m in model.modules() if isinstance(m, MultiHeadAttention)]
    assert len(layers) == 6
    assert all("attention" not in vars(m) and "weights" not in vars(m) for m in layers)
