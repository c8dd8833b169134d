"""The Transformer: shapes, incremental decoding, tying, Table 3 parameter counts, attention."""

import pytest
import torch

from nmt.config import ModelConfig
from nmt.errors import ConfigError
from nmt.model import causal_mask, count_parameters, make_model


def tiny_cfg(**kw) -> ModelConfig:
    """A 2-layer model small enough for unit tests."""
    base = dict(N=2, d_model=32, d_ff=64, h=4, dropout=0.1)
    base.update(kw)
    return ModelConfig(**base)


def batch(V=50, B=3, S=7, T=6, pad=0, seed=0):
    """Random source (with padding in row 0) and target-input ids."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, V, (B, S), generator=g)
    src[0, S - 2:] = pad
    tgt = torch.randint(4, V, (B, T), generator=g)
    return src, tgt


def test_forward_shapes():
    model = make_model(tiny_cfg(), 50, 60, 0, False)
    src, tgt = batch()
    assert model(src, tgt).shape == (3, 6, 60)


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_incremental_decoding_equals_full_forward(norm):
    torch.manual_seed(0)
    model = make_model(tiny_cfg(norm=norm), 50, 50, 0, True).eval()
    src, tgt = batch()
    with torch.no_grad():
        full = model(src, tgt)
        memory, src_mask = model.encode(src)
        state = model.start_decoding(memory, src_mask)
        steps = [model.decode_step(tgt[:, t:t + 1], state) for t in range(tgt.size(1))]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)


def test_incremental_decoding_with_a_multi_token_prefix():
    torch.manual_seed(0)
    model = make_model(tiny_cfg(), 50, 50, 0, True).eval()
    src, tgt = batch()
    with torch.no_grad():
        full = model(src, tgt)
        state = model.start_decoding(*model.encode(src))
        first = model.decode_step(tgt[:, :4], state)
        rest = model.decode_step(tgt[:, 4:], state)
    torch.testing.assert_close(torch.cat([first, rest], dim=1), full, atol=1e-5, rtol=1e-5)


def test_a_decoder_shallower_than_the_encoder():
    """model.N_dec: its own number of decoder layers, each stack's residual maps scaled by
    its own depth; incremental decoding still equals the full forward pass."""
    torch.manual_seed(0)
    model = make_model(tiny_cfg(N=3, N_dec=1, dropout=0.0), 50, 50, 0, True).eval()
    assert (len(model.encoder), len(model.decoder)) == (3, 1)
    d = 32
    for name, depth in (("encoder.0.self_attn.W_o.weight", 3),
                        ("decoder.0.self_attn.W_o.weight", 1)):
        bound = (2 * depth) ** -0.5 * (6 / (2 * d)) ** 0.5
        assert 0.99 * bound < model.get_parameter(name).abs().max() <= bound, name
    src, tgt = batch()
    with torch.no_grad():
        full = model(src, tgt)
        memory, src_mask = model.encode(src)
        state = model.start_decoding(memory, src_mask)
        steps = [model.decode_step(tgt[:, t:t + 1], state) for t in range(tgt.size(1))]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)
    assert ModelConfig(N=2, d_model=32, d_ff=64, h=4, dropout=0.1).decoder_layers == 2


@pytest.mark.parametrize("choice, factor", [("gpt2", 6 ** -0.5), ("depth", 1 / 6),
                                            ("xavier", 1.0), ("zero", 0.0)])
def test_residual_init_scales_the_maps_into_the_residual_stream(choice, factor):
    """model.residual_init: W^O and W_2 are Xavier times 1/sqrt(2N), 1/(2N), 1 or 0 (N = 3);
    every other weight is drawn the same whatever the choice."""
    torch.manual_seed(0)
    model = make_model(tiny_cfg(N=3, dropout=0.0, residual_init=choice), 50, 50, 0, True)
    torch.manual_seed(0)
    xavier = make_model(tiny_cfg(N=3, dropout=0.0, residual_init="xavier"), 50, 50, 0, True)
    for (name, w), ref in zip(model.named_parameters(), xavier.parameters(), strict=True):
        scaled = name.endswith(("W_o.weight", "W_2.weight"))
        torch.testing.assert_close(w, ref * factor if scaled else ref, msg=name)
    with pytest.raises(ConfigError, match="^model.residual_init: must be one of gpt2"):
        tiny_cfg(residual_init="fixup")


def test_reorder_keeps_selected_rows():
    torch.manual_seed(0)
    model = make_model(tiny_cfg(), 50, 50, 0, True).eval()
    src, tgt = batch()
    with torch.no_grad():
        full = model(src, tgt)
        state = model.start_decoding(*model.encode(src))
        model.decode_step(tgt[:, :3], state)
        state.reorder(torch.tensor([2, 0]))
        out = model.decode_step(tgt[[2, 0], 3:], state)
    torch.testing.assert_close(out, full[[2, 0], 3:], atol=1e-5, rtol=1e-5)


def test_padding_does_not_change_the_output():
    torch.manual_seed(0)
    model = make_model(tiny_cfg(), 50, 50, 0, True).eval()
    src, tgt = batch()
    padded = torch.cat([src, torch.zeros(3, 4, dtype=torch.long)], dim=1)
    with torch.no_grad():
        torch.testing.assert_close(model(padded, tgt), model(src, tgt), atol=1e-5, rtol=1e-5)


def test_decoder_is_causal():
    torch.manual_seed(0)
    model = make_model(tiny_cfg(), 50, 50, 0, True).eval()
    src, tgt = batch()
    changed = tgt.clone()
    changed[:, -1] = 5
    with torch.no_grad():
        a, b = model(src, tgt), model(src, changed)
    torch.testing.assert_close(a[:, :-1], b[:, :-1])
    assert not torch.allclose(a[:, -1], b[:, -1])


def test_three_way_tying_with_a_joint_vocabulary():
    model = make_model(tiny_cfg(), 50, 50, 0, True)
    assert model.src_embed.lut.weight is model.generator.weight
    assert model.tgt_embed.lut.weight is model.generator.weight
    separate = make_model(tiny_cfg(), 40, 50, 0, False)
    assert separate.tgt_embed.lut.weight is separate.generator.weight
    assert separate.src_embed.lut.weight is not separate.generator.weight
    untied = make_model(tiny_cfg(share_embeddings=False), 50, 50, 0, True)
    assert untied.tgt_embed.lut.weight is not untied.generator.weight


def test_two_vocabularies_of_one_size_are_not_tied():
    """Joint means one id space, not equal sizes: the flag decides, never the sizes."""
    model = make_model(tiny_cfg(), 50, 50, 0, False)
    assert model.tgt_embed.lut.weight is model.generator.weight
    assert model.src_embed.lut.weight is not model.generator.weight
    with pytest.raises(TypeError):
        make_model(tiny_cfg(), 50, 50)  # the flag (and the padding id) must be given


def test_the_reference_model_is_plain_torch_nn_without_hooks():
    """model.py imports nothing of nmt but its config, and make_model's model is made of
    torch.nn and model.py classes only, with no hooks (the speed paths are opted into by the
    caller: nmt/training/cpu_training.py, nmt/decoding/fast_model.py)."""
    import ast
    import inspect

    import nmt.model

    tree = ast.parse(inspect.getsource(nmt.model))
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    imported |= {a.name for node in ast.walk(tree) if isinstance(node, ast.Import)
                 for a in node.names}
    assert {m for m in imported if m and m.startswith("nmt")} == {"nmt.config"}
    model = make_model(tiny_cfg(), 50, 50, 0, True)
    for module in model.modules():
        assert type(module).__module__ in ("nmt.model",) or \
            type(module).__module__.startswith("torch.nn."), type(module)
        assert not (module._forward_hooks or module._forward_pre_hooks
                    or module._backward_hooks), type(module)
    assert {type(m) for m in model.modules() if isinstance(m, torch.nn.Dropout)} == \
        {torch.nn.Dropout}


@pytest.mark.slow
@pytest.mark.parametrize("row", ["small", "base", "big"])
def test_initialisation_follows_the_reference_scheme(row):
    """Embeddings N(0, d^-0.5) with a zero padding row (tokens of RMS 1 after the sqrt(d)
    scale), W^Q, W^K, W^V Xavier-uniform per (d x d) block with gain 1/sqrt(2) (fused or not),
    other linear maps Xavier-uniform, W^O and W_2 then scaled by 1/sqrt(2N), zero biases."""
    from nmt.config import TrainConfig, compose, to_object

    cfg = to_object(compose("train", [f"+model={row}", "data_dir=d", "run_dir=r"]), TrainConfig)
    torch.manual_seed(0)
    model = make_model(cfg.model, 8000, 8000, 0, True)
    d, d_ff = cfg.model.d_model, cfg.model.d_ff
    E = model.generator.weight  # tied: source and target embeddings and the projection
    assert model.src_embed.lut.weight is E and model.tgt_embed.lut.weight is E
    assert E[0].abs().max() == 0  # the padding row
    assert abs(E[1:].std().item() - d ** -0.5) < 0.01 * d ** -0.5
    assert abs(E[1:].mean().item()) < 0.01 * d ** -0.5
    tokens = model.tgt_embed(torch.arange(1, 8000))  # (V - 1, d): RMS 1 after the scale
    assert abs(tokens.pow(2).mean().sqrt().item() - 1.0) < 0.01
    residual = (2 * cfg.model.N) ** -0.5  # W^O and W_2 write into the residual stream
    for name, bound in [("encoder.0.self_attn.W_qkv.weight", (6 / (4 * d)) ** 0.5),
                        ("decoder.0.src_attn.W_q.weight", (6 / (4 * d)) ** 0.5),
                        ("decoder.0.src_attn.W_kv.weight", (6 / (4 * d)) ** 0.5),
                        ("decoder.0.self_attn.W_o.weight", residual * (6 / (2 * d)) ** 0.5),
                        ("decoder.0.src_attn.W_o.weight", residual * (6 / (2 * d)) ** 0.5),
                        ("encoder.0.feed_forward.W_1.weight", (6 / (d + d_ff)) ** 0.5),
                        ("decoder.0.feed_forward.W_2.weight", residual * (6 / (d + d_ff)) ** 0.5)]:
        w = model.get_parameter(name)
        assert w.abs().max() <= bound and w.abs().max() > 0.99 * bound, name
        assert abs(w.std().item() - bound / 3 ** 0.5) < 0.02 * bound, name  # uniform's std
    biases = [p for n, p in model.named_parameters() if n.endswith("bias") and "norm" not in n]
    assert biases and all(b.abs().max() == 0 for b in biases)
    norms = [m for m in model.modules() if isinstance(m, torch.nn.LayerNorm)]
    assert all(m.weight.eq(1).all() and m.bias.eq(0).all() for m in norms)


def test_untied_embeddings_get_the_same_scheme():
    model = make_model(tiny_cfg(share_embeddings=False, d_model=64), 3000, 3000, 0, True)
    for w in (model.src_embed.lut.weight, model.tgt_embed.lut.weight, model.generator.weight):
        assert w[0].abs().max() == 0 and abs(w[1:].std().item() - 64 ** -0.5) < 0.003


@pytest.mark.parametrize("row,expected_millions", [("base", 63.1), ("big", 214.2)])
def test_parameter_counts_match_table_3(row, expected_millions):
    """Table 3 reports 65M (base) and 213M (big); fully tied 37k joint vocab gives ~63M / ~214M."""
    from nmt.config import TrainConfig, compose, to_object

    cfg = to_object(compose("train", [f"+model={row}", "data_dir=d", "run_dir=r"]), TrainConfig)
    with torch.device("meta"):
        model = make_model(cfg.model, 37000, 37000, 0, True)
    n = count_parameters(model) / 1e6
    paper = {"base": 65, "big": 213}[row]
    assert abs(n - paper) / paper < 0.05
    assert abs(n - expected_millions) < 0.5


def test_causal_mask_with_past_keys():
    m = causal_mask(2, 4, torch.device("cpu"))
    assert m.tolist() == [[True, True, True, False], [True, True, True, True]]


def test_too_long_input_is_a_clear_error():
    model = make_model(tiny_cfg(max_positions=8), 50, 50, 0, True)
    with pytest.raises(ValueError, match="max_positions"):
        model(torch.ones(1, 9, dtype=torch.long), torch.ones(1, 3, dtype=torch.long))


def test_the_additive_mask_of_gpus_attends_like_the_boolean_mask():
    import torch.nn.functional as F

    from nmt.model import additive_mask

    torch.manual_seed(0)
    q, k, v = (torch.randn(3, 2, 5, 8) for _ in range(3))  # (B, h, T, d_k)
    lengths = torch.tensor([5, 3, 1])
    mask = (torch.arange(5) < lengths[:, None])[:, None, None, :]  # (B, 1, 1, S)
    bias = additive_mask(mask, q.dtype)
    assert bias.shape == mask.shape and bias.dtype == q.dtype
    assert torch.equal(bias == 0, mask) and torch.isinf(bias[~mask]).all()
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(F.scaled_dot_product_attention(q, k, v, attn_mask=bias), expected)
    scores = (q @ k.transpose(-2, -1) / 8 ** 0.5).masked_fill(~mask, float("-inf"))
    torch.testing.assert_close(scores.softmax(-1) @ v, expected)  # the formula itself
