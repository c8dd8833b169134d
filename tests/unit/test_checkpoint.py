"""Checkpoints: atomic writes, keep-last, resume checks, the typed Checkpoint, and a checkpoint
written by an older nmt."""

import json
import os
import warnings
from pathlib import Path

import pytest
import torch

from nmt.checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from nmt.errors import NmtError
from nmt.training.checkpoint import (
    check_resumable,
    numbered_checkpoints,
    save_best_checkpoint,
    save_training_checkpoint,
)

MODEL_CFG = {"N": 1, "d_model": 8, "d_ff": 16, "h": 2, "dropout": 0.1, "attention_dropout": 0.0,
             "norm": "post", "share_embeddings": True, "max_positions": 64}


def state(update: int, **extra) -> dict:
    """A minimal training checkpoint."""
    return {"model": {"w": torch.full((2,), float(update))}, "model_cfg": dict(MODEL_CFG),
            "vocab": {"sha256": "abc", "src_spm": b"\x00\x01", "tgt_spm": b"\x00\x01"},
            "update": update, "epoch": 1, "optimizer": {}, "iterator": {"epoch": 1},
            **extra}


def test_keep_last_and_last_link(tmp_path):
    for u in (10, 20, 30, 40):
        path = save_training_checkpoint(state(u), tmp_path, keep_last=2)
        assert path.name == f"checkpoint_{u}.pt"
    assert [p.name for p in numbered_checkpoints(tmp_path)] == ["checkpoint_30.pt",
                                                                 "checkpoint_40.pt"]
    assert load_checkpoint(tmp_path / "checkpoint_last.pt")["update"] == 40
    assert not list(tmp_path.glob(".*tmp"))  # nothing half-written left behind


def test_best_survives_pruning(tmp_path):
    path = save_training_checkpoint(state(10), tmp_path, keep_last=1)
    save_best_checkpoint(tmp_path, path, state(10))
    save_training_checkpoint(state(20), tmp_path, keep_last=1)
    assert not (tmp_path / "checkpoint_10.pt").exists()
    assert load_checkpoint(tmp_path / "checkpoint_best.pt")["update"] == 10
    save_best_checkpoint(tmp_path, None, state(25))  # between save intervals: a new file
    assert load_checkpoint(tmp_path / "checkpoint_best.pt")["update"] == 25
    assert load_checkpoint(tmp_path / "checkpoint_last.pt")["update"] == 20


def test_failed_write_leaves_the_old_file(tmp_path, monkeypatch):
    save_checkpoint(state(1), tmp_path / "c.pt")

    def boom(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", boom)
    with pytest.raises(OSError):
        save_checkpoint(state(2), tmp_path / "c.pt")
    assert load_checkpoint(tmp_path / "c.pt")["update"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["c.pt"]


def test_checkpoints_get_the_permissions_of_a_plain_open(tmp_path):
    umask = os.umask(0o022)
    try:
        save_checkpoint(state(1), tmp_path / "c.pt")
    finally:
        os.umask(umask)
    assert (tmp_path / "c.pt").stat().st_mode & 0o777 == 0o644  # not mkstemp's 0600


def test_check_resumable_names_the_difference(tmp_path):
    path = tmp_path / "checkpoint_last.pt"
    check_resumable(state(1), path, MODEL_CFG, "abc")
    check_resumable(state(1), path, {**MODEL_CFG, "dropout": 0.3}, "abc")  # not a shape
    with pytest.raises(NmtError, match=r"d_model=8 != 16") as e:
        check_resumable(state(1), path, {**MODEL_CFG, "d_model": 16}, "abc")
    assert "\n" not in str(e.value)
    with pytest.raises(NmtError, match="vocabulary differs") as e:
        check_resumable(state(1), path, MODEL_CFG, "def")
    assert "\n" not in str(e.value)
    model_only = {k: v for k, v in state(1).items() if k not in ("optimizer", "iterator")}
    with pytest.raises(NmtError, match="not a training checkpoint"):
        check_resumable(model_only, path, MODEL_CFG, "abc")


def test_a_format_1_checkpoint_is_converted_and_a_newer_one_refused(tmp_path):
    """Format 1 fused the encoder-decoder projections into src_attn.W_qkv: loading splits it
    into W_q and W_kv (weights and EMA), the model loads it and computes the same function;
    resuming it is refused in one line; an unknown newer format is refused in one line."""
    from nmt.config import ModelConfig
    from nmt.model import make_model

    cfg = ModelConfig(**MODEL_CFG)
    torch.manual_seed(0)
    model = make_model(cfg, 20, 20, 0, True).eval()
    old = {}
    for name, value in model.state_dict().items():  # the format-1 layout of these weights
        if ".src_attn.W_q." in name:
            kind = name.rsplit(".", 1)[1]
            kv = model.state_dict()[name.replace(".W_q.", ".W_kv.")]
            old[name.replace(".W_q.", ".W_qkv.")] = torch.cat([value, kv])
        elif ".src_attn.W_kv." not in name:
            old[name] = value
    assert any(".src_attn.W_qkv." in k for k in old) and kind in ("weight", "bias")
    path = tmp_path / "old.pt"
    torch.save(state(7, model=old, ema=old, model_cfg=dict(MODEL_CFG)), path)  # no "format"
    loaded = load_checkpoint(path)
    assert loaded["format"] == 2 and loaded["upgraded_from"] == 1
    for key in ("model", "ema"):
        assert loaded[key].keys() == model.state_dict().keys()
        assert all(torch.equal(loaded[key][k], v) for k, v in model.state_dict().items())
    with pytest.raises(NmtError, match="format 1.*train.init_from"):
        check_resumable(loaded, path, dict(MODEL_CFG), "abc")
    save_checkpoint(loaded, tmp_path / "resaved.pt")  # written in today's format
    assert load_checkpoint(tmp_path / "resaved.pt")["format"] == 2
    torch.save(state(7, format=99), tmp_path / "future.pt")
    with pytest.raises(NmtError, match=r"future\.pt: checkpoint format 99 is newer"):
        load_checkpoint(tmp_path / "future.pt")


def test_every_garbage_file_is_one_line_naming_it(tmp_path):
    """Whatever its first byte: torch's weights-only unpickler raised IndexError or KeyError
    for 21 of them, which load_checkpoint let through as a traceback."""
    junk = b"not a checkpoint \x00\x01\x02\xff" * 4
    path = tmp_path / "garbage.pt"
    for first in range(256):
        path.write_bytes(bytes([first]) + junk)
        with warnings.catch_warnings(record=True) as warned, pytest.raises(NmtError) as e:
            warnings.simplefilter("always")
            load_checkpoint(path)
        assert str(e.value).startswith(f"{path}: not a readable nmt checkpoint (")
        assert "\n" not in str(e.value) and not warned, first  # nothing else on stderr


@pytest.mark.parametrize("weights", ["auto", "model"])
def test_a_checkpoint_written_by_8f24062_translates_as_it_did_then(weights, tmp_path):
    """tests/data/checkpoint_8f24062.pt (written by nmt at 8f24062: its EMA and model
    weights, a joint vocabulary; tests/data/make_checkpoint_8f24062.py) loads and gives the
    3-best lists, scores included, that nmt-translate gave with it then."""
    from nmt.commands.translate import translate
    from nmt.config import TranslateConfig, compose, to_object

    data = Path(__file__).parents[1] / "data"
    expected = json.loads((data / "checkpoint_8f24062.json").read_text(encoding="utf-8"))
    out = tmp_path / "hyp"
    translate(to_object(compose("translate", [  # as the script that wrote it translated
        f"checkpoint={data / 'checkpoint_8f24062.pt'}", f"input={data / 'checkpoint_8f24062.en'}",
        f"output={out}", f"weights={weights}", "search.beam_size=4", "search.nbest=3",
        "quiet=true"]), TranslateConfig))
    assert out.read_text(encoding="utf-8").splitlines() == expected[weights]


def test_checkpoint_round_trips_its_dict_and_names_the_file_and_key_of_a_fault(tmp_path):
    """Checkpoint.from_dict(d).to_dict() is d (the fixture written by 8f24062, whose training
    entries ride along as they are); a bad entry is one line naming the file and the key."""
    path = Path(__file__).parents[1] / "data" / "checkpoint_8f24062.pt"
    state = load_checkpoint(path)
    ckpt = Checkpoint.load(path)
    assert ckpt.model_cfg.d_model == 16 and ckpt.vocab.src_size == 120 and ckpt.update == 400
    assert ckpt.weights("auto", "x") is ckpt.ema and ckpt.weights("model", "x") is ckpt.model
    again = ckpt.to_dict()
    assert again.keys() == state.keys() - {"format"} and again["model_cfg"] == state["model_cfg"]
    assert again["vocab"] == state["vocab"] and again["best"] == state["best"]
    ckpt.save(tmp_path / "resaved.pt")
    assert load_checkpoint(tmp_path / "resaved.pt").keys() == state.keys()
    with pytest.raises(NmtError, match=r"^x\.pt: bad model_cfg \(.*d_modell"):
        Checkpoint.from_dict({**state, "model_cfg": {**state["model_cfg"], "d_modell": 8}},
                             "x.pt")
    with pytest.raises(NmtError, match=r"^x\.pt: checkpoint vocab lacks eos_id$"):
        vocab = {k: v for k, v in state["vocab"].items() if k != "eos_id"}
        Checkpoint.from_dict({**state, "vocab": vocab}, "x.pt")
    with pytest.raises(NmtError, match=r"^x\.pt: weights=ema but the checkpoint has no EMA"):
        Checkpoint.from_dict({k: v for k, v in state.items() if k != "ema"}, "x").weights(
            "ema", "x.pt")
