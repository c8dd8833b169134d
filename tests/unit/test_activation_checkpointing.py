"""nmt.training.activation_checkpointing: recomputed layers give the reference model's gradients
and keep fewer activations."""

import copy

import pytest
import torch
from translate_helpers import tiny_model_cfg

from nmt.commands.train import train
from nmt.config import TrainConfig, compose, to_object
from nmt.model import make_model
from nmt.training.activation_checkpointing import checkpoint_layers
from nmt.training.checkpoint import load_checkpoint
from nmt.training.cpu_training import use_cpu_dropout

V = 24


def loss_and_saved_bytes(model, src, tgt) -> tuple[torch.Tensor, list[torch.Tensor], int]:
    """One training forward and backward from a fixed random state: the loss, the gradients
    and the bytes autograd kept for backward."""
    saved = 0

    def pack(t):
        nonlocal saved
        saved += t.numel() * t.element_size()
        return t

    torch.manual_seed(7)  # the dropout masks
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = model(src, tgt).float().logsumexp(-1).mean()
    loss.backward()
    return loss.detach(), [p.grad for p in model.parameters()], saved


def test_checkpointed_layers_give_the_reference_gradients_with_less_kept():
    torch.manual_seed(0)
    reference = make_model(tiny_model_cfg(N=2, d_model=32, d_ff=64, h=4), V, V, 0, True)
    use_cpu_dropout(reference)  # CPU dropout draws from torch's generator too
    model = checkpoint_layers(copy.deepcopy(reference))
    g = torch.Generator().manual_seed(1)
    src, tgt = (torch.randint(3, V, (4, 12), generator=g) for _ in range(2))
    loss, grads, kept = loss_and_saved_bytes(reference.train(), src, tgt)
    loss_c, grads_c, kept_c = loss_and_saved_bytes(model.train(), src, tgt)
    assert torch.equal(loss, loss_c)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(grads, grads_c, strict=True))
    assert kept_c < kept / 2
    assert model.state_dict().keys() == reference.state_dict().keys()
    twin = copy.deepcopy(model)  # a copy after the wrapping recomputes its own layers
    assert all(a.forward.__self__ is a for a in [*twin.encoder, *twin.decoder])
    assert "forward" not in vars(reference.encoder[0])  # the original's layers untouched
    with torch.no_grad():  # inference through the wrapped layers, cache included
        model.eval()
        memory, mask = model.encode(src)
        assert torch.equal(memory, reference.eval().encode(src)[0])


@pytest.mark.slow
def test_nmt_train_with_checkpointed_layers_learns_the_same(tiny_data_dir, tmp_path):
    """train.checkpoint_activations=true: the same updates (up to float rounding), the same
    checkpoint keys, and the EMA (copied before the wrapping) stays a plain model."""
    def run(name, *opts):
        cfg = to_object(compose("train", [
            "+model=small", f"data_dir={tiny_data_dir}", f"run_dir={tmp_path / name}",
            "model.N=1", "model.d_model=32", "model.d_ff=64", "model.h=4",
            "train.max_tokens=256", "train.max_updates=3", "train.valid_interval_updates=100",
            "train.ema_decay=0.9", *opts]), TrainConfig)
        train(cfg)
        return load_checkpoint(tmp_path / name / "checkpoint_last.pt")

    plain, recomputed = run("plain"), run("ckpt", "train.checkpoint_activations=true")
    for key in ("model", "ema"):
        a, b = plain[key], recomputed[key]
        assert a.keys() == b.keys()
        assert all(torch.allclose(a[k].float(), b[k].float(), atol=1e-5) for k in a)
