"""The Annotated Transformer's copy task: learn to reproduce random sequences over 11 symbols."""

import pytest
import torch

from nmt.config import ModelConfig, OptimConfig
from nmt.model import Transformer, make_model
from nmt.training.loss import LabelSmoothedLoss
from nmt.training.schedule import build_optimizer

V, PAD, BOS, EOS, LENGTH = 11, 0, 2, 3, 10


def random_batch(batch_size: int, g: torch.Generator) -> torch.Tensor:
    """(B, LENGTH) sequences of the symbols 4..10."""
    return torch.randint(4, V, (batch_size, LENGTH), generator=g)


def with_specials(x: torch.Tensor):
    """Source with EOS, decoder input with BOS, and output with EOS."""
    eos = torch.full((x.size(0), 1), EOS)
    bos = torch.full((x.size(0), 1), BOS)
    return torch.cat([x, eos], 1), torch.cat([bos, x], 1), torch.cat([x, eos], 1)


@torch.no_grad()
def greedy(model: Transformer, src: torch.Tensor, max_len: int) -> torch.Tensor:
    """Greedy decoding with the key/value cache; returns (B, max_len) ids."""
    state = model.start_decoding(*model.encode(src))
    y = torch.full((src.size(0), 1), BOS)
    out = []
    for _ in range(max_len):
        y = model.decode_step(y, state)[:, -1].argmax(-1, keepdim=True)  # (B, 1)
        out.append(y)
    return torch.cat(out, 1)


@pytest.mark.long
def test_copy_task_reproduces_unseen_inputs():
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    cfg = ModelConfig(N=2, d_model=64, d_ff=256, h=4, dropout=0.0)
    model = make_model(cfg, V, V, PAD, True)
    optim = OptimConfig(lr_factor=1.0, warmup=200, beta1=0.9, beta2=0.98, eps=1e-9,
                        label_smoothing=0.1)
    optimizer, scheduler = build_optimizer(model, optim, cfg.d_model)
    for _ in range(300):  # exact on unseen inputs from ~250 updates (loss at its floor by 300)
        src, tgt_in, tgt_out = with_specials(random_batch(64, g))
        logits = model(src, tgt_in)  # (B, T, V); no padding in this task
        loss, _ = LabelSmoothedLoss.apply(logits.flatten(0, 1), tgt_out.flatten(), 0.1, PAD)
        loss = loss / tgt_out.numel()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
    model.eval()
    x = random_batch(20, torch.Generator().manual_seed(12345))  # unseen sequences
    src, _, expected = with_specials(x)
    assert torch.equal(greedy(model, src, LENGTH + 1), expected)
