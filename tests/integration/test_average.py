"""nmt-average: exact on copies, the mean of known checkpoints, clear errors, no partial output."""

import stat
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest
import torch

from nmt.commands.average import average
from nmt.config import AverageConfig, ModelConfig
from nmt.errors import NmtError
from nmt.model import make_model
from nmt.training.checkpoint import (
    average_checkpoints,
    last_checkpoints,
    load_checkpoint,
    save_checkpoint,
)

BIN = Path(sys.executable).parent


def make_checkpoint(path: Path, seed: int, update: int, d_model: int = 16, vocab_sha="abc",
                    dtype=torch.float32, ema: bool = False) -> dict:
    """A small model checkpoint in the trainer's format (with an EMA of other weights)."""
    torch.manual_seed(seed)
    cfg = ModelConfig(N=1, d_model=d_model, d_ff=32, h=2, dropout=0.1)
    model = make_model(cfg, 20, 20, 0, True).to(dtype)
    state = {"model": model.state_dict(), "model_cfg": asdict(cfg),
             "vocab": {"src_size": 20, "tgt_size": 20, "joint": True, "sha256": vocab_sha},
             "update": update, "epoch": 1}
    if ema:
        state["ema"] = make_model(cfg, 20, 20, 0, True).to(dtype).state_dict()
    save_checkpoint(state, path)
    return state


def test_averaging_copies_changes_nothing(tmp_path):
    state = make_checkpoint(tmp_path / "a.pt", seed=0, update=10)
    avg = average_checkpoints([tmp_path / "a.pt"] * 3)
    for k, v in state["model"].items():
        assert torch.equal(avg["model"][k], v), k


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_two_checkpoints_average_to_their_mean(tmp_path, dtype):
    a = make_checkpoint(tmp_path / "a.pt", seed=0, update=10, dtype=dtype)
    b = make_checkpoint(tmp_path / "b.pt", seed=1, update=20, dtype=dtype)
    avg = average_checkpoints([tmp_path / "a.pt", tmp_path / "b.pt"])
    for k in a["model"]:
        mean = ((a["model"][k].double() + b["model"][k].double()) / 2).to(dtype)
        assert avg["model"][k].dtype == dtype
        assert torch.equal(avg["model"][k], mean), k
    assert avg["update"] == 20 and avg["vocab"]["sha256"] == "abc"
    assert avg["averaged_from"] == ["a.pt", "b.pt"]
    assert "optimizer" not in avg


def test_the_emas_are_averaged_when_every_checkpoint_has_one(tmp_path):
    a = make_checkpoint(tmp_path / "a.pt", seed=0, update=10, ema=True)
    b = make_checkpoint(tmp_path / "b.pt", seed=1, update=20, ema=True)
    make_checkpoint(tmp_path / "c.pt", seed=2, update=30)
    avg = average_checkpoints([tmp_path / "a.pt", tmp_path / "b.pt"])
    for k in a["ema"]:
        mean = ((a["ema"][k].double() + b["ema"][k].double()) / 2).float()
        assert torch.equal(avg["ema"][k], mean), k
        assert torch.equal(avg["model"][k], ((a["model"][k] + b["model"][k]) / 2)), k
    assert not torch.equal(avg["ema"]["generator.weight"], avg["model"]["generator.weight"])
    for order in (["a", "b", "c"], ["c", "a", "b"]):  # one without an EMA: none in the mean
        assert "ema" not in average_checkpoints([tmp_path / f"{n}.pt" for n in order])


def test_integer_buffers_are_taken_not_averaged(tmp_path):
    for i, value in enumerate([3, 8]):
        state = make_checkpoint(tmp_path / f"{i}.pt", seed=0, update=i)
        state["model"]["counter"] = torch.tensor(value)
        save_checkpoint(state, tmp_path / f"{i}.pt")
    avg = average_checkpoints([tmp_path / "0.pt", tmp_path / "1.pt"])
    assert avg["model"]["counter"].item() == 8 and avg["model"]["counter"].dtype == torch.int64


def test_last_checkpoints_by_update_number_not_file_time(tmp_path):
    for update in (900, 1000, 100, 50):  # written out of order
        make_checkpoint(tmp_path / f"checkpoint_{update}.pt", seed=0, update=update)
    make_checkpoint(tmp_path / "checkpoint_last.pt", seed=0, update=1000)
    names = [p.name for p in last_checkpoints(tmp_path, 3)]
    assert names == ["checkpoint_100.pt", "checkpoint_900.pt", "checkpoint_1000.pt"]
    with pytest.raises(NmtError, match="only 4"):
        last_checkpoints(tmp_path, 5)


def test_mismatched_checkpoints_are_refused(tmp_path):
    make_checkpoint(tmp_path / "a.pt", seed=0, update=1)
    make_checkpoint(tmp_path / "wide.pt", seed=0, update=2, d_model=32)
    make_checkpoint(tmp_path / "vocab.pt", seed=0, update=3, vocab_sha="other")
    with pytest.raises(NmtError, match="wide.pt: model config differs"):
        average_checkpoints([tmp_path / "a.pt", tmp_path / "wide.pt"])
    with pytest.raises(NmtError, match="vocab.pt: vocabulary differs"):
        average_checkpoints([tmp_path / "a.pt", tmp_path / "vocab.pt"])


def test_a_device_as_output_is_written_into_not_replaced(tmp_path, null_device):
    make_checkpoint(tmp_path / "a.pt", seed=0, update=10)
    average(AverageConfig(output=str(null_device), inputs=[str(tmp_path / "a.pt")]))
    assert stat.S_ISCHR(null_device.lstat().st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.pt", "null"]


def run_average(*args: str) -> subprocess.CompletedProcess:
    """Run the nmt-average console script."""
    return subprocess.run([str(BIN / "nmt-average"), *args], capture_output=True, text=True,
                          timeout=120)


@pytest.mark.long
def test_cli_contract_commands(tmp_path):
    for update in (100, 200, 300):
        make_checkpoint(tmp_path / f"checkpoint_{update}.pt", seed=update, update=update)
    out = run_average(f"run_dir={tmp_path}", "last=2", f"output={tmp_path / 'averaged.pt'}")
    assert out.returncode == 0, out.stderr
    assert load_checkpoint(tmp_path / "averaged.pt")["averaged_from"] == [
        "checkpoint_200.pt", "checkpoint_300.pt"]
    a, b = tmp_path / "checkpoint_100.pt", tmp_path / "checkpoint_300.pt"
    out = run_average(f"inputs=[{a},{b}]", f"output={tmp_path / 'avg.pt'}")
    assert out.returncode == 0, out.stderr
    assert load_checkpoint(tmp_path / "avg.pt")["update"] == 300


@pytest.mark.parametrize("case", ["missing", "corrupt", "too_few", "architecture", "vocab",
                                  "pickle"])
@pytest.mark.slow
def test_cli_bad_input_is_one_line_and_writes_nothing(tmp_path, case):
    good = tmp_path / "checkpoint_1.pt"
    make_checkpoint(good, seed=0, update=1)
    other = tmp_path / "other.pt"
    if case == "corrupt":
        other.write_bytes(b"not a checkpoint at all")
    elif case == "architecture":
        make_checkpoint(other, seed=0, update=2, d_model=32)
    elif case == "vocab":
        make_checkpoint(other, seed=0, update=2, vocab_sha="zzz")
    elif case == "pickle":  # a checkpoint that would run code if loaded without weights_only
        torch.save({"model": {}, "model_cfg": {}, "vocab": {}, "evil": Path("x")}, other)
    output = tmp_path / "out.pt"
    args = ([f"run_dir={tmp_path}", "last=3"] if case == "too_few"
            else [f"inputs=[{good},{other}]"])
    out = run_average(*args, f"output={output}")
    assert out.returncode == 1
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("nmt-average: error: "), out.stderr
    assert not output.exists()
    assert not list(tmp_path.glob(".out.pt*"))
