"""nmt-train: the contract commands, bitwise resume, stopping rules, outputs and checkpoints."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import make_corpora_dir, make_data_dir
from omegaconf import OmegaConf

import nmt.commands.train
import nmt.system.runtime
import nmt.training.run
import nmt.training.stopping
import nmt.training.validation
from nmt.commands.train import load_data, train
from nmt.config import TrainConfig, compose, to_object
from nmt.data.tokenizer import Tokenizer
from nmt.errors import NmtError
from nmt.model import make_model
from nmt.system import distributed
from nmt.training.checkpoint import load_checkpoint

# No curves.png and no TensorBoard files (a draw costs ~0.1 s a validation): the tests that
# look at them turn them on (test_learning_curves_and_tensorboard_scalars).
TINY = ["model.N=1", "model.d_model=32", "model.d_ff=64", "model.h=4", "train.threads=1",
        "train.max_tokens=256", "train.log_interval=2", "train.plot=false",
        "train.tensorboard=false"]
BIN = Path(sys.executable).parent


def config(data_dir, run_dir, *overrides) -> TrainConfig:
    """A tiny training config composed exactly as the command line would."""
    return to_object(compose("train", ["+model=small", f"data_dir={data_dir}",
                                       f"run_dir={run_dir}", *TINY, *overrides]), TrainConfig)


def nmt_train(*args) -> subprocess.CompletedProcess:
    """Run the nmt-train command."""
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    return subprocess.run([str(BIN / "nmt-train"), *args], capture_output=True, text=True,
                          env=env, timeout=120)


def same_tensors(a: dict, b: dict) -> bool:
    """Bitwise equality of two state dicts (nested dicts and lists of tensors allowed)."""
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same_tensors(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(same_tensors(x, y) for x, y in zip(a, b, strict=True))
    return a == b


@pytest.mark.long
def test_contract_commands_train_then_resume(tiny_data_dir, tmp_path):
    run = tmp_path / "run"
    common = ["+model=small", f"data_dir={tiny_data_dir}", f"run_dir={run}",
              "train.max_tokens=512", "model.N=1", "model.d_model=32"]  # small's d_ff: 1024
    first = nmt_train(*common, "train.max_updates=4", "train.save_interval_updates=2")
    assert first.returncode == 0, first.stderr
    assert {p.name for p in run.glob("checkpoint_*.pt")} == {
        "checkpoint_2.pt", "checkpoint_4.pt", "checkpoint_last.pt", "checkpoint_best.pt"}
    assert (run / "config.yaml").is_file() and (run / "metrics.jsonl").is_file()
    second = nmt_train(*common, "train.max_updates=6", "train.save_interval_updates=2")
    assert second.returncode == 0, second.stderr
    assert "resumed from" in second.stdout + second.stderr
    state = load_checkpoint(run / "checkpoint_last.pt")
    assert state["update"] == 6 and (run / "checkpoint_6.pt").is_file()
    wrong = nmt_train(*common, "train.max_updates=8", "model.d_ff=512")
    assert wrong.returncode == 1
    assert wrong.stderr.strip().count("\n") == 0 and "nmt-train: error:" in wrong.stderr
    assert "d_ff=1024 != 512" in wrong.stderr


@pytest.mark.parametrize("data", ["one corpus", "weighted corpora, subword sampling",
                                  "weighted corpora, augment"])
@pytest.mark.slow
def test_resume_is_bitwise_identical(tmp_path, data):
    straight, interrupted = tmp_path / "straight", tmp_path / "interrupted"
    opts = ["train.update_freq=2", "train.save_interval_updates=5", "model.dropout=0.1",
            "train.ema_decay=0.99"]
    if data == "one corpus":
        data = make_data_dir(tmp_path / "data", n_train=150)  # a few batches: epochs roll over
    elif data.endswith("subword sampling"):  # 50 + 2 x 30 pairs an epoch; batches mix the
        data = make_corpora_dir(tmp_path / "data", n_real=50, n_bt=30)  # corpora, before
        opts += ["train.subword_sampling=0.2"]  # and after the resume
    else:  # every modifier drawn often, in both epochs
        data = make_corpora_dir(tmp_path / "data", n_real=50, n_bt=30)
        opts += [f"train.augment.{k}=0.3" for k in ("uppercase", "titlecase", "typos",
                                                     "drop_punctuation")]
    train(config(data, straight, "train.max_updates=12", *opts))
    train(config(data, interrupted, "train.max_updates=5", *opts))
    assert load_checkpoint(interrupted / "checkpoint_last.pt")["update"] == 5
    summary = train(config(data, interrupted, "train.max_updates=12", *opts))
    assert summary["epoch"] >= 2  # the resumed part crossed an epoch boundary
    a = load_checkpoint(straight / "checkpoint_last.pt")
    b = load_checkpoint(interrupted / "checkpoint_last.pt")
    assert a["update"] == b["update"] == 12
    assert same_tensors(a["model"], b["model"])
    assert same_tensors(a["optimizer"], b["optimizer"])
    assert same_tensors(a["ema"], b["ema"]) and not same_tensors(a["ema"], a["model"])
    assert a["iterator"] == b["iterator"] and a["scheduler"] == b["scheduler"]
    assert not [k for k in a if "rng" in k.lower()]  # exact without RNG state: see micro_batch_seed
    if "train.subword_sampling=0.2" in opts:  # both corpora before and after the resume
        itr = load_data(config(data, tmp_path / "x", *opts), distributed.init("cpu")).train
        epoch = itr.global_batches(1)
        assert len(epoch) > 14  # updates 1-5 are its first 10 batches, 6-7 the next 4
        for part in (epoch[:10], epoch[10:14]):
            corpus = np.concatenate(part) >= 50  # the tagged corpus follows 50 pairs
            assert corpus.any() and not corpus.all()


def test_resume_with_another_vocabulary_is_an_error(tiny_data_dir, tmp_path):
    run = tmp_path / "run"
    train(config(tiny_data_dir, run, "train.max_updates=2"))
    other = make_data_dir(tmp_path / "other", vocab_size=100)
    with pytest.raises(NmtError, match="vocabulary differs") as e:
        train(config(other, run, "train.max_updates=4"))
    assert "\n" not in str(e.value)


def test_nonfinite_losses_are_skipped_then_stop_the_run(tiny_data_dir, tmp_path, monkeypatch):
    real, calls = nmt.commands.train.batch_loss, []

    def flaky(*args, **kwargs):
        loss, nll = real(*args, **kwargs)
        calls.append(1)
        return (loss * float("nan"), nll) if len(calls) in (2, 3) else (loss, nll)

    monkeypatch.setattr(nmt.commands.train, "batch_loss", flaky)
    out = train(config(tiny_data_dir, tmp_path / "a", "train.max_updates=5",
                       "train.valid_interval_updates=100"))
    assert out["update"] == 5 and out["nonfinite"] == 2
    monkeypatch.setattr(nmt.commands.train, "batch_loss",
                        lambda *a, **k: (real(*a, **k)[0] * np.inf, real(*a, **k)[1]))
    with pytest.raises(NmtError, match="3 consecutive non-finite losses"):
        train(config(tiny_data_dir, tmp_path / "b", "train.max_updates=5",
                     "train.max_nonfinite=3"))


def test_a_skipped_update_moves_nothing(tiny_data_dir, tmp_path, monkeypatch):
    """A non-finite update counts for update and max_updates, as train.max_updates' doc
    says, but leaves the weights, Adam's state, the EMA and the learning-rate schedule as
    they were; the next update applies normally."""
    real, calls = nmt.commands.train.batch_loss, []

    def nan_in_update_3(*args, **kwargs):
        loss, nll = real(*args, **kwargs)
        calls.append(1)
        return (loss * float("nan"), nll) if len(calls) == 3 else (loss, nll)

    opts = ("train.valid_interval_updates=100", "train.ema_decay=0.9",
            "train.save_interval_updates=1", "train.keep_last=0")
    monkeypatch.setattr(nmt.commands.train, "batch_loss", nan_in_update_3)
    out = train(config(tiny_data_dir, tmp_path / "run", "train.max_updates=4", *opts))
    assert out["update"] == 4 and out["nonfinite"] == 1
    two, three, four = (load_checkpoint(tmp_path / f"run/checkpoint_{u}.pt") for u in (2, 3, 4))
    for key in ("model", "ema"):
        assert all(torch.equal(two[key][k], three[key][k]) for k in two[key])
        assert not all(torch.equal(three[key][k], four[key][k]) for k in three[key])
    steps = [[s["step"].item() for s in c["optimizer"]["state"].values()][0]
             for c in (two, three, four)]
    assert steps == [2, 2, 3]  # Adam's own step (bias correction) skips
    assert [c["scheduler"]["applied"] for c in (two, three, four)] == [2, 2, 3]


def skip_update(monkeypatch, skipped: set[int]) -> None:
    """Inject inf gradients (the loss stays finite, as in an fp16 overflow) into the updates
    numbered in `skipped`, whatever run, resumed or not, makes them."""
    real_step, real_norm = nmt.commands.train.train_step, nmt.commands.train.normalise_gradients

    def inf_gradients(params, *args, **kwargs):
        params[0].grad.fill_(math.inf)
        return real_norm(params, *args, **kwargs)

    def train_step(run, *args, **kwargs):
        with monkeypatch.context() as m:
            if run.update + 1 in skipped:
                m.setattr(nmt.commands.train, "normalise_gradients", inf_gradients)
            return real_step(run, *args, **kwargs)

    monkeypatch.setattr(nmt.commands.train, "train_step", train_step)


@pytest.mark.slow
def test_a_skipped_update_leaves_the_schedule_and_resumes_bitwise(tiny_data_dir, tmp_path,
                                                                   monkeypatch):
    """Update 2's inf gradients skip it: it counts for max_updates (6 done) but not for the
    learning rate, which after 6 updates is noam_lr(6) (5 applied), as Adam's step count.
    Interrupted after the skip and resumed, the run ends bitwise as the straight one."""
    from nmt.training.schedule import noam_lr

    skip_update(monkeypatch, {2})
    opts = ["train.save_interval_updates=3", "train.valid_interval_updates=100",
            "train.ema_decay=0.9"]
    out = train(config(tiny_data_dir, tmp_path / "straight", "train.max_updates=6", *opts))
    assert out["update"] == 6 and out["nonfinite"] == 1
    train(config(tiny_data_dir, tmp_path / "resumed", "train.max_updates=3", *opts))
    train(config(tiny_data_dir, tmp_path / "resumed", "train.max_updates=6", *opts))
    a = load_checkpoint(tmp_path / "straight/checkpoint_last.pt")
    b = load_checkpoint(tmp_path / "resumed/checkpoint_last.pt")
    assert a["update"] == 6 and a["scheduler"] == {"applied": 5, "updates": 6, "cooldown": None}
    assert all(s["step"].item() == 5 for s in a["optimizer"]["state"].values())
    cfg = config(tiny_data_dir, tmp_path, "train.max_updates=6").optim
    lr = a["optimizer"]["param_groups"][0]["lr"]
    assert math.isclose(lr.item(), noam_lr(6, 32, cfg.warmup, cfg.lr_factor), rel_tol=1e-12)
    assert a["scheduler"] == b["scheduler"] and a["iterator"] == b["iterator"]
    for key in ("model", "optimizer", "ema"):
        assert same_tensors(a[key], b[key]), key


def test_a_cooldown_of_max_updates_ends_at_rate_zero_and_resumes_bitwise(tiny_data_dir,
                                                                        tmp_path, monkeypatch):
    """optim.cooldown=0.5 of 12 updates: the rate falls over updates 7-12 and is 0 after the
    last; a run killed at update 9 (checkpoint at 5) and resumed ends bitwise as the straight
    one."""
    from nmt.training.schedule import cooldown_factor, noam_lr

    opts = ["train.max_updates=12", "optim.cooldown=0.5", "train.save_interval_updates=5",
            "train.valid_interval_updates=100"]
    train(config(tiny_data_dir, tmp_path / "straight", *opts))
    real_step = nmt.commands.train.train_step

    def crash_at_9(run, *args, **kwargs):
        if run.update + 1 == 9:
            raise RuntimeError("killed")
        return real_step(run, *args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(nmt.commands.train, "train_step", crash_at_9)
        with pytest.raises(RuntimeError, match="killed"):
            train(config(tiny_data_dir, tmp_path / "resumed", *opts))
    train(config(tiny_data_dir, tmp_path / "resumed", *opts))
    a = load_checkpoint(tmp_path / "straight/checkpoint_last.pt")
    b = load_checkpoint(tmp_path / "resumed/checkpoint_last.pt")
    assert a["update"] == 12 and a["scheduler"] == {"applied": 12, "updates": 12,
                                                    "cooldown": [6, 6]}
    assert a["optimizer"]["param_groups"][0]["lr"] == 0.0  # the rate an update 13 would get
    cfg = config(tiny_data_dir, tmp_path, *opts).optim
    ten = load_checkpoint(tmp_path / "straight/checkpoint_10.pt")["optimizer"]
    assert math.isclose(ten["param_groups"][0]["lr"], noam_lr(11, 32, cfg.warmup, cfg.lr_factor)
                        * cooldown_factor(11, 6, 6), rel_tol=1e-12)
    assert a["scheduler"] == b["scheduler"] and a["iterator"] == b["iterator"]
    for key in ("model", "optimizer"):
        assert same_tensors(a[key], b[key]), key


def test_a_timed_cooldown_starts_at_its_share_of_the_time(tiny_data_dir, tmp_path,
                                                          monkeypatch):
    """max_minutes 0.2 (12 s of a clock that ticks 1 s an update), cooldown 0.25: update 10
    starts at 9 s, the share's end, so 10 updates took 3/4 of the time and the last 1/4 is
    worth round(10 / 3) = 3 more: updates 11-13 cool down and training ends there."""
    clock = {"now": 0.0}

    class Clock:
        @staticmethod
        def monotonic() -> float:
            return clock["now"]

    real_step = nmt.commands.train.train_step

    def ticking_step(*args, **kwargs):
        out = real_step(*args, **kwargs)
        clock["now"] += 1.0
        return out

    monkeypatch.setattr(nmt.training.stopping, "time", Clock)  # the deadline's, the cooldown's
    monkeypatch.setattr(nmt.commands.train, "train_step", ticking_step)
    out = train(config(tiny_data_dir, tmp_path / "run", "train.max_minutes=0.2",
                       "optim.cooldown=0.25", "train.valid_interval_updates=100"))
    assert out["update"] == 13 and "cooldown" in out["reason"], out
    state = load_checkpoint(tmp_path / "run/checkpoint_last.pt")
    assert state["scheduler"]["cooldown"] == [10, 3]
    assert state["optimizer"]["param_groups"][0]["lr"] == 0.0


def test_early_stopping_with_patience(tiny_data_dir, tmp_path, monkeypatch):
    losses = iter([3.0, 2.0, 2.5, 2.1, 1.0, 0.5])
    monkeypatch.setattr(nmt.training.validation, "validate",
                        lambda run: {"loss": next(losses), "nll": 1.0, "ppl": 2.7})
    out = train(config(tiny_data_dir, tmp_path / "run", "train.max_updates=100",
                       "train.valid_interval_updates=1", "train.patience=2"))
    assert out["update"] == 4 and "early stopping" in out["reason"]
    assert out["best"] == 2.0
    records = [json.loads(x) for x in (tmp_path / "run/metrics.jsonl").read_text().splitlines()]
    assert [r["loss"] for r in records if r["kind"] == "valid"] == [3.0, 2.0, 2.5, 2.1]
    assert load_checkpoint(tmp_path / "run/checkpoint_best.pt")["update"] == 2


def test_with_an_ema_validation_and_the_best_checkpoint_judge_the_ema(tiny_data_dir, tmp_path,
                                                                    monkeypatch):
    """train.ema_decay: `loss` (best, patience) is the EMA's, the weights nmt-translate uses
    by default; the trained weights' loss is logged as model_loss."""
    scripted = {"ema": iter([3.0, 1.0, 2.0]), "model": iter([1.0, 3.0, 0.5])}
    seen = []

    def valid_loss(run, model):
        which = "ema" if model is run.ema else "model"
        seen.append(which)
        return {"loss": next(scripted[which]), "nll": 1.0, "ppl": 2.7, "tokens": 1,
                "skipped": 0}

    monkeypatch.setattr(nmt.training.validation, "valid_loss", valid_loss)
    out = train(config(tiny_data_dir, tmp_path / "run", "train.max_updates=3",
                       "train.valid_interval_updates=1", "train.ema_decay=0.9"))
    assert seen == ["ema", "model"] * 3 and out["best"] == 1.0
    records = [json.loads(x) for x in (tmp_path / "run/metrics.jsonl").read_text().splitlines()]
    valid = [r for r in records if r["kind"] == "valid"]
    assert [(r["loss"], r["model_loss"]) for r in valid] == [(3.0, 1.0), (1.0, 3.0), (2.0, 0.5)]
    assert load_checkpoint(tmp_path / "run/checkpoint_best.pt")["update"] == 2


def direct_valid_loss(data_dir: Path, path: Path, weights: str, smoothing: float) -> float:
    """The per-token label-smoothed valid loss of a checkpoint's `weights` ("model" or "ema"),
    computed here: the model's forward pass and the loss over every valid batch."""
    import contextlib

    from nmt.data.arrays import ParallelData
    from nmt.data.batches import EpochBatchIterator
    from nmt.engines.translator import Translator

    model = Translator.load(path, weights=weights, dtype=None).model.eval()
    pad = load_checkpoint(path)["vocab"]["pad_id"]
    total, tokens = 0.0, 0
    with torch.no_grad():
        for _, batch in EpochBatchIterator(ParallelData(data_dir, "valid"), 10_000, 1, pad,
                                           shuffle=False, lockstep=False):
            total += nmt.training.run.batch_loss(model, batch, smoothing, pad,
                                                 contextlib.nullcontext)[0].item()
            tokens += batch.tgt_tokens
    return total / tokens


def test_the_valid_loss_is_the_ema_checkpoints_loss(tiny_data_dir, tmp_path):
    """With an EMA, the valid loss (and best, and checkpoint_best.pt) is the EMA's loss
    computed directly from the checkpoint; model_loss the trained weights'."""
    run = tmp_path / "run"
    out = train(config(tiny_data_dir, run, "train.max_updates=3", "train.ema_decay=0.5",
                       "train.valid_interval_updates=1", "train.save_interval_updates=1",
                       "train.keep_last=0"))
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    valid = {r["update"]: r for r in records if r["kind"] == "valid"}
    assert sorted(valid) == [1, 2, 3]
    for update, record in valid.items():
        path = run / f"checkpoint_{update}.pt"
        assert record["weights"] == "ema"
        assert record["loss"] == pytest.approx(direct_valid_loss(tiny_data_dir, path, "ema",
                                                                 0.1), rel=1e-5)
        assert record["model_loss"] == pytest.approx(
            direct_valid_loss(tiny_data_dir, path, "model", 0.1), rel=1e-5)
        assert record["loss"] != pytest.approx(record["model_loss"], rel=1e-5)
    best = min(valid, key=lambda u: valid[u]["loss"])
    assert out["best"] == valid[best]["loss"]
    assert load_checkpoint(run / "checkpoint_best.pt")["update"] == best


def test_valid_bleu_is_the_emas(tiny_data_dir, tmp_path, monkeypatch):
    scored = []

    def valid_bleu(run, model):
        scored.append(model is run.ema)
        return {"bleu": 1.0, "chrf": 1.0, "bleu_sentences": 1}

    monkeypatch.setattr(nmt.training.validation, "valid_bleu", valid_bleu)
    train(config(tiny_data_dir, tmp_path / "run", "train.max_updates=2", "train.ema_decay=0.9",
                 "train.valid_interval_updates=1", "train.valid_bleu=true"))
    assert scored == [True, True]


def test_max_epochs_stops_after_the_epoch(tiny_data_dir, tmp_path):
    cfg = config(tiny_data_dir, tmp_path / "run", "train.max_epochs=1", "train.max_tokens=2048")
    out = train(cfg)
    assert out["epoch"] == 2 and "max_epochs" in out["reason"]
    state = load_checkpoint(tmp_path / "run/checkpoint_last.pt")
    assert state["iterator"]["epoch"] == 2 and state["iterator"]["consumed"] == 0


def test_outputs_and_a_self_contained_checkpoint(tiny_data_dir, tmp_path):
    run = tmp_path / "run"
    out = train(config(tiny_data_dir, run, "train.max_updates=4", "train.valid_bleu=true",
                       "train.best_metric=bleu", "train.valid_interval_updates=2"))
    assert {"bleu", "chrf", "loss", "ppl"} <= out["valid"].keys()
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    train_rec = [r for r in records if r["kind"] == "train"]
    assert len(train_rec) == 2 and {"loss", "lr", "tokens_per_s", "padding"} <= train_rec[0].keys()
    assert 0.0 <= train_rec[0]["padding"] < 1.0
    assert len([r for r in records if r["kind"] == "valid"]) == 2
    saved = to_object(OmegaConf.load(run / "config.yaml"), TrainConfig)  # the resolved config
    assert saved.train.valid_bleu and saved.train.max_updates == 4 and saved.model.N == 1
    state = load_checkpoint(run / "checkpoint_best.pt")  # weights_only=True
    vocab = state["vocab"]
    tok = Tokenizer(vocab["tgt_spm"])
    assert tok.vocab_size == vocab["tgt_size"]
    manifest = json.loads((tiny_data_dir / "manifest.json").read_text())
    assert vocab["sha256"] == manifest["vocab_sha256"]
    assert vocab["pair"] == {"src_lang": manifest["src_lang"], "tgt_lang": manifest["tgt_lang"]}
    from nmt.config import ModelConfig

    model = make_model(ModelConfig(**state["model_cfg"]), vocab["src_size"], vocab["tgt_size"],
                        vocab["pad_id"], vocab["joint"])
    model.load_state_dict(state["model"])  # strict: every weight is there
    assert {"optimizer", "scheduler", "scaler", "iterator", "config", "best"} <= state.keys()


def lengths_data(tmp_path: Path, n: int = 30_000):
    """A train split (ParallelData) of n random pairs of 1-60 tokens (ids do not matter for
    batching)."""
    from nmt.data.arrays import ParallelData, TokenArrayWriter
    from nmt.data.manifest import Manifest, Sides, SplitSize

    rng = np.random.default_rng(0)
    counts = {"pairs": n}
    for side, lang in (("src", "en"), ("tgt", "de")):
        lengths = rng.integers(1, 61, n)
        with TokenArrayWriter(tmp_path / f"train.{lang}", np.uint16) as out:
            out.add_chunk(np.full(int(lengths.sum()), 5), lengths)
        counts[f"{side}_tokens"] = int(lengths.sum())
    manifest = Manifest(format=3, src_lang="en", tgt_lang="de", joint=True,
                        spm=Sides("spm.model", "spm.model"), src_vocab_size=8, tgt_vocab_size=8,
                        pad_id=0, unk_id=1, bos_id=2, eos_id=3, dtype="uint16",
                        vocab_sha256="", splits={"train": SplitSize(**counts)})
    return ParallelData(tmp_path, "train", manifest)


def tokens_per_update(data, global_tokens: int, world_size: int) -> list[int]:
    """Target tokens of each full update of epoch 1, every rank's share summed, as train()
    takes them: each rank's own iterator, batches_in_update batches per rank and update."""
    from nmt.commands.train import batches_in_update, update_frequency
    from nmt.config import TrainLoopConfig
    from nmt.data.batches import EpochBatchIterator

    ranks = [EpochBatchIterator(data, 512, 1, 0, rank=r, world_size=world_size)
             for r in range(world_size)]
    tc = TrainLoopConfig(global_tokens=global_tokens)
    freq = update_frequency(tc, ranks[0], world_size)
    assert all(update_frequency(tc, itr, world_size) == freq for itr in ranks)
    local = [itr.local_batches(1) for itr in ranks]
    tokens, done, update = [], 0, 0
    while done + (k := batches_in_update(freq, update)) <= len(local[0]):
        tokens.append(sum(int(itr.tgt_len[batches[i]].sum()) for itr, batches in
                          zip(ranks, local, strict=True) for i in range(done, done + k)))
        done, update = done + k, update + 1
    return tokens


@pytest.mark.parametrize("world_size", [1, 2, 8, 16])
def test_global_tokens_is_within_10_percent_on_any_number_of_ranks(tmp_path, world_size):
    data = lengths_data(tmp_path)
    for global_tokens in (16_000, 9_000):  # 16 ranks x 1 batch: ~7,000 target tokens
        tokens = tokens_per_update(data, global_tokens, world_size)
        assert len(tokens) >= 40  # an epoch of many updates
        assert abs(np.mean(tokens) / global_tokens - 1) < 0.1, (world_size, np.mean(tokens))


def test_global_tokens_that_one_batch_per_rank_overshoots_is_a_one_line_error(tmp_path):
    from nmt.commands.train import update_frequency
    from nmt.config import TrainLoopConfig
    from nmt.data.batches import EpochBatchIterator

    itr = EpochBatchIterator(lengths_data(tmp_path), 512, 1, 0, rank=0, world_size=16)
    per_batch = itr.tgt_len[np.concatenate(itr.global_batches(1))].sum() / len(
        itr.global_batches(1))
    assert 16 * per_batch > 1.1 * 5000  # where ceil() used to give +44%
    with pytest.raises(NmtError, match=r"train.global_tokens=5000: 16 rank\(s\) x 1 batch of "
                       r"[\d,]+ target tokens on average bring [\d,]+ per update \(\+\d+%\); "
                       r"lower train.max_tokens to about [\d,]+ or raise") as e:
        update_frequency(TrainLoopConfig(max_tokens=512, global_tokens=5000), itr, 16)
    assert "\n" not in str(e.value)
    assert update_frequency(TrainLoopConfig(update_freq=3), itr, 16) == 3  # as given


def test_batches_in_update_takes_a_fraction_on_average():
    from fractions import Fraction

    from nmt.commands.train import batches_in_update

    assert [batches_in_update(Fraction(3), u) for u in range(4)] == [3, 3, 3, 3]
    taken = [batches_in_update(Fraction(7, 3), u) for u in range(9)]
    assert set(taken) == {2, 3} and sum(taken) == 21


def test_fp16_on_cpu_is_a_clear_error(tiny_data_dir, tmp_path):
    with pytest.raises(NmtError, match="fp16 needs CUDA"):
        train(config(tiny_data_dir, tmp_path / "run", "train.amp=fp16", "train.device=cpu"))


def test_bf16_autocast_trains(tiny_data_dir, tmp_path):
    out = train(config(tiny_data_dir, tmp_path / "run", "train.amp=bf16",
                       "train.max_updates=3"))
    assert out["update"] == 3 and np.isfinite(out["valid"]["loss"])


def test_a_manifest_without_a_key_is_a_one_line_error(tiny_data_dir, tmp_path):
    import shutil

    data = tmp_path / "data"
    shutil.copytree(tiny_data_dir, data)
    manifest = json.loads((data / "manifest.json").read_text())
    del manifest["vocab_sha256"]
    (data / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(NmtError, match="missing key 'vocab_sha256'"):
        train(config(data, tmp_path / "run"))


def with_grads(*grads: torch.Tensor) -> list[torch.Tensor]:
    """Parameters holding these gradients."""
    params = [torch.zeros_like(g, requires_grad=True) for g in grads]
    for p, g in zip(params, grads, strict=True):
        p.grad = g.clone()
    return params


def test_data_settings_that_do_not_fit_the_directory_are_one_line_errors(
        tiny_data_dir, corpora_dir, tmp_path):
    import shutil

    from nmt.data.arrays import verify_data_dir
    from nmt.data.manifest import read_manifest

    cases = [(corpora_dir, "train.corpus_weights=[1]",
              r"train.corpus_weights: 1 weight\(s\) for the 2 corpora of .* \(real, bt\)"),
             (tiny_data_dir, "train.subword_sampling=0.1",
              r"has no training text \(preprocess it again with keep_text=true\)")]
    data = shutil.copytree(tiny_data_dir, tmp_path / "data")
    (data / "valid.de.bin").write_bytes((data / "valid.de.bin").read_bytes()[:-3])
    cases.append((data, "train.max_updates=1", r"valid.de.bin: [\d,]+ bytes where manifest"))
    rotten = shutil.copytree(corpora_dir, tmp_path / "rotten")
    assert "verified (" in verify_data_dir(rotten, read_manifest(rotten))
    path, stat = rotten / "train.de.bin", (rotten / "train.de.bin").stat()
    content = bytearray(path.read_bytes())
    content[10] ^= 1
    path.write_bytes(content)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # bit rot: same size and time
    assert "verified before" in verify_data_dir(rotten, read_manifest(rotten))
    cases.append((rotten, "train.check_data=true", r"train.de.bin: sha256 differs"))
    for data_dir, override, error in cases:
        with pytest.raises(NmtError, match=error) as e:
            train(config(data_dir, tmp_path / "run", override, "train.max_updates=1"))
        assert "\n" not in str(e.value)


def test_corpus_weights_override_the_manifests(corpora_dir, tmp_path):
    cfg = config(corpora_dir, tmp_path / "run", "train.corpus_weights=[1,0]")
    itr = load_data(cfg, distributed.init("cpu")).train
    drawn = np.concatenate(itr.global_batches(1))
    assert sorted(drawn.tolist()) == list(range(100))  # the bt corpus (weight 0) is left out
    assert train(config(corpora_dir, tmp_path / "run", "train.max_updates=2",
                        "train.subword_sampling=0.1"))["update"] == 2


def test_normalise_gradients_divides_then_clips():
    from nmt.commands.train import normalise_gradients

    p = with_grads(torch.full((3,), 4.0), torch.full((4,), 3.0))  # |g| = sqrt(48 + 36)
    norm = normalise_gradients(p, 2.0, clip_norm=0.0)
    assert norm.item() == pytest.approx(84 ** 0.5 / 2)
    assert p[0].grad.tolist() == pytest.approx([2.0] * 3, rel=1e-6)
    assert p[1].grad.tolist() == pytest.approx([1.5] * 4, rel=1e-6)
    p = with_grads(torch.full((3,), 4.0), torch.full((4,), 3.0))
    norm = normalise_gradients(p, 2.0, clip_norm=1.0)
    assert norm.item() == pytest.approx(84 ** 0.5 / 2)  # the norm before clipping is logged
    g = torch.cat([p[0].grad, p[1].grad])
    assert torch.linalg.vector_norm(g).item() == pytest.approx(1.0, rel=1e-5)
    assert (p[0].grad / p[1].grad[:3]).tolist() == pytest.approx([4 / 3] * 3)  # direction
    p = with_grads(torch.full((3,), 4.0))
    normalise_gradients(p, 2.0, clip_norm=100.0)  # below the threshold: only divided
    assert p[0].grad.tolist() == pytest.approx([2.0] * 3, rel=1e-6)


def applied_gradient_norms(monkeypatch, cfg) -> list[float]:
    """Train cfg; the global norm of the gradients that each Adam step applied."""
    norms, real_step = [], torch.optim.Adam.step

    def step(self, *args, **kwargs):
        grads = [p.grad.flatten() for group in self.param_groups for p in group["params"]
                 if p.grad is not None]
        norms.append(torch.linalg.vector_norm(torch.cat(grads)).item())
        return real_step(self, *args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(torch.optim.Adam, "step", step)
        train(cfg)
    return norms


@pytest.mark.parametrize("clip_norm", [0.05, 1e6])
def test_clip_norm_bounds_the_applied_gradients(tiny_data_dir, tmp_path, monkeypatch,
                                                clip_norm):
    free = applied_gradient_norms(monkeypatch, config(tiny_data_dir, tmp_path / "free",
                                                      "train.max_updates=3"))
    clipped = applied_gradient_norms(monkeypatch, config(
        tiny_data_dir, tmp_path / "clip", "train.max_updates=3", f"optim.clip_norm={clip_norm}"))
    assert len(clipped) == len(free) == 3 and min(free) > 0.05
    if clip_norm < 1:  # every update's gradient was longer than clip_norm: cut to it
        assert clipped == pytest.approx([clip_norm] * 3, rel=1e-4)
    else:  # never reached: the same gradients as without clipping
        assert clipped == pytest.approx(free, rel=1e-6)


# ----------------------------------------------------------------------------- outputs
@pytest.mark.slow
def test_learning_curves_and_tensorboard_scalars(tiny_data_dir, tmp_path):
    pytest.importorskip("matplotlib")
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = tmp_path / "run"
    train(config(tiny_data_dir, run, "train.max_updates=4", "train.log_interval=1",
                 "train.valid_interval_updates=2", "train.valid_bleu=true",
                 "train.valid_bleu_max_sentences=8", "train.plot=true", "train.tensorboard=true"))
    assert (run / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert list((run / "tensorboard").glob("events.out.tfevents.*"))
    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    assert [e.step for e in events.Scalars("train/loss")] == [1, 2, 3, 4]
    assert [e.step for e in events.Scalars("valid/bleu")] == [2, 4]


def test_no_matplotlib_no_curves_and_one_info_line(tiny_data_dir, tmp_path, monkeypatch, caplog):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "matplotlib" else real(name, *a))
    with caplog.at_level("INFO", logger="nmt.commands.train"):
        train(config(tiny_data_dir, tmp_path / "run", "train.max_updates=2", "train.plot=true"))
    assert not (tmp_path / "run/curves.png").exists()
    assert [r.message for r in caplog.records].count(
        "no learning-curve plot: matplotlib is not installed (pip install 'nmt[plot]')") == 1


def test_an_unwritable_run_dir_is_a_one_line_error_up_front(tiny_data_dir, tmp_path):
    (tmp_path / "file").write_text("")
    for run_dir in ("/proc/nmt-run", tmp_path / "file" / "run"):
        with pytest.raises(NmtError, match=f"run_dir={run_dir}: cannot create or write") as e:
            train(config(tiny_data_dir, run_dir, "train.max_updates=1"))
        assert "\n" not in str(e.value)


# ----------------------------------------------------------------------------- seeds, amp
def test_seeds_up_to_2_63_work_and_negative_ones_are_config_errors(tiny_data_dir, tmp_path):
    from nmt.commands.train import micro_batch_seed
    from nmt.errors import ConfigError

    assert 0 <= micro_batch_seed(2 ** 63 - 1, 10 ** 6, 10 ** 8) < 2 ** 64
    seeds = {micro_batch_seed(18447, e, i) for e in (1, 2, 3) for i in range(1000)}
    assert len(seeds) == 3000  # every batch its own masks
    out = train(config(tiny_data_dir, tmp_path / "run", f"train.seed={2 ** 63 - 1}",
                       "train.max_updates=2"))
    assert out["update"] == 2 and np.isfinite(out["valid"]["loss"])
    with pytest.raises(ConfigError, match=r"train.seed: must be in \[0, 2\^63\), got -1"):
        config(tiny_data_dir, tmp_path / "neg", "train.seed=-1")


def test_amp_auto_is_fp32_on_cpu():
    from nmt.training.run import resolve_amp

    cpu = torch.device("cpu")
    assert [resolve_amp(a, cpu).amp for a in ("auto", "none", "bf16")] == ["none", "none", "bf16"]
    with pytest.raises(NmtError, match="fp16 needs CUDA"):
        resolve_amp("fp16", cpu)


@pytest.mark.parametrize("native", [False, True])
def test_bf16_native_is_bf16_only_where_the_cpu_has_it(native, monkeypatch, caplog):
    """train.amp=bf16_native: bf16 on a CPU with native bf16, fp32 elsewhere, and the reason;
    an explicit bf16 on a CPU that emulates it runs, with a one-line warning."""
    from nmt.system.runtime import CpuBf16
    from nmt.training.run import resolve_amp

    support = CpuBf16(native, "the CPU has avx512_bf16" if native else "bf16 is emulated")
    monkeypatch.setattr(nmt.system.runtime, "cpu_bf16", lambda: support)
    monkeypatch.setattr(nmt.training.run, "cpu_bf16", lambda: support)
    cpu = torch.device("cpu")
    chosen = resolve_amp("bf16_native", cpu)
    assert chosen.amp == ("bf16" if native else "none") and support.why in chosen.why
    with caplog.at_level("WARNING"):
        assert resolve_amp("bf16", cpu).amp == "bf16"
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert (len(warned) == 1 and "train.amp=bf16" in warned[0]) if not native else not warned
    assert resolve_amp("auto", cpu).amp == "none"  # auto on CPUs is unchanged


def test_compile_auto_compiles_on_gpus_and_bf16_cpu_runs_only():
    """train.compile=auto: the compiled update where it pays (GPUs; CPUs computing in bf16),
    eager for an fp32 CPU run; true and false as said, whatever the device."""
    from nmt.training.run import Precision, resolve_compile

    cpu, gpu = torch.device("cpu"), torch.device("cuda")
    bf16, fp32 = Precision("bf16", ""), Precision("none", "")
    assert [resolve_compile("auto", cpu, p) for p in (bf16, fp32)] == [True, False]
    assert resolve_compile("auto", gpu, fp32) and resolve_compile("true", cpu, fp32)
    assert not resolve_compile("false", gpu, bf16)


def test_the_compile_choice_is_checked_and_the_header_names_it(tiny_data_dir, tmp_path, caplog,
                                                               monkeypatch):
    """train.compile takes true, false (as Hydra's bools too) and auto, nothing else; auto on an
    fp32 CPU run trains eager and says nothing of a compiled update."""
    with pytest.raises(NmtError, match="train.compile: must be true, false or auto"):
        config(tiny_data_dir, tmp_path / "bad", "train.compile=sometimes")
    assert config(tiny_data_dir, tmp_path / "t", "train.compile=true").train.compile == "true"
    monkeypatch.setattr(torch, "compile", lambda *a, **k: pytest.fail("compiled an fp32 run"))
    with caplog.at_level("INFO", logger="nmt.commands.train"):
        train(config(tiny_data_dir, tmp_path / "run", "train.compile=auto", "train.amp=none",
                     "train.max_updates=1"))
    header = [r.getMessage() for r in caplog.records if "amp none" in r.getMessage()]
    assert header and "update compiled" not in header[0]


def test_the_runs_header_says_which_precision_and_why(tiny_data_dir, tmp_path, monkeypatch,
                                                      caplog):
    from nmt.system.runtime import CpuBf16

    monkeypatch.setattr(nmt.training.run, "cpu_bf16",
                        lambda: CpuBf16(False, "bf16 is emulated"))
    with caplog.at_level("INFO", logger="nmt.commands.train"):
        train(config(tiny_data_dir, tmp_path / "run", "train.amp=bf16_native",
                     "train.max_updates=1"))
    assert any("amp none (bf16_native: bf16 is emulated)" in r.getMessage()
               for r in caplog.records)


@pytest.mark.long
def test_compile_trains_like_eager(tiny_data_dir, tmp_path, monkeypatch):
    real = torch.compile
    monkeypatch.setattr(torch, "compile",  # inductor's C++ build takes minutes on 2 cores
                        lambda model, **kw: real(model, backend="aot_eager", **kw))
    opts = ["train.max_updates=3", "model.dropout=0", "train.valid_interval_updates=100"]
    train(config(tiny_data_dir, tmp_path / "eager", *opts))
    out = train(config(tiny_data_dir, tmp_path / "compiled", *opts, "train.compile=true"))
    torch._dynamo.reset()
    assert out["update"] == 3
    a = load_checkpoint(tmp_path / "eager/checkpoint_last.pt")["model"]
    b = load_checkpoint(tmp_path / "compiled/checkpoint_last.pt")["model"]
    assert a.keys() == b.keys()  # the saved names are the model's, not the wrapper's
    d = a["generator.weight"].size(1)
    for name in a:  # but the keys' biases, which get no gradient (softmax ignores a shift):
        x, y = a[name], b[name]  # Adam's steps there follow rounding noise
        if name.endswith("W_qkv.bias"):
            x, y = (torch.cat([t[:d], t[2 * d:]]) for t in (x, y))
        elif name.endswith("W_kv.bias"):
            x, y = x[d:], y[d:]
        torch.testing.assert_close(y, x, rtol=1e-4, atol=1e-5, msg=name)


# ----------------------------------------------------------------------------- EMA
def test_ema_decay_forgets_the_initial_weights_first():
    from nmt.commands.train import ema_decay

    assert ema_decay(0.9999, 1) == pytest.approx(2 / 11)
    assert ema_decay(0.9999, 90) == pytest.approx(91 / 100)
    assert ema_decay(0.5, 100) == 0.5


def test_ema_is_the_moving_average_of_the_weights(tiny_data_dir, tmp_path):
    from nmt.config import ModelConfig

    cfg = config(tiny_data_dir, tmp_path / "run", "train.max_updates=2", "train.ema_decay=0.5")
    train(cfg)
    state = load_checkpoint(tmp_path / "run/checkpoint_2.pt")
    assert state["ema"].keys() == state["model"].keys()
    torch.manual_seed(cfg.train.seed)  # the initial weights, as train() drew them
    v = state["vocab"]
    w0 = make_model(ModelConfig(**state["model_cfg"]), v["src_size"], v["tgt_size"],
                     v["pad_id"], v["joint"]).state_dict()
    cfg1 = config(tiny_data_dir, tmp_path / "one", "train.max_updates=1", "train.ema_decay=0.5")
    train(cfg1)
    w1 = load_checkpoint(tmp_path / "one/checkpoint_1.pt")["model"]
    w2 = state["model"]
    d1, d2 = 2 / 11, 3 / 12  # min(0.5, (1 + u) / (10 + u)) for updates 1 and 2
    for k in w2:
        ema1 = d1 * w0[k] + (1 - d1) * w1[k]
        torch.testing.assert_close(state["ema"][k], d2 * ema1 + (1 - d2) * w2[k], msg=k)


def test_translate_uses_the_ema_weights_when_asked(tiny_data_dir, tmp_path):
    from nmt.commands.translate import translate
    from nmt.config import TranslateConfig
    from nmt.engines.translator import Translator

    train(config(tiny_data_dir, tmp_path / "ema", "train.max_updates=2", "train.ema_decay=0.9"))
    train(config(tiny_data_dir, tmp_path / "plain", "train.max_updates=2"))
    path = tmp_path / "ema/checkpoint_last.pt"
    state = load_checkpoint(path)
    for weights, key in (("ema", "ema"), ("auto", "ema"), ("model", "model")):
        model = Translator.load(path, weights=weights, dtype=None).model
        assert same_tensors(model.state_dict(), state[key]), weights
    assert not same_tensors(state["ema"], state["model"])
    plain = tmp_path / "plain/checkpoint_last.pt"
    assert same_tensors(Translator.load(plain, dtype=None).model.state_dict(),
                        load_checkpoint(plain)["model"])  # auto: no EMA saved, the model's
    (tmp_path / "in.txt").write_text("open file\n")
    with pytest.raises(NmtError, match="weights=ema but the checkpoint has no EMA") as e:
        translate(TranslateConfig(checkpoint=str(plain), input=str(tmp_path / "in.txt"),
                                  weights="ema", workers=1))
    assert "\n" not in str(e.value)


# ----------------------------------------------------------------------------- fine-tuning
def same_vocabulary_data(tmp_path: Path, like: Path) -> Path:
    """Another toy corpus preprocessed with `like`'s SentencePiece model (bpe.model=...)."""
    import random

    from conftest import _sentences, _translate_word

    from nmt.commands.preprocess import preprocess
    from nmt.config import PreprocessConfig

    rng = random.Random(7)
    for split, n in (("train", 200), ("valid", 20)):
        src = _sentences(n, rng, max_words=6)
        (tmp_path / f"{split}.en").write_text("\n".join(src) + "\n")
        (tmp_path / f"{split}.de").write_text(
            "\n".join(" ".join(map(_translate_word, s.split())) for s in src) + "\n")
    out = tmp_path / "domain"
    preprocess(to_object(compose("preprocess", [
        "src_lang=en", "tgt_lang=de", f"train={tmp_path}/train", f"valid={tmp_path}/valid",
        f"out_dir={out}", f"bpe.model={like}", "workers=1"]), PreprocessConfig))
    return out


@pytest.mark.slow
def test_init_from_fine_tunes_a_checkpoint_on_new_data(tiny_data_dir, tmp_path):
    train(config(tiny_data_dir, tmp_path / "base", "train.max_updates=3"))
    base = tmp_path / "base/checkpoint_last.pt"
    domain = same_vocabulary_data(tmp_path, tiny_data_dir)
    tuned = tmp_path / "tuned"
    out = train(config(domain, tuned, f"train.init_from={base}", "train.max_updates=2",
                       "model.dropout=0.3", "optim.lr_factor=1e-9", "train.ema_decay=0.9"))
    assert out["update"] == 2
    state = load_checkpoint(tuned / "checkpoint_last.pt")
    assert state["iterator"]["epoch"] == 1 and state["iterator"]["consumed"] == 2
    assert state["scheduler"]["applied"] == 2  # a fresh schedule
    assert all(s["step"].item() == 2 for s in state["optimizer"]["state"].values())
    start = load_checkpoint(base)["model"]
    for name, w in state["model"].items():  # learning rate ~0: still the base weights
        torch.testing.assert_close(w, start[name], rtol=0, atol=1e-6, msg=name)
    again = train(config(domain, tuned, f"train.init_from={base}", "train.max_updates=3"))
    assert again["update"] == 3  # a restart resumes the fine-tuning run, not init_from

    other = make_data_dir(tmp_path / "other", vocab_size=100)
    with pytest.raises(NmtError, match="vocabulary differs.*bpe.model=") as e:
        train(config(other, tmp_path / "x", f"train.init_from={base}"))
    assert "\n" not in str(e.value)
    with pytest.raises(NmtError, match=r"model differs from the checkpoint.s \(d_ff=64 != 1"):
        train(config(domain, tmp_path / "y", f"train.init_from={base}", "model.d_ff=128"))
    with pytest.raises(NmtError, match="nothing.pt: checkpoint not found"):
        train(config(domain, tmp_path / "z", f"train.init_from={tmp_path / 'nothing.pt'}"))


@pytest.mark.parametrize("fused", [True, False])
def test_optimizer_step_is_skipped_on_the_device_or_the_host(fused):
    from nmt.commands.train import optimizer_step

    w = torch.nn.Parameter(torch.ones(3))
    adam = torch.optim.Adam([w], lr=0.1, fused=fused)  # fused: GPUs (and CPUs since torch 2.4)
    for skip, changed in ((True, False), (False, True), (True, False)):
        before = w.detach().clone()
        w.grad = torch.full((3,), 0.5)
        optimizer_step(adam, torch.tensor(skip))
        assert (not torch.equal(w.detach(), before)) == changed
        assert not hasattr(adam, "found_inf")
    assert adam.state[w]["step"].item() == 1  # skipped steps do not count


def test_a_second_trainer_on_a_run_directory_stops_and_touches_nothing(tiny_data_dir, tmp_path):
    """While one trainer holds RUN/.lock, another nmt-train on RUN is a one-line error naming
    the directory, and the first one's temporary files (a checkpoint being written) survive."""
    from nmt.training.runlog import RunDirLock

    run = tmp_path / "run"
    run.mkdir()
    first = RunDirLock(str(run))  # another open file description: another holder for flock
    first.acquire()
    writing = run / ".checkpoint_4.pt.abc.tmp"
    writing.write_bytes(b"half a checkpoint")
    with pytest.raises(NmtError, match=rf"run_dir={run}: in use by another nmt-train \(pid "
                                       rf"{os.getpid()}\)"):
        train(config(tiny_data_dir, run, "train.max_updates=1"))
    assert writing.read_bytes() == b"half a checkpoint"
    assert not list(run.glob("checkpoint_*.pt"))
    first.close()
    train(config(tiny_data_dir, run, "train.max_updates=1"))  # free again: it trains
    assert (run / "checkpoint_last.pt").is_file() and not writing.exists()


def test_the_lock_of_a_killed_trainer_does_not_block(tmp_path):
    """The kernel drops a flock lock when its holder dies (kill -9 included)."""
    from nmt.training.runlog import RunDirLock

    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, sys, time; f = open(sys.argv[1], 'a+'); "
         "fcntl.flock(f, fcntl.LOCK_EX); print('locked', flush=True); time.sleep(60)",
         str(tmp_path / ".lock")], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline() == "locked\n"
    with pytest.raises(NmtError, match="in use by another nmt-train"):
        RunDirLock(str(tmp_path)).acquire()
    holder.kill()
    holder.wait()
    lock = RunDirLock(str(tmp_path))
    lock.acquire()
    assert (tmp_path / ".lock").read_text() == f"{os.getpid()}\n"
    lock.close()
