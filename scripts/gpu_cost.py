"""What nmt-train and decoding would cost on a GPU, counted on a simulated one (no GPU needed).

For the Transformer base and big of the WMT14 recipe (37k joint vocabulary, bf16 autocast, EMA
kept, clipping on) at the recipe's per-GPU batch (max_tokens 4096 on 8 GPUs) and at the
paper's whole 25k-token update on one GPU: the operators launched per update (forward,
backward, optimizer), the host reads per update, the peak of live device memory through an
update (parameters, gradients, Adam's state, the EMA, activations and the loss's transients),
the FLOPs and bytes behind them; the loss alone at 25k target tokens; the host reads per
decoding step of greedy and beam search (on the CPU's real tensors). Then an estimate for one
80 GB H100 from the counted FLOPs and bytes, under the assumptions printed with it.
nmt/testing/gpu_cost.py does the counting (docs/gpu.md explains it and shows this output);
tests/system/test_gpu_cost.py fails when a figure grows more than 10% past tests/gpu_cost.json.

    .venv/bin/python scripts/gpu_cost.py                     # the tables of docs/gpu.md
    .venv/bin/python scripts/gpu_cost.py --record tests/gpu_cost.json   # new reference values
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from nmt.config import SearchConfig, compose
from nmt.testing.gpu_cost import decoding_reads, loss_memory, update_costs
from nmt.testing.gpu_sim import MISSING

GiB = 2 ** 30
LENGTH = 32  # tokens per sentence on each side of the synthetic batches (no padding)
BATCHES = {"8 GPUs x 4096": 128, "1 GPU x 25.6k": 800}  # sentences per batch: 4096, 25600
# One H100 SXM 80 GB, bf16 (estimates until measured): datasheet dense bf16 peak; the GEMM
# rates that transformer-sized matrix products reach (d_model 512: 500, 1024: 600 TFLOP/s);
# the HBM3 bandwidth elementwise kernels reach (of 3.35 TB/s); the host's cost of launching
# one operator in eager PyTorch; the memory nmt may use (CUDA context and allocator slack
# taken off 80 GB).
H100 = {"peak": 989e12, "gemm": {"base": 500e12, "big": 600e12}, "bandwidth": 2.8e12,
        "launch_s": 10e-6, "usable_bytes": 72e9}


def parse_args() -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="base,big")
    p.add_argument("--vocab", type=int, default=37000)
    p.add_argument("--no-decoding", action="store_true", help="skip the CPU decoding counts")
    p.add_argument("--record", default="", help="write the figures tests check to this JSON")
    return p.parse_args()


def measure_updates(models: list[str], vocab: int) -> dict:
    """update_cost of each model at each batch size (one run a model: update_costs):
    {model: {tokens: figures}}."""
    return {m: {str(B * LENGTH): cost for B, cost in zip(
        BATCHES.values(), update_costs(m, vocab, list(BATCHES.values()), LENGTH), strict=True)}
            for m in models}


def update_table(costs: dict) -> str:
    """The per-update figures, one row per model and batch."""
    rows = ["| model | tokens / batch | operators fwd / bwd / optim | host reads | peak memory "
            "| GFLOP / token | MB moved / token (fwd+bwd, optim) |", "|" + " --- |" * 7]
    for model, by_size in costs.items():
        for (label, _), (tokens, c) in zip(BATCHES.items(), by_size.items(), strict=True):
            n = int(tokens)
            layers = (c["bytes"]["forward"] + c["bytes"]["backward"]) / n / 1e6
            rows.append(f"| {model} | {n:,} ({label}) | {c['forward']} / {c['backward']} / "
                        f"{c['optimizer']} | {c['host_reads']} | {c['peak_bytes'] / GiB:.2f} GiB "
                        f"| {c['flops'] / n / 1e9:.2f} | {layers:.2f}, "
                        f"{c['bytes']['optimizer'] / n / 1e6:.2f} |")
    return "\n".join(rows)


def estimate(model: str, c: dict, loss_bytes_per_token: float) -> dict:
    """Target tokens/s and MFU on one H100 for an update of figures c: GEMMs at the assumed
    rate plus the other operators' bytes at the assumed bandwidth (no overlap), or the host's
    launches when they take longer; then with torch.compile (elementwise traffic halved,
    launches / 10) and also a fused cross-entropy (the loss's traffic gone)."""
    tokens, ops = c["tokens"], c["forward"] + c["backward"] + c["optimizer"]
    gemm_s, moved = c["flops"] / H100["gemm"][model], sum(c["bytes"].values())
    out = {}
    for variant, traffic, launches in (
            ("eager", moved, ops),
            ("compile", moved / 2, ops / 10),
            ("compile + fused loss", (moved - loss_bytes_per_token * tokens) / 2, ops / 10)):
        device_s = gemm_s + traffic / H100["bandwidth"]
        step = max(device_s, launches * H100["launch_s"])
        out[variant] = {"tokens_per_s": tokens / step, "mfu": c["flops"] / step / H100["peak"],
                        "launch_bound": launches * H100["launch_s"] > device_s}
    return out


def memory_fit(by_size: dict) -> tuple[float, float, int]:
    """Peak memory as fixed + per-token bytes (a line through the two batch sizes), and the
    largest batch that fits the usable memory of an 80 GB GPU."""
    (n1, c1), (n2, c2) = ((int(k), v) for k, v in by_size.items())
    per_token = (c2["peak_bytes"] - c1["peak_bytes"]) / (n2 - n1)
    fixed = c1["peak_bytes"] - per_token * n1
    return fixed, per_token, int((H100["usable_bytes"] - fixed) / per_token)


def estimate_table(costs: dict, loss: dict) -> str:
    """The H100 estimates, one row per model and batch."""
    per_token = loss["bytes"] / loss["tokens"]
    rows = ["| model | tokens / batch | eager: tokens/s (MFU) | + compile | + compile, fused "
            "loss | largest batch in 80 GB |", "|" + " --- |" * 6]
    for model, by_size in costs.items():
        _, _, fits = memory_fit(by_size)
        for tokens, c in by_size.items():
            e = estimate(model, c, per_token)
            cells = [f"{v['tokens_per_s'] / 1e3:,.0f}k ({v['mfu']:.0%}"
                     f"{', launch-bound' if v['launch_bound'] else ''})" for v in e.values()]
            rows.append(f"| {model} | {int(tokens):,} | {' | '.join(cells)} | {fits:,} tokens |")
    return "\n".join(rows)


def decoding_table(models: list[str], vocab: int) -> tuple[str, dict]:
    """Host reads per decoding step of greedy and beam 4 search (FastModel, fp32, the CPU)
    for 8 sentences with random weights; and the figures."""
    from nmt.config import ModelConfig
    from nmt.decoding.batches import decoding_models
    from nmt.model import Transformer

    g = torch.Generator().manual_seed(0)
    sources = [torch.randint(4, vocab, (10,), generator=g).tolist() for _ in range(8)]
    rows, figures = ["| model | search | reads before the steps | reads per step (most) |",
                     "| --- | --- | --- | --- |"], {}
    for model in models:
        cfg = ModelConfig(**compose("train", [f"+model={model}", "data_dir=-",
                                              "run_dir=-"]).model)
        torch.manual_seed(0)
        prepared = decoding_models(Transformer(cfg, vocab, vocab, 0, True).eval(), SearchConfig())
        for beam in (1, 4):
            r = decoding_reads(prepared, sources, SearchConfig(beam_size=beam, max_len_b=10))
            name = "greedy" if beam == 1 else f"beam {beam}"
            figures[f"{model} {name}"] = r["per_step"]
            rows.append(f"| {model} | {name} | {r['before']} | {r['per_step']:.2f} "
                        f"({r['most_in_a_step']}) |")
    return "\n".join(rows), figures


def main() -> None:
    args = parse_args()
    if MISSING:
        sys.exit(f"gpu_cost.py: {MISSING}")
    torch.set_num_threads(1)
    models = args.models.split(",")
    start = time.monotonic()
    costs = measure_updates(models, args.vocab)
    loss = {**loss_memory(25000, args.vocab), "tokens": 25000}
    print(f"## One update on the simulated GPU (vocabulary {args.vocab:,}, bf16, EMA, "
          f"clipping)\n\n{update_table(costs)}\n")
    print(f"## The loss alone at 25,000 target tokens: logits {loss['logits_bytes'] / GiB:.2f} "
          f"GiB (bf16); kept for backward beyond them {loss['kept_bytes'] / GiB:.2f} GiB; peak "
          f"beyond them {loss['peak_extra_bytes'] / GiB:.2f} GiB (their gradient included); "
          f"{loss['forward']} + {loss['backward']} operators\n")
    for model, by_size in costs.items():
        fixed, per_token, fits = memory_fit(by_size)
        print(f"{model}: peak memory = {fixed / GiB:.2f} GiB + {per_token / 2 ** 10:.0f} KiB "
              f"per target token: {fits:,} tokens fit in {H100['usable_bytes'] / 1e9:.0f} GB")
    print(f"\n## Estimate for one H100 (assumptions: {json.dumps(H100)})\n\n"
          f"{estimate_table(costs, loss)}\n")
    figures = {"update": {m: {t: {k: c[k] for k in ("forward", "backward", "optimizer",
                                                      "host_reads", "peak_bytes")}
                              for t, c in by_size.items()} for m, by_size in costs.items()},
               "loss_25000": {k: loss[k] for k in ("kept_bytes", "peak_extra_bytes")}}
    if not args.no_decoding:
        table, figures["decoding_reads_per_step"] = decoding_table(models, args.vocab)
        print(f"## Host reads per decoding step (CPU, FastModel fp32, 8 sentences)\n\n{table}\n")
    print(f"({time.monotonic() - start:.0f} s, torch {torch.__version__})")
    if args.record:
        Path(args.record).write_text(json.dumps(figures, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
