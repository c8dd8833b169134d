"""nmt's own work measured on the GPU simulation harness (nmt.testing.gpu_sim): an update of
nmt-train (operators by phase, FLOPs, bytes, peak memory), the training loss alone, and the host
reads of a search. tests/system/test_gpu_cost.py and scripts/gpu_cost.py use it (docs/gpu.md)."""

from __future__ import annotations

from unittest import mock

import torch

from nmt.testing.gpu_sim import DeviceProfile, HostReads, fused_attention, profiled, simulated_cuda


def synthetic_batch(sentences: int, length: int, vocab: int):
    """A training Batch of `sentences` pairs of `length` tokens each side, no padding."""
    from nmt.data.batches import Batch

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(4, vocab, (sentences, length), generator=g)  # (B, L)
    rows = torch.arange(sentences).repeat_interleave(length)  # (B L,) the non-padding targets
    cols = torch.arange(length).repeat(sentences)
    n = sentences * length
    return Batch(ids, ids, ids, n, n, (rows, cols))


def simulated_run(model: str, vocab: int, *overrides: str):
    """nmt-train's Run of +model=`model` (a joint vocabulary of `vocab`) on the simulated GPU;
    call it inside simulated_cuda."""
    from nmt.commands.train import build_run
    from nmt.config import TrainConfig, compose, to_object
    from nmt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID
    from nmt.data.vocab import Vocab
    from nmt.system.distributed import DistInfo
    from nmt.training.run import Data

    cfg = to_object(compose("train", [f"+model={model}", "data_dir=-", "run_dir=-",
                                      "train.device=cuda", *overrides]), TrainConfig)
    ids = Vocab(src_size=vocab, tgt_size=vocab, joint=True, pad_id=PAD_ID, unk_id=UNK_ID,
                bos_id=BOS_ID, eos_id=EOS_ID, sha256="")  # no SentencePiece models
    return build_run(cfg, DistInfo(device=torch.device("cuda", 0)), Data({}, ids, None, None))


def update_cost(model: str, vocab: int, sentences: int, length: int, amp: str = "bf16",
                ema_decay: float = 0.9999) -> dict:
    """One update of nmt-train on the simulated GPU (a batch of sentences x length target
    tokens, clipping on, the EMA of the weights kept), after a first one that made Adam's
    state: operators by phase, matrix-product FLOPs, the other operators' bytes, the peak of
    live device memory, the parameters. Backward runs GraphBackward, attention the fused
    kernels (fused_attention). Any host read raises: an update that completes made none."""
    return update_costs(model, vocab, [sentences], length, amp, ema_decay)[0]


def update_costs(model: str, vocab: int, sentences: list[int], length: int,
                 amp: str = "bf16", ema_decay: float = 0.9999) -> list[dict]:
    """update_cost at each number of sentences, in turn in one run: its first update, which
    makes Adam's state, on one sentence (the state has the parameters' shapes whatever the
    batch; the loss's chunks make a bigger batch slower to simulate), then one measured
    update a batch. Each batch's figures are those a run of its own gives."""
    from nmt.commands.train import train_step
    from nmt.model import count_parameters

    costs = []
    with simulated_cuda(backward="graph"), mock.patch.object(
            torch.nn.functional, "scaled_dot_product_attention", fused_attention):
        run = simulated_run(model, vocab, f"train.amp={amp}", f"train.ema_decay={ema_decay}",
                            "optim.clip_norm=1.0")
        train_step(run, 1, [(0, synthetic_batch(1, length, vocab))])  # Adam's state made
        for n in sentences:
            group = [(0, synthetic_batch(n, length, vocab))]
            profile = DeviceProfile()
            with profiled(profile):
                profile.track([*run.model.parameters(), *run.ema.parameters(),
                               *(t for state in run.optimizer.state.values()
                                 for t in state.values())])
                train_step(run, 1, group)
            costs.append({**profile.finish(), "host_reads": 0, "tokens": n * length,
                          "params": count_parameters(run.model)})
    return costs


def loss_memory(tokens: int, vocab: int, dtype: torch.dtype = torch.bfloat16,
                loss=None) -> dict:
    """The training loss alone (nmt.training.loss.LabelSmoothedLoss unless `loss`) on (tokens,
    vocab) logits of `dtype`, forward and backward, on the simulated GPU: the logits' bytes, what
    the forward keeps beyond them for backward, the peak beyond them (their gradient included),
    the operators of each pass and the bytes they move."""
    from nmt.training.loss import LabelSmoothedLoss

    loss = loss or LabelSmoothedLoss
    with simulated_cuda(backward="graph"):
        logits = torch.empty(tokens, vocab, dtype=dtype, device="cuda", requires_grad=True)
        target = torch.zeros(tokens, dtype=torch.long, device="cuda")
        profile = DeviceProfile()
        with profiled(profile):
            profile.track([logits, target])
            base = profile.live
            value, _ = loss.apply(logits, target, 0.1, 0)
            kept = profile.live - base
            value.backward()
        out = profile.finish()
        return {"logits_bytes": logits.numel() * logits.element_size(), "kept_bytes": kept,
                "peak_extra_bytes": profile.peak - base, "forward": out["forward"],
                "backward": out["backward"], "bytes": sum(out["bytes"].values())}


def decoding_reads(models, sources: list[list[int]], search) -> dict:
    """Host reads of one greedy or beam search (search.beam_size) over `sources` as one
    batch, on the CPU's real tensors: before the first step, per step (mean and most).
    FastModel's grouping of unequal sources and the tight loops (nmt.decoding.tight_loops,
    which step the fused operator) are left out: they run on the CPU only (their reads cost
    nothing there), and a GPU steps the core."""
    from nmt.data.tokenizer import SPECIALS
    from nmt.decoding import batches, fast_model, tight_loops

    src = batches.pad_batch([s + [SPECIALS.eos] for s in sources], SPECIALS.pad, "cpu")
    counter, real = HostReads(), batches.Decoder.log_probs

    def log_probs(self, prefix, *args, **kwargs):
        counter.step()
        return real(self, prefix, *args, **kwargs)

    with mock.patch.object(batches.Decoder, "log_probs", log_probs), counter, \
            mock.patch.object(fast_model, "source_groups", lambda src_mask: None), \
            mock.patch.object(tight_loops, "takes", lambda *args: False):
        batches.search_batch(models, src, search, SPECIALS)
    return {"before": counter.before, "steps": counter.steps,
            "per_step": sum(counter.per_step) / max(counter.steps, 1),
            "most_in_a_step": max(counter.per_step, default=0)}
