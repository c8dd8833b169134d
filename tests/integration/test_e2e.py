"""End to end on real data: preprocess, train a few updates, average, translate and score."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from nmt.system.files import read_lines
from nmt.training.checkpoint import load_checkpoint

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "scripts/data/debian-po/en-de"
BIN = Path(sys.executable).parent
TINY = ["+model=small", "model.N=1", "model.d_model=64", "model.d_ff=128", "model.h=2",
        "train.max_tokens=1500", "train.log_interval=1"]


def cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    """Run an nmt console script; fail the test with its stderr when it fails."""
    out = subprocess.run([str(BIN / args[0]), *args[1:]], capture_output=True, text=True,
                         input=stdin, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, f"{args[0]} failed:\n{out.stderr[-3000:]}"
    return out


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """The first lines of the bundled corpus: 3,000 training pairs, 40 valid, 40 test."""
    d = tmp_path_factory.mktemp("corpus")
    for split, n in (("train", 3000), ("valid", 40), ("test", 40)):
        for lang in ("en", "de"):
            lines = read_lines(str(CORPUS / f"{split}.{lang}.xz"))[:n]
            (d / f"{split}.{lang}").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return d


@pytest.fixture(scope="module")
def run(corpus, tmp_path_factory) -> Path:
    """Preprocess the corpus and train 6 updates, saving every 2; returns the work dir."""
    work = tmp_path_factory.mktemp("work")
    cli("nmt-preprocess", "src_lang=en", "tgt_lang=de", f"train={corpus}/train",
        f"valid={corpus}/valid", f"test={corpus}/test", f"out_dir={work}/data",
        "bpe.vocab_size=1000")
    cli("nmt-train", *TINY, f"data_dir={work}/data", f"run_dir={work}/run",
        "train.max_updates=6", "train.save_interval_updates=2", "train.valid_interval_updates=3")
    return work


@pytest.mark.slow
def test_training_writes_numbered_checkpoints(run):
    names = sorted(p.name for p in (run / "run").glob("checkpoint_*.pt"))
    assert {"checkpoint_2.pt", "checkpoint_4.pt", "checkpoint_6.pt", "checkpoint_last.pt"} <= set(
        names)
    assert load_checkpoint(run / "run/checkpoint_last.pt")["update"] == 6
    assert (run / "run/metrics.jsonl").is_file() and (run / "run/config.yaml").is_file()


@pytest.mark.slow
def test_average_then_translate_with_beam_and_score(run, corpus):
    avg = run / "run/averaged.pt"
    cli("nmt-average", f"run_dir={run}/run", "last=3", f"output={avg}")
    hyp = run / "hyp.de"
    out = cli("nmt-translate", f"checkpoint={avg}", f"input={corpus}/test.en", f"output={hyp}",
              "search.beam_size=4", f"ref={corpus}/test.de")
    assert len(hyp.read_text(encoding="utf-8").splitlines()) == 40
    assert "BLEU" in out.stderr and "chrF" in out.stderr and "nrefs:1" in out.stderr


@pytest.mark.slow
def test_translate_from_stdin_greedy(run, corpus):
    lines = (corpus / "test.en").read_text(encoding="utf-8").splitlines()[:5]
    text = "\n".join(lines[:2] + [""] + lines[2:]) + "\n"
    out = cli("nmt-translate", f"checkpoint={run}/run/checkpoint_last.pt", "search.beam_size=1",
              stdin=text)
    hyps = out.stdout.split("\n")[:-1]
    assert len(hyps) == 6 and hyps[2] == ""


@pytest.mark.long
def test_hydra_multirun_trains_one_run_per_job(run):
    sweep = run / "sweep"
    cli("nmt-train", "-m", *TINY, f"data_dir={run}/data", "model.N=1,2",
        f"run_dir={sweep}/N${{model.N}}", "train.max_updates=1", f"hydra.sweep.dir={sweep}/hydra")
    for n in (1, 2):
        ckpt = load_checkpoint(sweep / f"N{n}/checkpoint_last.pt")
        assert ckpt["model_cfg"]["N"] == n and ckpt["update"] == 1
