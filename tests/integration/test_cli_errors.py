"""Every bad key or value, and every output that cannot be written, is one line and exit 1.

Errors Hydra finds while composing (unknown keys, wrong types, bad syntax, missing config
files) are checked in-process through each command's `main()` with sys.argv set, which runs
the same code as the console script up to the task; those found by nmt's validation (missing
values, out-of-range values) and the output checks run the console scripts themselves.
"""

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from nmt.config import (
    AverageConfig,
    PreprocessConfig,
    TrainConfig,
    TranslateConfig,
    compose,
    to_object,
)
from nmt.config_errors import closest_keys
from nmt.errors import ConfigError, first_line
from nmt.system.files import check_output

BIN = Path(sys.executable).parent


def run_main(monkeypatch, capsys, command: str, *args: str) -> tuple[int, list[str]]:
    """Call nmt.cli.<command>.main() as the console script would; (exit code, stderr lines)."""
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    monkeypatch.setattr(sys, "argv", [f"nmt-{command}", *args])
    main = importlib.import_module(f"nmt.cli.{command}").main
    with pytest.raises(SystemExit) as stop:
        main()
    return stop.value.code, capsys.readouterr().err.splitlines()


def run_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Run a console script of this environment."""
    return subprocess.run([str(BIN / args[0]), *args[1:]], capture_output=True, text=True,
                          timeout=120, cwd=cwd)


# ----------------------------------------------------------------------------- composition
COMPOSE_CASES = [
    # unknown keys: the closest key, and the keys of the group
    ("average", ["bogus=1"], "bogus: unknown key (keys: output, run_dir, last, inputs)"),
    ("average", ["lats=3"], "lats: unknown key; did you mean last? (keys: output, run_dir,"),
    ("train", ["+model=small", "model.Nn=3"],
     "model.Nn: unknown key; did you mean model.N? (keys of model: N, N_dec, d_model,"),
    ("train", ["max_tokens=3"],
     "max_tokens: unknown key; did you mean train.max_tokens or search.max_tokens?"),
    ("translate", ["beam_size=5"], "beam_size: unknown key; did you mean search.beam_size?"),
    ("preprocess", ["bpe.vocab=8000"],
     "bpe.vocab: unknown key; did you mean bpe.vocab_size? (keys of bpe: vocab_size,"),
    ("train", ["hydra.bogus=1"], "hydra.bogus: unknown key (Hydra's own settings"),
    ("train", ["+model=smal"],
     "model: no config 'smal'; did you mean model=small? (options: base, big, small, tiny)"),
    # wrong types: the key, the value and what it should be
    ("average", ["last=abc"], "last: 'abc' is not an integer"),
    ("average", ["inputs=3"], "inputs: 3 is not a list, e.g. [a,b]"),
    ("train", ["train.max_updates=1.5"], "train.max_updates: 1.5 is not an integer"),
    ("translate", ["search.alpha=high"], "search.alpha: 'high' is not a number"),
    ("translate", ["search=3"], "search: 3 is not a group of keys (search.beam_size=..."),
    ("translate", ["quiet=maybe"], "quiet: 'maybe' is not true or false"),
    ("preprocess", ["bpe.joint=maybe"], "bpe.joint: 'maybe' is not true or false"),
    # syntax
    ("average", ["last=["], "cannot parse 'last=[': no viable alternative at input '['"),
    # a bad value in a sweep
    ("average", ["-m", "last=1,abc"], "last: 'abc' is not an integer"),
]


@pytest.mark.parametrize("command,args,expected", COMPOSE_CASES,
                         ids=[" ".join(c[1]) for c in COMPOSE_CASES])
def test_composition_errors_are_one_line(monkeypatch, capsys, command, args, expected):
    code, err = run_main(monkeypatch, capsys, command, *args)
    assert code == 1
    assert len(err) == 1, err
    assert err[0].startswith(f"nmt-{command}: error: {expected}"), err[0]


def test_the_console_script_prints_one_line_and_exits_1():
    out = run_cli("nmt-average", "lats=3")
    assert out.returncode == 1
    assert out.stderr.splitlines() == [
        "nmt-average: error: lats: unknown key; did you mean last? "
        "(keys: output, run_dir, last, inputs)"]
    assert "HYDRA_FULL_ERROR" not in out.stderr


def test_hydra_full_error_still_gives_the_full_report(monkeypatch):
    monkeypatch.setenv("HYDRA_FULL_ERROR", "1")
    monkeypatch.setattr(sys, "argv", ["nmt-average", "bogus=1"])
    from hydra.errors import ConfigCompositionException

    from nmt.cli.average import main

    with pytest.raises(ConfigCompositionException):
        main()


# ----------------------------------------------------------------------------- validation
@pytest.mark.parametrize("command,args,key", [
    ("preprocess", ["src_lang=en", "tgt_lang=de", "train=t"], "out_dir"),
    ("train", ["+model=tiny", "run_dir=r"], "data_dir"),
    ("translate", ["input=x"], "checkpoint"),
    ("average", ["run_dir=r"], "output"),
])
def test_missing_values_are_one_line(tmp_path, command, args, key):
    out = run_cli(f"nmt-{command}", *args, cwd=tmp_path)
    assert out.returncode == 1
    assert out.stderr.splitlines() == [
        f"nmt-{command}: error: {key}: a value is required (add {key}=...)"]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name,schema,args,expected", [
    ("preprocess", PreprocessConfig,
     ["src_lang=en", "tgt_lang=de", "train=t", "out_dir=o", "bpe.vocab_size=4"],
     "bpe.vocab_size: must be >= 8, got 4"),
    ("train", TrainConfig, ["+model=tiny", "data_dir=d", "run_dir=r", "optim.warmup=0"],
     "optim.warmup: must be >= 1, got 0"),
    ("translate", TranslateConfig, ["checkpoint=c", "search.nbest=9"],
     "search.nbest: must be between 1 and beam_size (4), got 9"),
    ("average", AverageConfig, ["output=o", "run_dir=r", "last=0"], "last: must be >= 1, got 0"),
    ("average", AverageConfig, ["output=o", "run_dir=r", "++lsat=2"],
     "lsat: unknown key; did you mean last?"),
])
def test_out_of_range_values_name_key_value_and_range(name, schema, args, expected):
    with pytest.raises(ConfigError) as error:
        to_object(compose(name, args), schema)
    assert str(error.value) == expected or str(error.value).startswith(expected)


def test_out_of_range_on_the_command_line():
    out = run_cli("nmt-translate", "checkpoint=c", "search.beam_size=0")
    assert out.returncode == 1
    assert out.stderr.splitlines() == [
        "nmt-translate: error: search.beam_size: must be >= 1, got 0"]


def test_closest_keys():
    assert closest_keys("search.beam", TranslateConfig) == ["search.beam_size"]
    assert closest_keys("beam_sise", TranslateConfig) == ["search.beam_size"]
    assert closest_keys("search.qqq", TranslateConfig) == []  # not "search" itself
    assert closest_keys("xyz", AverageConfig) == []


# ----------------------------------------------------------------------------- still working
@pytest.mark.long
def test_cfg_job_help_and_multirun_keep_working(tmp_path):
    job = run_cli("nmt-average", "last=3", "--cfg", "job")
    assert job.returncode == 0 and "last: 3" in job.stdout, job.stderr
    help_ = run_cli("nmt-translate", "--help")
    assert help_.returncode == 0 and "translate is powered by Hydra" in help_.stdout
    assert "search:" in help_.stdout and "beam_size: 4" in help_.stdout
    from test_average import make_checkpoint

    make_checkpoint(tmp_path / "a.pt", seed=0, update=1)
    sweep = run_cli("nmt-average", "-m", f"inputs=[{tmp_path / 'a.pt'}]",
                    f"output={tmp_path / 'x.pt'},{tmp_path / 'y.pt'}", cwd=tmp_path)
    assert sweep.returncode == 0, sweep.stderr
    assert (tmp_path / "x.pt").is_file() and (tmp_path / "y.pt").is_file()


# ----------------------------------------------------------------------------- outputs
def test_check_output_accepts_writable_places_and_leaves_nothing(tmp_path):
    check_output(tmp_path / "new" / "deeper" / "out.pt", "output")
    check_output(tmp_path / "data", "out_dir", directory=True)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("where", ["proc", "under_a_file", "a_directory"])
def test_check_output_refuses_what_cannot_be_written(tmp_path, where):
    (tmp_path / "file").write_text("x")
    (tmp_path / "dir").mkdir()
    path = {"proc": "/proc/nmt-test/out.pt", "under_a_file": str(tmp_path / "file" / "o.pt"),
            "a_directory": str(tmp_path / "dir")}[where]
    with pytest.raises(ConfigError, match=r"^output: "):
        check_output(path, "output")


def test_read_only_directory(tmp_path):
    import os

    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        if os.access(ro, os.W_OK):
            pytest.skip("running as root: permissions do not stop writes")
        with pytest.raises(ConfigError, match="takes no new files"):
            check_output(ro / "sub" / "out.pt", "output")
    finally:
        ro.chmod(0o700)


@pytest.mark.parametrize("command,args,key", [
    ("preprocess", ["src_lang=en", "tgt_lang=de", "train=missing",
                    "out_dir=/proc/nmt-test/data"], "out_dir"),
    ("translate", ["checkpoint=missing.pt", "output=/proc/nmt-test/hyp.de"], "output"),
    ("average", ["inputs=[missing.pt]", "output=/proc/nmt-test/avg.pt"], "output"),
])
@pytest.mark.slow
def test_outputs_are_checked_before_any_work(tmp_path, command, args, key):
    """The output error comes first, though the input (missing) would fail too."""
    out = run_cli(f"nmt-{command}", *args, cwd=tmp_path)
    assert out.returncode == 1
    lines = out.stderr.splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith(f"nmt-{command}: error: {key}: cannot create /proc/nmt-test/")
    assert "takes no new files" in lines[0]


def test_first_line_quotes_one_line_of_a_library_error():
    assert first_line(RuntimeError("  gloo: connection reset\n  at frame 1\n")) == (
        "gloo: connection reset")
    assert first_line(EOFError()) == "EOFError"
    assert first_line(ValueError("x" * 500), 120) == "x" * 120
