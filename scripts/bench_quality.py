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
import re
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
from nmt.data.manifest import MANIFEST, read_manifest

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
    """fairseq's init: nmt's without the 1/sqrt(2N) scaling of W^O and W_2 (N: each stack's)."""
    for stack, N in ((model.encoder, model.cfg.N), (model.decoder, model.cfg.decoder_layers)):
        for w in _residual_maps(stack):
            w.mul_((2 * N) ** 0.5)


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
def preprocess(corpus: Path, data: Path, vocab_size: int) -> float | None:
    """nmt-preprocess of the full en-de corpus into `data` with a `vocab_size` joint BPE; its
    wall-clock seconds, or None when `data` already holds one (of that size, else an error)."""
    if (data / MANIFEST).is_file():
        size = read_manifest(data).src_vocab_size
        if size != vocab_size:
            raise SystemExit(f"{data} has a {size} vocabulary, not --vocab {vocab_size}")
        return None
    from nmt.commands.preprocess import preprocess as run

    t0 = time.monotonic()
    run(to_object(compose("preprocess", [
        "src_lang=en", "tgt_lang=de", f"train={corpus}/train", f"valid={corpus}/valid",
        f"test={corpus}/test", f"out_dir={data}", f"bpe.vocab_size={vocab_size}"]),
        PreprocessConfig))
    return time.monotonic() - t0


def curve(run: Path, key: str = "nll") -> list[tuple[int, float]]:
    """(update, value) of the validation records of a run's metrics.jsonl that hold `key`."""
    lines = (run / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    return [(r["update"], r[key]) for r in map(json.loads, lines)
            if r["kind"] == "valid" and key in r]


def clock_training() -> dict:
    """Note the wall and process CPU seconds at the first update and at every validation
    (before it runs) of the next nmt.commands.train.train call; returns the dict they go in."""
    import nmt.commands.train

    times: dict = {"start": None, "valid": {}}
    step, track = nmt.commands.train.train_step, nmt.commands.train.validate_and_track

    def train_step(run, *args, **kwargs):
        if times["start"] is None:
            times["start"] = (time.perf_counter(), time.process_time())
        return step(run, *args, **kwargs)

    def validate_and_track(run, logs):
        wall, cpu = times["start"]
        times["valid"][run.update] = (time.perf_counter() - wall, time.process_time() - cpu)
        return track(run, logs)

    command = nmt.commands.train
    command.train_step, command.validate_and_track = train_step, validate_and_track
    return times


def train_run(args, run: Path, name: str) -> dict:
    """Train the recipe into `run`; the figures of the training (also RUN/bench.json)."""
    import resource

    from nmt.commands.train import train

    use_init(args.init)
    times = clock_training()
    overrides = [*RECIPES[args.recipe], f"data_dir={args.data}", f"run_dir={run}",
                 f"train.max_minutes={args.minutes}", f"train.max_updates={args.updates}",
                 *args.overrides]
    wall, cpu = time.perf_counter(), time.process_time()
    summary = train(to_object(compose("train", overrides), TrainConfig))
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    start = times["start"][0] - (time.perf_counter() - wall) if times["start"] else 0.0
    info = {
        "name": name, "recipe": args.recipe, "init": args.init, "overrides": args.overrides,
        "vocab": args.vocab, "clock": "cpu" if args.cpu_minutes else "wall",
        "budget_minutes": args.minutes, "budget_updates": args.updates,
        "updates": summary["update"], "epoch": summary["epoch"],
        "train_wall_s": round(wall, 1), "train_cpu_s": round(cpu, 1),
        "startup_s": round(start, 1),
        "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
        "valid_nll": curve(run), "model_nll": curve(run, "model_nll"),
        "valid_times": {u: [round(w, 1), round(c, 1)] for u, (w, c) in times["valid"].items()},
        "date": time.strftime("%Y-%m-%d %H:%M"), "commit": commit(),
    }
    (run / "bench.json").write_text(json.dumps(info, indent=1) + "\n", encoding="utf-8")
    return info


def commit() -> str:
    """The short commit of this checkout (with + when it has uncommitted changes)."""
    import subprocess

    def git(*cmd: str) -> str:
        return subprocess.run(["git", *cmd], cwd=ROOT, capture_output=True, text=True).stdout

    return git("rev-parse", "--short", "HEAD").strip() + ("+" if git("status", "--porcelain",
                                                                      "--", "nmt") else "")


def weights_to_score(args, run: Path) -> list[tuple[str, Path, str]]:
    """(label, checkpoint, weights) of each model to translate: the average of the last N
    checkpoints for each --average N (0: --checkpoint), and the EMA weights with --ema."""
    from nmt.commands.average import average

    chosen = []
    for n in args.average or [0]:
        if n == 0:
            chosen.append((args.checkpoint.removesuffix(".pt"), run / args.checkpoint, "model"))
            continue
        path = run / f"averaged{n}.pt"
        if not path.exists():
            average(to_object(compose("average", [f"run_dir={run}", f"last={n}",
                                                  f"output={path}"]), AverageConfig))
        chosen.append((f"avg{n}", path, "model"))
    if args.ema:
        chosen.append(("ema", run / "checkpoint_last.pt", "ema"))
    return chosen


def score_run(args, run: Path) -> list[dict]:
    """Translate args.split with each model, beam size and length penalty asked for; scored."""
    from nmt.commands.translate import translate

    scores = []
    for label, checkpoint, weights in weights_to_score(args, run):
        for beam in args.beam:
            for alpha in args.alpha:
                t0 = time.perf_counter()
                result = translate(to_object(compose("translate", [
                    f"checkpoint={checkpoint}", f"input={args.corpus}/{args.split}.en",
                    f"output={run}/{args.split}.{label}.b{beam}.a{alpha:g}.hyp.de",
                    f"ref={args.corpus}/{args.split}.de", f"search.beam_size={beam}",
                    f"search.alpha={alpha}", f"weights={weights}", "quiet=true",
                    *([f"comet={args.comet}"] if args.comet else [])]),
                    TranslateConfig))
                s = result.scores
                scores.append({"split": args.split, "model": label, "beam": beam,
                               "alpha": alpha, "bleu": round(s.bleu, 2),
                               "chrf": round(s.chrf, 2), "bp": brevity_penalty(s.bleu_line),
                               "seconds": round(time.perf_counter() - t0, 1)})
                if s.comet is not None:
                    scores[-1]["comet"] = round(s.comet, 4)
    return scores


def brevity_penalty(bleu_line: str) -> float:
    """BP of a sacreBLEU score line ("BLEU = 25.59 53.6/... (BP = 0.975 ratio = ...")."""
    return float(re.search(r"BP = ([0-9.]+)", bleu_line).group(1))


def report(info: dict, scores: list[dict]) -> None:
    """Print a run's training figures and scores."""
    name, points = info["name"], " ".join(f"{u}:{v:.2f}" for u, v in info["valid_nll"])
    minutes = info["train_wall_s"] / 60
    print(f"\n{name} | {info['updates']} updates in {minutes:.1f} min "
          f"(cpu {info['train_cpu_s'] / 60:.1f} min, {info['clock']} clock) | "
          f"valid nll (update:nats) {points}")
    if info["model_nll"]:
        print(f"{name} | trained weights (not the EMA) valid nll "
              f"{info['model_nll'][-1][1]:.3f}")
    if info["valid_nll"]:
        print(f"{name} | final valid ppl {math.exp(info['valid_nll'][-1][1]):.1f} | "
              f"max rss {info['max_rss_mb']} MB")
    for s in scores:
        print(f"{name} | {s['split']} beam {s['beam']} alpha {s['alpha']:g} ({s['model']}) "
              f"BLEU {s['bleu']:.2f} chrF {s['chrf']:.2f} BP {s['bp']:.3f}"
              + (f" COMET {s['comet']:.4f}" if "comet" in s else ""))


def parse_args() -> argparse.Namespace:
    """The command line."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--recipe", choices=sorted(RECIPES), default="peer")
    ap.add_argument("--minutes", type=float, default=0, help="training budget (wall clock)")
    ap.add_argument("--updates", type=int, default=0, help="training budget (updates)")
    ap.add_argument("--cpu-minutes", type=float, default=0,
                    help="training budget in CPU time of this process, all its threads together "
                         "(stands in for the clock)")
    ap.add_argument("--init", choices=sorted(INITS), default="default")
    ap.add_argument("--corpus", type=Path, default=CORPUS,
                    help="the en-de corpus: {train,valid,test}.{en,de} (default: the shared one "
                         "beside the checkout)")
    ap.add_argument("--vocab", type=int, default=0,
                    help="joint BPE vocabulary size (default: 4000 for cpu20, which is tuned "
                         "for it; 8000 for the others, the peers' runs)")
    ap.add_argument("--data", type=Path,
                    help="data directory, built once per vocabulary (default: work/quality/"
                         "data<vocab>; give a directory outside the checkout to share it)")
    ap.add_argument("--run", type=Path, help="run directory (default: work/quality/<name>)")
    ap.add_argument("--name", help="the run's label (default: recipe-init-budget)")
    ap.add_argument("--stage", choices=("all", "train", "score"), default="all",
                    help="train: only train (the timed part); score: only translate a trained run")
    ap.add_argument("--split", choices=("valid", "test"), default="valid",
                    help="what to translate and score (choose with valid; test once, at the end)")
    ap.add_argument("--beam", type=int, nargs="+", default=[4])
    ap.add_argument("--alpha", type=float, nargs="+", default=[0.6],
                    help="search.alpha (length penalty); several: each is scored")
    ap.add_argument("--checkpoint", default="checkpoint_last.pt",
                    help="what to translate: a file of the run (ignored with --average)")
    ap.add_argument("--average", type=int, nargs="+", default=[],
                    help="translate the average of the run's last N checkpoints (0: --checkpoint)")
    ap.add_argument("--ema", action="store_true",
                    help="also translate the EMA weights of checkpoint_last.pt (train.ema_decay)")
    ap.add_argument("--comet", default="",
                    help="a COMET-22 model directory: a COMET column (docs/commands.md, COMET)")
    ap.add_argument("--results", type=Path, help="append the run's figures here as a JSON line")
    ap.add_argument("overrides", nargs="*", help="nmt-train overrides (after --)")
    args = ap.parse_args()
    if args.cpu_minutes:
        args.minutes = args.cpu_minutes
    if args.stage != "score" and not (args.minutes or args.updates):
        ap.error("give --minutes, --cpu-minutes or --updates")
    args.vocab = args.vocab or (4000 if args.recipe == "cpu20" else 8000)
    args.data = args.data or ROOT / "work" / "quality" / f"data{args.vocab}"
    return args


def main() -> None:
    """Parse the arguments, run the stages, print the figures."""
    args = parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    name = args.name or f"{args.recipe}-{args.init}-" + (
        f"{args.minutes:g}min" if args.minutes else f"{args.updates}upd")
    run = args.run or ROOT / "work" / "quality" / name
    if args.stage != "score":
        if (run / "checkpoint_last.pt").exists():
            raise SystemExit(f"{run} holds a run already: remove it or give --run")
        seconds = preprocess(args.corpus, args.data, args.vocab)
        if seconds is not None:
            print(f"preprocess {args.data} (vocab {args.vocab}): {seconds:.0f} s")
        if args.cpu_minutes:
            import nmt.training.stopping

            class _CpuClock:
                monotonic = staticmethod(time.process_time)

            nmt.training.stopping.time = _CpuClock  # max_minutes counts CPU time of all threads
        info = train_run(args, run, name)
    else:
        info = json.loads((run / "bench.json").read_text(encoding="utf-8"))
    scores = score_run(args, run) if args.stage != "train" else []
    report(info, scores)
    if args.results:
        with open(args.results, "a", encoding="utf-8") as f:
            f.write(json.dumps({**info, "scores": scores}) + "\n")


if __name__ == "__main__":
    main()
