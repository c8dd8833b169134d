"""Quality benchmark on the full debian-po corpus: preprocess, train, translate, score.

Runs a recipe end to end as a user would (nmt-preprocess's 8k joint BPE, nmt-train, beam-4
nmt-translate of the test set with sacreBLEU) and prints the validation NLL curve, the final
perplexity and the test BLEU / chrF. Two uses:

  # the peers' recipe (issue "learn per update"), for 20 minutes as fairseq was run
  python scripts/bench_quality.py --recipe peer --minutes 20
  # equal-update ablations of the initialisation (docs/results.md, "Learning per update")
  python scripts/bench_quality.py --recipe peer --updates 500 --init xavier
  # the best 20-minute recipe (configs/recipe/cpu20.yaml)
  python scripts/bench_quality.py --recipe cpu20 --minutes 20 --average 3 --alpha 1.5

Anything after `--` is passed to nmt-train as overrides (e.g. `-- train.threads=1`).
Nothing here changes nmt itself: --init re-initialises the freshly built model with one of
the variants below before training starts.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import time
from pathlib import Path

import torch
from torch import nn

from nmt import model as nmt_model
from nmt.config import (
    AverageConfig,
    PreprocessConfig,
    TrainConfig,
    TranslateConfig,
    compose,
    to_object,
)

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT.parent / "shared" / "data" / "debian-po" / "en-de"

# The recipe fairseq 0.12.2 and OpenNMT-py 3.5.1 were run with (3+3 layers, d_model 256,
# pre-norm, dropout 0.1, lr 2e-3 after 64 warmup updates, 4,096-token batches, fp32).
RECIPES = {
    "peer": ["+model=small", "model.norm=pre", "model.dropout=0.1", "model.attention_dropout=0.1",
             "optim.lr_factor=0.256", "optim.warmup=64", "optim.label_smoothing=0.1",
             "train.max_tokens=4096", "train.save_interval_updates=125",
             "train.valid_interval_updates=125", "train.seed=1234"],
    # the paper's post-norm at small size (configs/model/small.yaml once said it stalled)
    "post": ["+model=small", "model.norm=post", "optim.lr_factor=2", "optim.warmup=1000",
             "train.max_tokens=4096", "train.save_interval_updates=125",
             "train.valid_interval_updates=125", "train.seed=1234"],
    "explore": ["train.save_interval_updates=500", "train.valid_interval_updates=500",
                "train.keep_last=5", "train.seed=1234", "train.amp=bf16", "train.log_interval=100"],
    "cpu20": ["+recipe=cpu20"],
}


# ----------------------------------------------------------------------------- init variants
def _torch_default_biases(model: nn.Module) -> None:
    """nn.Linear's own bias init: U(-1/sqrt(fan_in), 1/sqrt(fan_in))."""
    for m in model.modules():
        if isinstance(m, nn.Linear) and m.bias is not None:
            bound = m.in_features ** -0.5
            nn.init.uniform_(m.bias, -bound, bound)


def _embeddings(model: nn.Module) -> list[torch.Tensor]:
    """The distinct embedding / projection matrices (one when all three are tied)."""
    return list({id(w): w for w in (model.src_embed.lut.weight, model.tgt_embed.lut.weight,
                                     model.generator.weight)}.values())


def _residual_maps(model) -> list[torch.Tensor]:
    """The weights of W^O and W_2, the maps that add into the residual stream."""
    return [p for n, p in model.named_parameters() if n.endswith(("W_o.weight", "W_2.weight"))]


def fairseq(model) -> None:
    """fairseq's init: nmt's without the 1/sqrt(2N) scaling of W^O and W_2."""
    for w in _residual_maps(model):
        w.mul_((2 * model.cfg.N) ** 0.5)


def xavier(model) -> None:
    """Before the fix: Xavier-uniform on every matrix (the V x d embedding too), torch biases."""
    fairseq(model)
    for w in _embeddings(model):
        nn.init.xavier_uniform_(w)
    _torch_default_biases(model)


def normal_embeddings(model) -> None:
    """The issue's first step: embeddings N(0, d^-0.5) but torch biases, no zero padding row."""
    fairseq(model)
    for w in _embeddings(model):
        nn.init.normal_(w, std=model.cfg.d_model ** -0.5)
    _torch_default_biases(model)


def torch_biases(model) -> None:
    """fairseq's init but for the biases: nn.Linear's own U(-1/sqrt(fan_in), 1/sqrt(fan_in))."""
    fairseq(model)
    _torch_default_biases(model)


def padding_row_kept(model) -> None:
    """fairseq's init but for the padding row, drawn like the others."""
    fairseq(model)
    for w in _embeddings(model):
        nn.init.normal_(w, std=model.cfg.d_model ** -0.5)


def qkv_per_projection(model) -> None:
    """fairseq's init with W^Q, W^K, W^V each Xavier over (d x d): sqrt(2) wider than nmt's
    fused (3d x d) draw (fairseq itself uses gain 1/sqrt(2) per projection: nmt's bound)."""
    fairseq(model)
    d = model.cfg.d_model
    for name, w in model.named_parameters():
        if name.endswith(("W_qkv.weight", "W_q.weight", "W_kv.weight")):
            for block in w.split(d):
                nn.init.xavier_uniform_(block)


def output_half(model) -> None:
    """fairseq's init with the tied projection's logits at half scale (embeddings unchanged)."""
    fairseq(model)
    generator = model.generator
    generator.forward = lambda x: nn.functional.linear(x, generator.weight) * 0.5


INITS = {"default": None, "fairseq": fairseq, "xavier": xavier,
         "normal_embeddings": normal_embeddings, "torch_biases": torch_biases,
         "padding_row_kept": padding_row_kept, "qkv_per_projection": qkv_per_projection,
         "output_half": output_half}


def use_init(name: str) -> None:
    """Make every Transformer built from now on apply variant `name` after its own init."""
    variant, original = INITS[name], nmt_model.Transformer.reset_parameters
    if variant is None:
        return

    def reset_parameters(self) -> None:
        original(self)
        with torch.no_grad():
            variant(self)

    nmt_model.Transformer.reset_parameters = reset_parameters


# ----------------------------------------------------------------------------- the steps
def preprocess(data: Path, vocab_size: int) -> None:
    """nmt-preprocess of the full en-de corpus (skipped when `data` already holds one)."""
    if (data / "manifest.json").is_file():
        return
    from nmt.preprocess import preprocess as run

    run(to_object(compose("preprocess", [
        "src_lang=en", "tgt_lang=de", f"train={CORPUS}/train", f"valid={CORPUS}/valid",
        f"test={CORPUS}/test", f"out_dir={data}", f"bpe.vocab_size={vocab_size}"]),
        PreprocessConfig))


def curve(run: Path) -> list[dict]:
    """The validation records of a run's metrics.jsonl."""
    lines = (run / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == "valid"]


def main() -> None:
    """Parse the arguments, run the steps, print the figures."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--recipe", choices=sorted(RECIPES), default="peer")
    ap.add_argument("--minutes", type=float, default=0, help="training budget (wall clock)")
    ap.add_argument("--updates", type=int, default=0, help="training budget (updates)")
    ap.add_argument("--cpu-minutes", type=float, default=0,
                    help="training budget in CPU time of this process (stands in for the clock)")
    ap.add_argument("--init", choices=sorted(INITS), default="default")
    ap.add_argument("--data", type=Path, default=ROOT / "work" / "quality" / "data8k")
    ap.add_argument("--run", type=Path, help="run directory (default: work/quality/<name>)")
    ap.add_argument("--beam", type=int, default=4)
    ap.add_argument("--alpha", type=float, default=0.6, help="search.alpha (length penalty)")
    ap.add_argument("--vocab", type=int, default=8000)
    ap.add_argument("--checkpoint", default="checkpoint_last.pt",
                    help="what to translate: a file of the run (ignored with --average)")
    ap.add_argument("--average", type=int, default=0,
                    help="translate the average of the run's last N checkpoints")
    ap.add_argument("overrides", nargs="*", help="nmt-train overrides (after --)")
    args = ap.parse_args()
    if args.cpu_minutes:
        import nmt.train

        class _CpuClock:
            monotonic = staticmethod(time.process_time)

        nmt.train.time = _CpuClock  # max_minutes and tokens/s count CPU time
        args.minutes = args.cpu_minutes
    if not (args.minutes or args.updates):
        ap.error("give --minutes or --updates")
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    name = f"{args.recipe}-{args.init}-" + (f"{args.minutes:g}min" if args.minutes
                                             else f"{args.updates}upd")
    run = args.run or ROOT / "work" / "quality" / name
    if (run / "checkpoint_last.pt").exists():
        ap.error(f"{run} holds a run already: remove it or give --run")
    preprocess(args.data, args.vocab)
    use_init(args.init)
    from nmt.train import train

    overrides = [*RECIPES[args.recipe], f"data_dir={args.data}", f"run_dir={run}",
                 f"train.max_minutes={args.minutes}", f"train.max_updates={args.updates}",
                 *args.overrides]
    t0 = time.monotonic()
    summary = train(to_object(compose("train", overrides), TrainConfig))
    minutes = (time.monotonic() - t0) / 60
    checkpoint = run / args.checkpoint
    if args.average:
        from nmt.checkpoint import average

        checkpoint = run / "averaged.pt"
        average(to_object(compose("average", [f"run_dir={run}", f"last={args.average}",
                                              f"output={checkpoint}"]), AverageConfig))
    from nmt.translate import translate

    result = translate(to_object(compose("translate", [
        f"checkpoint={checkpoint}", f"input={CORPUS}/test.en", f"output={run}/test.hyp.de",
        f"ref={CORPUS}/test.de", f"search.beam_size={args.beam}", f"search.alpha={args.alpha}",
        "quiet=true"]), TranslateConfig))
    points = " ".join(f"{r['update']}:{r['nll']:.2f}" for r in curve(run))
    print(f"\n{name} | {summary['update']} updates in {minutes:.1f} min | valid nll (update:nats) "
          f"{points}\n{name} | final valid ppl {math.exp(curve(run)[-1]['nll']):.1f} | "
          f"test beam {args.beam} alpha {args.alpha:g} ({checkpoint.name}) "
          f"BLEU {result['scores']['bleu']:.2f} chrF {result['scores']['chrf']:.2f}")


if __name__ == "__main__":
    main()
