"""Startup (issue 60): what a command imports and composes before its first batch. Importing
nmt-translate's and nmt-serve's paths loads none of the packages a run may not need (sacreBLEU,
CTranslate2, transformers, matplotlib; FastAPI outside nmt-serve), a one-line translation
imports no more of them nor the wings that markup=, alignment= or an Argos package need, nor
Hydra and OmegaConf (nmt.cli.plain composes a plain command line); where Hydra composes, it does
so once and stores only its own schema. scripts/bench_startup.py measures
the time (docs/results.md, "Startup")."""

import json
import subprocess
import sys

import pytest

from nmt.cli import is_plain
from nmt.cli.plain import plain_job
from nmt.config import TranslateConfig, compose, to_object

HEAVY = ("sacrebleu", "ctranslate2", "transformers", "fastapi", "matplotlib",
         "nmt.wings.ctranslate2", "nmt.wings.mbr", "nmt.training.plot")
# ... and, on nmt-translate's path without markup=, alignment=, an Argos package or worker
# processes:
WINGS = ("nmt.wings.markup.document", "nmt.wings.markup.restore", "nmt.wings.align",
         "nmt.wings.interop.argos", "html.parser", "concurrent.futures.process")

PROBE = """
import json, sys
from hydra._internal.hydra import Hydra
composed = []
inner = Hydra.compose_config
Hydra.compose_config = lambda self, *a, **k: composed.append(1) or inner(self, *a, **k)
heavy = {heavy!r}
import nmt.cli.translate, nmt.commands.translate
imported = [m for m in heavy if m in sys.modules]
sys.argv = ["nmt-translate", *sys.argv[1:]]
nmt.cli.translate.main()
ran = [m for m in heavy if m in sys.modules]
from hydra.core.config_store import ConfigStore
stored = sorted(n for n in ConfigStore.instance().repo if n.endswith("_schema.yaml"))
import nmt.cli.serve, nmt.commands.serve
serve = [m for m in heavy if m in sys.modules and m != "fastapi" and m not in {wings!r}]
print(json.dumps({{"imported": imported, "ran": ran, "serve": serve, "composed": len(composed),
                  "stored": stored}}))
"""
# A plain command line: nmt.cli.plain composes it, and neither Hydra nor OmegaConf is imported
PLAIN_PROBE = """
import gc, json, sys
import nmt.cli.translate
sys.argv = ["nmt-translate", *sys.argv[1:]]
nmt.cli.translate.main()
print(json.dumps({{"loaded": [m for m in ("hydra", "omegaconf", "antlr4", *{heavy!r})
                              if m in sys.modules], "frozen": gc.get_freeze_count() > 0}}))
"""


def probe(code: str, *args: str, cwd) -> object:
    """Run `code` in a fresh interpreter with the command line `args`; its last line's JSON."""
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                         check=True, cwd=cwd).stdout
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.slow
def test_a_one_line_translation_loads_no_optional_package_and_composes_once(ckpts, tmp_path):
    """A one-line nmt-translate imports none of HEAVY and WINGS; a plain command line imports
    neither Hydra nor OmegaConf and freezes torch's objects (nmt.cli), and one that Hydra
    composes (a list of checkpoints) is composed once and stores only its own schema in
    Hydra's ConfigStore (each stored schema costs its building)."""
    line = tmp_path / "one.en"
    line.write_text("open the file\n", encoding="utf-8")
    args = (f"input={line}", "search.max_len_b=3")
    plain = PLAIN_PROBE.format(heavy=HEAVY + WINGS)
    found = probe(plain, f"checkpoint={ckpts[0]}", *args, cwd=tmp_path)
    assert found == {"loaded": [], "frozen": True}  # torch's objects out of the collector's view
    found = probe(PROBE.format(heavy=HEAVY + WINGS, wings=WINGS), f"checkpoint=[{ckpts[0]}]",
                  *args, cwd=tmp_path)
    assert found == {"imported": [], "ran": [], "serve": [], "composed": 1,
                     "stored": ["translate_schema.yaml"]}


def test_the_benchmarks_command_line_is_composed_without_hydra_into_hydras_config():
    """scripts/bench_startup.py's one-line translation takes the plain path (nmt.cli.plain),
    whose config is Hydra's (tests/unit/test_cli_plain.py compares many more)."""
    args = ["checkpoint=/runs/averaged.pt", "input=one.txt", "threads=1"]
    job = plain_job("translate", TranslateConfig, args)
    assert job is not None
    assert job.config == to_object(compose("translate", args), TranslateConfig)


def test_only_a_command_line_of_overrides_skips_hydra_mains_first_composition():
    assert is_plain(["checkpoint=a.pt", "+x=1", "~y", "search.beam_size=2"])
    assert is_plain([])
    for args in (["--help"], ["-m", "a=1,2"], ["--cfg", "job"], ["hydra.mode=MULTIRUN"],
                 ["+hydra.mode=RUN"], ["a=1", "--info"]):
        assert not is_plain(args), args


@pytest.mark.slow
def test_a_file_of_a_few_lines_decodes_here_on_one_thread_as_the_workers_would(
        ckpts, test_en, tmp_path, monkeypatch):
    """An input file of fewer than FEW_LINES lines forks no worker process and decodes in this
    process on one PyTorch thread (workers=2 asked for); its translations are the workers'."""
    import torch
    from translate_helpers import translate_config

    import nmt.commands.translate as command

    lines = test_en.read_text(encoding="utf-8").splitlines()[:3]
    few = tmp_path / "few.en"
    few.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    opened, open_translator = [], command.open_translator

    def spy(*args, **kwargs):
        translator = open_translator(*args, **kwargs)
        opened.append((translator.pool.processes, translator.workers, torch.get_num_threads()))
        return translator

    monkeypatch.setattr(command, "open_translator", spy)
    threads = torch.get_num_threads()
    results = []
    try:
        for few_lines in (0, command.FEW_LINES):  # 0: none is few, the workers decode
            monkeypatch.setattr(command, "FEW_LINES", few_lines)
            results.append(command.translate(translate_config(
                checkpoint=ckpts[0], input=few, output=tmp_path / f"{few_lines}.de", workers=2,
                **{"search.beam_size": 2})))
    finally:
        torch.set_num_threads(threads)
    assert opened == [(True, 2, threads), (False, 1, 1)]
    assert results[0].hypotheses == results[1].hypotheses and len(results[1].hypotheses) == 3


def test_a_pipes_few_lines_decode_on_one_thread_and_more_on_the_threads_set(
        ckpts, tmp_path, monkeypatch):
    """Lines arriving through a pipe, a few at a time, decode on one PyTorch thread (the
    waits of a second one on such small steps only cost CPU time); PyTorch's threads are
    back afterwards, and a chunk of FEW_LINES rows, or threads=, keeps them."""
    import io
    from types import SimpleNamespace

    import torch
    from translate_helpers import translate_config

    import nmt.commands.translate as command

    seen, run_search = [], command.run_search

    def spy(*args, **kwargs):
        seen.append(torch.get_num_threads())
        return run_search(*args, **kwargs)

    monkeypatch.setattr(command, "run_search", spy)
    monkeypatch.setattr(command, "is_interactive", lambda path: path == "-")
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"open the file\nclose it\n")))
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        out = command.translate(translate_config(checkpoint=ckpts[0], output=tmp_path / "o.de"))
        assert torch.get_num_threads() == 2
        cpu = SimpleNamespace(device=torch.device("cpu"))
        for rows, cfg_threads in ((command.FEW_LINES, 0), (3, 2)):
            cfg = translate_config(checkpoint=ckpts[0], threads=cfg_threads)
            session = SimpleNamespace(cfg=cfg, translator=cpu)
            with command.decoding_threads(session, rows):
                assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(threads)
    assert len(out.hypotheses) == 2 and seen and set(seen) == {1}


# Every command's --cfg job (a recipe's dry run validates each step with it) in one interpreter
CFG_PROBE = """
import importlib, json, sys
for command in ("preprocess", "train", "translate", "average", "export", "import_", "serve"):
    sys.argv = ["nmt-" + command, "--cfg", "job"]
    try:
        importlib.import_module("nmt.cli." + command).main()
    except SystemExit:
        pass
print(json.dumps("torch" in sys.modules))
"""


@pytest.mark.slow
def test_every_commands_cfg_job_answers_without_importing_torch(tmp_path):
    """--cfg job prints the composed config before anything is run: no command imports torch
    for it (nmt-train's exit under torchrun did, ~3 s a step of a recipe's dry run)."""
    assert probe(CFG_PROBE, cwd=tmp_path) is False
