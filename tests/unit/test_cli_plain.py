"""A plain command line composed without Hydra (nmt.cli.plain) gives Hydra's config and job:
its values typed as Hydra's override grammar types them, its config equal to Hydra's compose
for a corpus of command lines (or Hydra composes it: everything outside the plain grammar, and
every bad value, whose error Hydra reports), its job run with Hydra's logging and failure line."""

import dataclasses
import gc
import importlib
import logging
import math
import random
import shlex
import sys
from pathlib import Path

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

import nmt.cli
from nmt.cli import hydra_app
from nmt.cli.plain import VALUE, NotPlain, defaults_list, plain_job, typed
from nmt.config import SCHEMAS, AverageConfig, compose, to_object

EDGE_VALUES = [
    "1e-3", "1E+3", "inf", "-inf", "+Inf", "NaN", "nan-x", "infinity", "007", "0", "-0", "+1",
    "1_000", "1__0", "1_", "_1", "1.", ".5", "1.e5", "1_0.5", ".5_5", "1e", "e5", "1e5x", "0x10",
    "true", "TRUE", "False", "tRuE-1", "null", "NULL", "Null", "nullx", "0.0.0.0", "a.pt",
    "x_1/a-b.pt", "/x_1/a-b.pt", "hf:train", "-", ".", "+", "/", ":", "%", "@", "a@b", "10%",
    "", "-1.5e-3",
]
PIECES = ["0", "1", "7", "_", ".", "e", "E", "+", "-", "inf", "nan", "true", "null", "a", "x9",
          "/", ":", "%", "@"]


def hydras_value(value: str):
    """The value Hydra's override parser gives `k=value`."""
    return OverridesParser.create().parse_override(f"k={value}").value()


def same(a, b) -> bool:
    """Equal values of the same types, recursively through dataclasses and lists (NaN equal to
    NaN)."""
    if type(a) is not type(b):
        return False
    if dataclasses.is_dataclass(a):
        return all(same(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a))
    if isinstance(a, list):
        return len(a) == len(b) and all(map(same, a, b))
    return a == b or (isinstance(a, float) and math.isnan(a) and math.isnan(b))


def test_values_are_typed_as_hydras_override_grammar_types_them():
    rng = random.Random(60)
    values = EDGE_VALUES + ["".join(rng.choices(PIECES, k=rng.randint(1, 5)))
                            for _ in range(400)]
    for value in values:
        assert VALUE.fullmatch(value), value
        assert same(typed(value), hydras_value(value)), (value, typed(value),
                                                         hydras_value(value))


# (command, command line, what happens): "plain" (composed without Hydra, equal to Hydra's),
# "hydra" (left to Hydra, which composes it) or "refused" (left to Hydra, which refuses it)
CORPUS = [
    ("translate", "checkpoint=/runs/averaged.pt input=one.txt", "plain"),
    ("translate", "checkpoint=a.pt search.beam_size=1 search.alpha=0 search.max_len_b=1_000",
     "plain"),
    ("translate", "checkpoint=a.pt search.alpha=1e-3 search.max_len_a=.5 quiet=TRUE", "plain"),
    ("translate", "checkpoint=a.pt output=out.de ref= split=none src_lang=en tgt_lang=de",
     "plain"),
    ("translate", "checkpoint=a.pt search.dtype=int8 search.max_tokens=2048 weights=ema",
     "plain"),
    ("translate", "checkpoint=hf:2024.01/a@b%-c.pt threads=+1 prefix=False", "plain"),
    ("translate", "checkpoint=a.pt search.beam_size=007", "hydra"),  # "007": Hydra makes it 7
    ("translate", "checkpoint=a.pt quiet=yes", "hydra"),  # a string OmegaConf makes a bool
    ("translate", "checkpoint=a.pt input=123", "hydra"),  # an int OmegaConf makes a string
    ("translate", "checkpoint=a.pt search.beam_size=2 search.beam_size=3", "hydra"),
    ("translate", "checkpoint=[a.pt,b.pt]", "hydra"),
    ("translate", "\"checkpoint='a b.pt'\"", "hydra"),
    ("translate", "checkpoint=a.pt +search.x=1", "refused"),
    ("translate", "checkpoint=a.pt ~quiet", "hydra"),
    ("translate", "checkpoint=a.pt hydra.verbose=true", "hydra"),
    ("translate", "checkpoint=${oc.env:HOME}/a.pt", "hydra"),
    ("translate", "checkpoint=a.pt search.beam_size=1,2", "refused"),  # a sweep without -m
    ("translate", "checkpoint=a.pt search.alpha=inf", "plain"),
    ("translate", "checkpoint=a.pt threads=-1", "refused"),
    ("translate", "checkpoint=a.pt beam_size=5", "refused"),
    ("translate", "checkpoint=a.pt search=3", "refused"),
    ("translate", "checkpoint=a.pt ref=null", "refused"),
    ("translate", "checkpoint=a.pt search.beam_size=abc", "refused"),
    ("translate", "checkpoint=a.pt search.beam_size=1.5", "refused"),
    ("translate", "input=one.txt", "refused"),  # checkpoint is missing
    ("translate", "checkpoint=a.pt search.nbest=9", "refused"),  # the schema's check
    ("serve", "checkpoint=a.pt", "plain"),
    ("serve", "checkpoint=a.pt host=0.0.0.0 port=80_80 max_wait_ms=10 search.beam_size=1",
     "plain"),
    ("serve", "models=dir pivot=false max_models=2 memory_gb=1.5", "plain"),
    ("serve", "checkpoint=a.pt port=70000", "refused"),
    ("serve", "checkpoint=a.pt max_wait_ms=fast", "refused"),
    ("average", "output=o run_dir=r last=3", "plain"),
    ("average", "output=o inputs=3", "refused"),
    ("average", "output=o lats=3", "refused"),
    ("export", "checkpoint=c output=o quantization=int8", "plain"),
    ("import", "input=d output=o.pt", "plain"),
    ("preprocess", "src_lang=en tgt_lang=de train=hf:train out_dir=DATA bpe.vocab_size=8000",
     "plain"),
    ("train", "data_dir=d run_dir=r", "refused"),  # no model: +model=... is Hydra's
    ("train", "+model=tiny data_dir=d run_dir=r train.max_updates=10", "hydra"),
]


def hydras_config(name: str, args: list[str]):
    """Hydra's composition of the command line, validated as the command validates it; the
    exception where either refuses it."""
    try:
        cfg = compose(name, args)
        return cfg, to_object(cfg, SCHEMAS[f"{name}_schema"])
    except Exception as e:  # noqa: BLE001 (any refusal)
        return None, e


@pytest.mark.parametrize("name,line,outcome", CORPUS, ids=[f"{c[0]} {c[1]}" for c in CORPUS])
def test_a_plain_command_line_composes_hydras_config_and_any_other_goes_to_hydra(
        name, line, outcome):
    args = shlex.split(line)  # as a shell splits it
    schema = SCHEMAS[f"{name}_schema"]
    job = plain_job(name, schema, args)
    cfg, expected = hydras_config(name, args)
    if outcome == "plain":
        assert job is not None and job.overrides == args
        assert same(job.config, expected), (job.config, expected)
        assert OmegaConf.to_yaml(OmegaConf.structured(job.config)) == OmegaConf.to_yaml(cfg)
    else:
        assert job is None
        assert isinstance(expected, Exception) == (outcome == "refused"), expected


@pytest.fixture
def logging_kept():
    """The root logger's level and handlers put back after the test (Hydra's and the plain
    path's logging setup replace them)."""
    root = logging.getLogger()
    level, handlers = root.level, root.handlers[:]
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def logging_state() -> tuple:
    """What Hydra's logging setup decides: the root logger's level and handlers (their kind,
    stream and format), and its hydra_logging's one named logger's level."""
    root = logging.getLogger()
    return (root.level, [(type(h), getattr(h, "stream", None), h.level,
                          getattr(h.formatter, "_fmt", None))
                         for h in root.handlers],
            logging.getLogger("logging_example").level)


@pytest.mark.parametrize("fails", [False, True], ids=["done", "failed"])
def test_a_plain_job_runs_as_hydras_job(monkeypatch, capsys, logging_kept, fails):
    """The same config reaches the command, with the same logging set up and every object
    frozen out of the garbage collector's view first (a passed config freezes nothing); a
    failed job's exception comes after Hydra's line naming the overrides, on either path."""
    seen, frozen = [], []

    def run(config: AverageConfig) -> None:
        seen.append((config, logging_state(), len(frozen)))
        if fails:
            raise RuntimeError("a bug")

    def call(*cfg) -> str:
        """main(*cfg), the job's failure expected where it fails; what it wrote on stderr."""
        if fails:
            with pytest.raises(RuntimeError, match="a bug"):
                main(*cfg)
        else:
            main(*cfg)
        return capsys.readouterr().err

    main = hydra_app("nmt-average", "average", AverageConfig)(run)
    args = ["output=o.pt", "run_dir=r", "last=3"]
    monkeypatch.setattr(gc, "freeze", lambda: frozen.append(1))  # not this process's objects
    monkeypatch.setattr(sys, "argv", ["nmt-average", *args])
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    errors = [call()]
    monkeypatch.setattr(nmt.cli, "plain_job", lambda *a: None)
    errors.append(call())
    call(compose("average", args))
    assert [n for *_, n in seen] == [1, 2, 2]
    assert seen[0][:2] == seen[1][:2] and seen[2][0] == seen[0][0]
    assert seen[0][1][0] == logging.INFO and seen[0][1][1][0][1] is sys.stdout
    failed = f"Error executing job with overrides: {args}\n" if fails else ""
    assert errors == [failed, failed]


def test_the_schemas_missing_is_omegaconfs():
    """nmt.config defines MISSING without importing OmegaConf: OmegaConf's own value."""
    import omegaconf

    import nmt.config

    assert nmt.config.MISSING == omegaconf.MISSING


PRIMARY = ("defaults:\n  - average_schema\n  - common\n  - override hydra/job_logging: stdout\n"
           "  - _self_\n")
COMMON = ("# @package _global_\nhydra:\n  run:\n    dir: .\n  output_subdir: null\n  job:\n"
          "    chdir: false\n")


def test_nmts_defaults_lists_are_composed_without_hydra_with_hydras_logging_files(tmp_path):
    """configs/<command>.yaml's shape: the logging files are Hydra's, default for its own
    logging and the one the file overrides; a header is read only at a file's top."""
    configs = Path(next(iter(importlib.import_module("nmt.configs").__path__)))
    assert [p.parts[-2:] for p in defaults_list("average", configs)] == [
        ("hydra_logging", "default.yaml"), ("job_logging", "stdout.yaml")]
    (tmp_path / "average.yaml").write_text(
        PRIMARY.replace("stdout", "stdout\n  - override hydra/hydra_logging: disabled"),
        encoding="utf-8")
    (tmp_path / "common.yaml").write_text("# nmt's\n# @package foo\n" + COMMON[20:],
                                          encoding="utf-8")
    assert [p.parts[-2:] for p in defaults_list("average", tmp_path)] == [
        ("hydra_logging", "disabled.yaml"), ("job_logging", "stdout.yaml")]
    (tmp_path / "hydra" / "job_logging").mkdir(parents=True)  # nmt's own: Hydra might read it
    with pytest.raises(NotPlain):
        defaults_list("average", tmp_path)


@pytest.mark.parametrize("primary,common", [
    (PRIMARY + "last: 3\n", COMMON),  # the file sets a value
    (PRIMARY.replace("  - common", "  - model: small"), COMMON),  # a config group's choice
    (PRIMARY.replace("job_logging: stdout", "launcher: slurm"), COMMON),
    (PRIMARY.replace("override hydra/", "hydra/"), COMMON),
    ("# @package foo\n" + PRIMARY, COMMON),
    (PRIMARY, COMMON.replace("_global_", "foo")),
    (PRIMARY, "# @bogus x\n" + COMMON),
    (PRIMARY, COMMON + "last: 3\n"),
    (PRIMARY, COMMON.replace("dir: .", "dir: outputs")),  # a folder made, or changed into
    (PRIMARY, COMMON.replace("chdir: false", "chdir: true")),
    (PRIMARY, COMMON.replace("  output_subdir: null\n", "")),  # .hydra/ written
    (PRIMARY, COMMON + "  verbose: true\n"),
    (PRIMARY, COMMON + "  job_logging:\n    root: null\n"),
    (PRIMARY.replace("stdout", "null"), COMMON),  # Hydra's fallback logging: not reproduced
    (PRIMARY.replace("stdout", "bogus"), COMMON),
], ids=range(15))
def test_a_defaults_list_or_hydra_settings_it_does_not_reproduce_go_to_hydra(
        tmp_path, primary, common):
    """Anything but the shape of nmt's configs/<command>.yaml, Hydra composes."""
    (tmp_path / "average.yaml").write_text(primary, encoding="utf-8")
    (tmp_path / "common.yaml").write_text(common, encoding="utf-8")
    with pytest.raises(NotPlain):
        defaults_list("average", tmp_path)
