"""Imports: the package layout shows the architecture (no import circle, no import from a
lower layer back up, no core module importing a wing), the batcher of nmt-serve needs neither
FastAPI nor torch, scripts/ import nothing from tests/ (what both need lives in nmt/), the
engines sit behind one interface (nmt.engines.engine) without importing each other or the
export, and no command borrows from another."""

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NMT = ROOT / "nmt"
# The packages as layers, lower first: a module may import its own layer and the layers before
# it. A name stands for its module and, if it is a package, every module in it (so a new module
# takes its package's layer): nmt/'s top-level modules and its packages, nothing else.
LAYERS = [
    # the errors, the config schema and what it checks against
    {"nmt.errors", "nmt.config_errors", "nmt.config_checks", "nmt.config_corpora",
     "nmt.capabilities", "nmt.config"},
    {"nmt.system"},  # what nmt needs of the machine
    {"nmt.model", "nmt.variants"},  # the paper's model and its variants
    {"nmt.metrics"},  # BLEU and chrF
    {"nmt.data"},  # corpora to batches, the vocabulary, the shortlist file, texts into pieces
    {"nmt.checkpoint", "nmt.loading"},  # the checkpoint file; its model loaded (engines, exports)
    {"nmt.decoding"},  # the search, the models' side of a step, the fast model it steps
    {"nmt.engines"},  # the engine interface, nmt's Translator and its workers
    {"nmt.training"},  # nmt-train's loop (validation decodes with nmt's Translator)
    # the optional features (markup, glossary, words, COMET, MBR, augment, LibreTranslate,
    # importers and exporters, CTranslate2's engine): above the core, which never imports them
    {"nmt.wings"},
    {"nmt.inference"},  # the translation pipeline, and the engine pick (open_translator)
    {"nmt.serve"},
    {"nmt.commands"},  # each command's plain function (COMMANDS)
    {"nmt.cli", "nmt.testing"},  # the entry points; the tests' GPU harness
]
# The commands' plain functions, one module each: none imports another (what two need lives
# below both).
COMMANDS = {f"nmt.commands.{c}" for c in ("preprocess", "train", "average", "translate",
                                          "export", "import_", "serve")}
# A command's own part, beside it and named for it: the command alone imports it.
COMMAND_PARTS = {"nmt.commands.translate_io": "nmt.commands.translate"}
# The engines and the CTranslate2 export: none imports another, nor nmt-export's module.
ENGINES = {"nmt.engines.translator", "nmt.wings.ctranslate2", "nmt.wings.interop.ct2_export"}
# nmt/'s top level: the paper's model and its variants, its checkpoint and what loads one, the
# config schema and the engines' capabilities it checks against, the errors.
TOP_LEVEL = {"nmt", "nmt.model", "nmt.variants", "nmt.checkpoint", "nmt.loading", "nmt.config",
             "nmt.config_errors", "nmt.config_checks", "nmt.config_corpora", "nmt.capabilities",
             "nmt.errors"}
# What the translation pipeline (nmt.inference.pipeline) does between text and tokens, which
# the front ends reach through it only: one code path, the same text from both.
PIPELINE_INNER = {
    "nmt.data.segment": {"split_for", "split_text", "fit_for", "sample_stream"},
    "nmt.wings.markup.parse": {"parse"},
    "nmt.wings.markup.restore": {"put_back", "restore"},
    "nmt.wings.glossary": {"with_terms"},
    "nmt.wings.align": {"sentence_alignments"},
    "nmt.wings.words": {"words"},
}
FRONT_ENDS = {"nmt.commands.translate", "nmt.serve.service"}
PACKAGES = {"nmt.cli", "nmt.commands", "nmt.data", "nmt.decoding", "nmt.engines", "nmt.inference",
            "nmt.metrics", "nmt.serve", "nmt.system", "nmt.testing", "nmt.training", "nmt.wings"}
WINGS = "nmt.wings"


def module_name(path: Path) -> str:
    parts = path.relative_to(NMT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> set[str]:
    """The nmt modules (and third-party top-level packages) a file imports, anywhere in it."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            out |= {f"{node.module}.{a.name}" for a in node.names}
    return out


def graph() -> dict[str, set[str]]:
    modules = {module_name(p): p for p in NMT.rglob("*.py") if "configs" not in p.parts}
    return {m: {i for i in imports(p) if i in modules and i != m} for m, p in modules.items()}


def layer(module: str) -> int:
    for n, members in enumerate(LAYERS):
        if module in members or any(module.startswith(m + ".") for m in members):
            return n
    return -1


def test_every_module_has_a_layer_and_imports_none_above_it():
    g = graph()
    assert [m for m in g if m not in TOP_LEVEL | PACKAGES and layer(m) < 0] == []
    upward = [(m, i) for m, deps in g.items() for i in deps
              if layer(m) >= 0 and layer(i) > layer(m)]
    assert upward == []


def wing_imports(g: dict[str, set[str]], is_wing) -> set[tuple[str, str]]:
    """(module, wing) for each core module of graph `g` that imports a wing, anywhere in it
    (inside a function too): the core is every module that `is_wing` does not name and that
    sits below the wings' layer (nmt's top level included)."""
    above = {m for m in g if layer(m) > layer(WINGS)}
    return {(m, i) for m in g if not is_wing(m) and m not in above for i in g[m] if is_wing(i)}


def test_no_core_module_imports_a_wing():
    """The optional features import the core, never the other way round: where the core uses
    one (validation's COMET, the training batches' augment, preprocessing's COMET filter, the
    engine pick's CTranslate2), the front ends above the wings pass it in."""
    assert wing_imports(graph(), lambda m: m == WINGS or m.startswith(WINGS + ".")) == set()


def test_the_layers_are_packages():
    """LAYERS names each package of nmt/ and each top-level module once, and no module inside a
    package: a package is one layer."""
    named = [n for members in LAYERS for n in members]
    assert sorted(named) == sorted(PACKAGES | TOP_LEVEL - {"nmt"})


def test_no_import_circle():
    g, done = graph(), set()

    def visit(m: str, path: list[str]) -> None:
        assert m not in path, " -> ".join(path + [m])
        if m in done:
            return
        for dep in g[m]:
            visit(dep, path + [m])
        done.add(m)

    for m in g:
        visit(m, [])


def test_the_batcher_needs_neither_fastapi_nor_torch():
    """Imported in a fresh interpreter, with everything it imports in turn."""
    loaded = subprocess.run([sys.executable, "-c", "import sys, nmt.serve.batcher; "
                             "print(' '.join(sorted(m.split('.')[0] for m in sys.modules)))"],
                            capture_output=True, text=True, check=True).stdout.split()
    assert not set(loaded) & {"torch", "fastapi", "pydantic", "starlette"}


def test_the_top_level_holds_a_handful_of_modules_and_the_packages():
    """Everything but the paper's model, the config schema and the errors is in a subpackage
    named for what it is; each command's plain function is in nmt.commands."""
    top = {module_name(p) for p in NMT.glob("*.py")} | {
        module_name(p.parent) for p in NMT.glob("*/__init__.py")}
    assert top == TOP_LEVEL | PACKAGES
    commands = {module_name(p) for p in (NMT / "commands").glob("*.py")} - {"nmt.commands"}
    assert commands == COMMANDS | set(COMMAND_PARTS)
    # nmt.cli.plain: the entry points' composition of a plain command line without Hydra
    entry_points = {p.stem for p in (NMT / "cli").glob("*.py")} - {"__init__", "plain"}
    assert {f"nmt.commands.{e}" for e in entry_points} == COMMANDS


# A source file holds one concern, and fits a sitting: at most MAX_LINES lines. The config
# schemas may take up to 800; the decoding core and the fast model are reworked and split by the
# issue on decoding at every batch size.
MAX_LINES = 600
LONGER = {"nmt/config.py": 800, "nmt/decoding/fast_model.py": None, "nmt/decoding/core.py": None}


def test_no_source_file_is_longer_than_a_sitting():
    lengths = {str(p.relative_to(ROOT)): len(p.read_text(encoding="utf-8").splitlines())
               for p in NMT.rglob("*.py")}
    limits = {path: LONGER.get(path, MAX_LINES) for path in lengths}
    assert {p: n for p, n in lengths.items() if limits[p] is not None and n > limits[p]} == {}


def test_no_command_imports_another():
    """Nor any module a command's part, but its command."""
    g = graph()
    assert {(m, i) for m in COMMANDS for i in g[m] if i in COMMANDS} == set()
    assert {(m, i) for m in g for i in g[m] if COMMAND_PARTS.get(i, m) != m} == set()


def test_the_engines_and_the_export_do_not_import_each_other():
    g = graph()
    ct2_export = {"nmt.wings.interop.ct2_export"}
    allowed = {"nmt.wings.ctranslate2": ct2_export}  # its cache
    assert {(m, i) for m in ENGINES & set(g) for i in g[m]
            if i in ENGINES | {"nmt.commands.export", "nmt.engines.engine"}
            and i not in allowed.get(m, set())} == set()


def test_the_front_ends_call_the_pipeline_not_its_inner_functions():
    """nmt-translate and nmt-serve split, put tags back, restore terms, rejoin and score words
    through nmt.inference.pipeline alone (they used to hold a copy each)."""
    inner = {f"{m}.{name}" for m, names in PIPELINE_INNER.items() for name in names}
    for module in FRONT_ENDS:
        found = imports(NMT.parent / (module.replace(".", "/") + ".py"))
        assert "nmt.inference.pipeline" in found, module
        assert sorted(found & inner) == [], module


def test_decoding_outside_the_engines_goes_through_the_interface():
    """The commands, alignments and plots reach an engine through nmt.engines.engine and the
    engine pick, open_translator (nmt-train's validation, nmt.training.validation, decodes with
    nmt's own Translator), which nmt.inference.engines alone defines."""
    g = graph()
    direct = {"nmt.engines.translator", "nmt.wings.ctranslate2"}
    # reranking loads its reverse model as nmt's own Translator (rerank.model)
    own = {"nmt.training.validation", "nmt.wings.rerank", "nmt.inference.engines"}
    users = {m for m in g if not m.startswith("nmt.engines") and m not in own}
    assert {(m, i) for m in users for i in g[m] if i in direct} == set()
    defines = [p for p in NMT.rglob("*.py") if "configs" not in p.parts and any(
        isinstance(node, ast.FunctionDef) and node.name == "open_translator"
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))))]
    assert [module_name(p) for p in defines] == ["nmt.inference.engines"]


def test_both_engines_have_every_method_of_the_interface():
    from nmt.engines.engine import Engine
    from nmt.engines.translator import Translator
    from nmt.wings.ctranslate2 import CT2Translator

    methods = {name for name, value in vars(Engine).items()
               if callable(value) or isinstance(value, property)} - set(vars(object))
    assert methods >= {"translate_ids", "score_ids", "stepper", "close", "max_input_tokens"}
    for engine in (Translator, CT2Translator):
        assert [m for m in sorted(methods | {"load", "__enter__", "__exit__"})
                if not hasattr(engine, m)] == []
    assert not hasattr(Translator, "check_search")  # refusals: capabilities


def test_scripts_import_nothing_from_tests():
    """A script that puts tests/ on sys.path to borrow a helper ties a tool to the test suite;
    the helper belongs in nmt/ (nmt/testing/gpu_sim.py, once tests/gpu_sim.py)."""
    helpers = {p.stem for p in (ROOT / "tests").rglob("*.py")}
    borrowed = {f"{path.name}: {name}" for path in sorted((ROOT / "scripts").rglob("*.py"))
                for name in imports(path) if name.split(".")[0] in helpers | {"tests"}}
    assert sorted(borrowed) == []  # a module of tests/, imported by name or as tests.*


def test_the_model_imports_nothing_of_nmt_but_its_config():
    """nmt/model.py is the paper: speed paths and side channels live beside it."""
    assert graph()["nmt.model"] == {"nmt.config"}


# Each rule and strategy of decoding is one function (or class), defined once, in the
# decoding core (nmt.decoding.core), its strategies (nmt.decoding.strategies), its length
# rules (nmt.decoding.lengths), its rules (nmt.decoding.rules) or the models' side of a step
# (nmt.decoding.decoder): the empty-source rule, the lengths, the bans, forced prefixes, the
# shortlist, the strategies and what the decoding keeps.
DECODING_RULES = {
    "empty_source", "max_output_lengths", "output_lengths", "length_penalty", "ban_specials",
    "ban_early_eos", "ban_repeated_ngrams", "ban_after_phrases", "apply_rules",
    "prefix_pieces", "force_prefix", "restrict_to_shortlist", "mask_to_shortlists",
    "sample_tokens", "sample_uniforms", "epsilon_cut", "use_beams", "choose_greedy",
    "choose_sample", "choose_beam", "going_on", "eos_last", "read_step", "Units", "Decoding",
    "Decoder",
}
STRATEGIES = ("choose_greedy", "choose_sample", "choose_beam")
DECODING = (["nmt.decoding.core"], ["nmt.decoding.strategies"], ["nmt.decoding.lengths"],
            ["nmt.decoding.rules"], ["nmt.decoding.decoder"])


def definitions() -> dict[str, list[str]]:
    """Every function and class name defined anywhere in nmt (methods included) -> the
    modules that define it."""
    where: dict[str, list[str]] = {}
    for path in NMT.rglob("*.py"):
        if "configs" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.ClassDef):
                where.setdefault(node.name, []).append(module_name(path))
    return where


def test_each_decoding_rule_is_defined_once_in_the_core():
    where = definitions()
    placed = {name: where.get(name, []) for name in DECODING_RULES}
    assert {n: m for n, m in placed.items() if m not in DECODING} == {}


def test_the_strategies_choose_and_the_decoding_keeps():
    """A strategy is a function of the log-probabilities, the rows' scores and its own small
    state: it takes no Decoding (nor self) and calls none of its methods; only the Decoding
    reorders, writes and finishes (its admission included)."""
    def parsed(name: str) -> ast.Module:
        return ast.parse((NMT / "decoding" / name).read_text(encoding="utf-8"))

    functions = {n.name: n for n in parsed("strategies.py").body
                 if isinstance(n, ast.FunctionDef)}
    classes = [n for module in ("core.py", "admission.py") for n in parsed(module).body
               if isinstance(n, ast.ClassDef) and n.name in ("Decoding", "Admission")]
    assert len(classes) == 2
    methods = {n.name for c in classes for n in c.body if isinstance(n, ast.FunctionDef)}
    for name in STRATEGIES:
        fn = functions[name]  # a module-level function, not a method
        args = [a.arg for a in fn.args.args]
        notes = [ast.unparse(a.annotation) for a in fn.args.args if a.annotation]
        assert "self" not in args and "dec" not in args and "Decoding" not in notes, name
        called = {n.func.attr for n in ast.walk(fn) if isinstance(n, ast.Call)
                  and isinstance(n.func, ast.Attribute)}
        assert not called & (methods - {"__init__"}), name


def test_no_module_imports_another_modules_private_names():
    private = []
    for path in NMT.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("nmt"):
                private += [(module_name(path), node.module, a.name) for a in node.names
                            if a.name.startswith("_") and not a.name.startswith("__")]
    assert private == []
