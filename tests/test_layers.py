"""The package layout shows the architecture: no import circle, no import from a lower layer
back up, and the batcher of nmt-serve needs neither FastAPI nor torch."""

import ast
from pathlib import Path

NMT = Path(__file__).resolve().parents[1] / "nmt"
# Lower layers first; a module may import its own layer and the layers before it.
LAYERS = [
    {"nmt.errors", "nmt.config_errors", "nmt.config", "nmt.files", "nmt.runtime", "nmt.scoring"},
    {"nmt.model", "nmt.tokenizer", "nmt.private_ops", "nmt.checkpoint",
     "nmt.distributed", "nmt.loss", "nmt.schedule", "nmt.cpu_training",
     "nmt.activation_checkpointing", "nmt.preemption", "nmt.corpus"},
    {"nmt.inference.fast", "nmt.inference.rules", "nmt.inference.core", "nmt.inference.search",
     "nmt.inference.workers", "nmt.inference.translator", "nmt.inference.constrained",
     "nmt.inference.stepping",
     "nmt.plot", "nmt.runlog", "nmt.align", "nmt.data", "nmt.shortlist"},
    {"nmt.inference.ct2_engine", "nmt.translate", "nmt.train", "nmt.preprocess", "nmt.export",
     "nmt.marian", "nmt.serve.batcher", "nmt.serve.app"},
    {"nmt.cli"},
]


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
    assert [m for m in g if m != "nmt" and m != "nmt.inference" and m != "nmt.serve"
            and layer(m) < 0] == []
    upward = [(m, i) for m, deps in g.items() for i in deps
              if layer(m) >= 0 and layer(i) > layer(m)]
    assert upward == []


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
    used = {name.split(".")[0] for name in imports(NMT / "serve" / "batcher.py")
            if not name.startswith("nmt.")}
    assert not used & {"torch", "fastapi", "pydantic", "starlette"}


# Each rule and strategy of decoding is one function (or class), defined once, in the
# decoding core (nmt.inference.core) or its rules (nmt.inference.rules): the empty-source
# rule, the lengths, the bans, forced prefixes, the shortlist, the strategies.
DECODING_RULES = {
    "empty_source", "max_output_lengths", "output_lengths", "length_penalty", "ban_specials",
    "ban_early_eos", "ban_repeated_ngrams", "ban_after_phrases", "apply_rules",
    "prefix_pieces", "force_prefix", "restrict_to_shortlist", "mask_to_shortlists",
    "sample_tokens", "sample_uniforms", "beam_candidates", "Greedy", "Beam", "Decoding", "Decoder",
}


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
    assert {n: m for n, m in placed.items()
            if m not in (["nmt.inference.core"], ["nmt.inference.rules"])} == {}


def test_no_module_imports_another_modules_private_names():
    private = []
    for path in NMT.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("nmt"):
                private += [(module_name(path), node.module, a.name) for a in node.names
                            if a.name.startswith("_") and not a.name.startswith("__")]
    assert private == []
