"""Write tests/data/checkpoint_8f24062.pt and its expected outputs with nmt at commit 8f24062
(run with that checkout first on sys.path: PYTHONPATH=OLD:OLD/tests python THIS OUT_DIR).

A tiny model trained for 400 updates on the tests' toy data directory (joint 120-piece
vocabulary, its SentencePiece model without NFKC's table to keep the file small), with an
EMA; its training state (optimizer, iterator) is dropped to keep the file small, as
nmt-average's checkpoints are. The expected outputs are nmt-translate's of the toy data's first
test sentences, weights=auto (the EMA) and weights=model, beam 4, 3-best."""

import json
import sys
import tempfile
from functools import partial
from pathlib import Path

import conftest
import sentencepiece as spm

from nmt.commands.train import train
from nmt.commands.translate import translate
from nmt.config import TrainConfig, TranslateConfig, compose, to_object
from nmt.training.checkpoint import load_checkpoint, save_checkpoint

TRAIN = ["+model=small", "model.N=1", "model.d_model=16", "model.d_ff=32", "model.h=2",
         "train.threads=1", "train.max_tokens=256", "train.max_updates=400", "train.plot=false",
         "train.tensorboard=false", "train.ema_decay=0.9", "train.valid_interval_updates=400",
         "train.save_interval_updates=400", "optim.warmup=50"]
KEEP = ("model", "ema", "model_cfg", "vocab", "update", "epoch", "config", "best", "format")


def main(out: Path) -> None:
    """Train, keep the model-only checkpoint, and translate with it."""
    work = Path(tempfile.mkdtemp())
    spm.SentencePieceTrainer.train = partial(spm.SentencePieceTrainer.train,
                                             normalization_rule_name="identity")
    data = conftest.make_data_dir(work / "toy")
    train(to_object(compose("train", [f"data_dir={data}", f"run_dir={work / 'run'}", *TRAIN]),
                    TrainConfig))
    state = load_checkpoint(work / "run/checkpoint_last.pt")
    ckpt = out / "checkpoint_8f24062.pt"
    save_checkpoint({k: v for k, v in state.items() if k in KEEP}, ckpt)
    sources = (data / "test.clean.en").read_text(encoding="utf-8").splitlines()[:8]
    (out / "checkpoint_8f24062.en").write_text("\n".join(sources) + "\n", encoding="utf-8")
    expected = {}
    for weights in ("auto", "model"):
        hyp = work / f"hyp.{weights}"
        translate(to_object(compose("translate", [
            f"checkpoint={ckpt}", f"input={out / 'checkpoint_8f24062.en'}", f"output={hyp}",
            f"weights={weights}", "search.beam_size=4", "search.nbest=3", "quiet=true"]),
            TranslateConfig))
        expected[weights] = hyp.read_text(encoding="utf-8").splitlines()
    (out / "checkpoint_8f24062.json").write_text(json.dumps(expected, indent=1) + "\n",
                                                 encoding="utf-8")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
