"""The combinations: engines x model kinds x interfaces x searches, one server per model.

Each cell gives nmt-translate's output with the same engine (fp32: identical text), or is
refused in one line whose words come from the one capabilities table (nmt.capabilities)
and are the same in every interface that refuses it, or is n/a: LibreTranslate has no prefix,
constraint, MBR or sampling field, its form client (libretranslatepy) sends no alternatives
(no beam), and a text is split as the server's `split` says. `make test` runs a set of cells
that holds every pair of values of two dimensions (all pairs); the whole product is
slow-marked and run by `make test-matrix` (NMT_MATRIX_FULL=1), runs engine=nmt's servers
under both batching policies, and writes the table that docs/commands.md holds
(NMT_WRITE_MATRIX=1 writes it there; without, the test fails where the two differ). Both
check their cells against that table.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
from pathlib import Path
from urllib.error import HTTPError

import pytest
from multi_helpers import multi_overrides, write_raw
from test_m2m100 import imported as import_dir
from test_m2m100 import nllb_dir  # noqa: F401 (a fixture)
from test_marian import build_marian
from translate_helpers import tiny_model

from nmt.commands.preprocess import preprocess
from nmt.commands.train import load_vocab
from nmt.commands.translate import translate
from nmt.config import PreprocessConfig, TranslateConfig, compose, to_object
from nmt.data.manifest import read_manifest
from nmt.errors import NmtError
from nmt.system.files import read_lines
from nmt.training.checkpoint import save_checkpoint

pytest.importorskip("fastapi")
pytest.importorskip("ctranslate2")
from test_serve import InProcess  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

ENGINES = ("nmt", "ctranslate2")
KINDS = ("bilingual", "tag", "marian", "opus-mt", "nllb")
INTERFACES = ("nmt-translate", "api", "libre-form", "libre-json")
SEARCHES = ("greedy", "beam", "sampling", "mbr", "prefix", "constraints", "split")
DIMENSIONS = (ENGINES, KINDS, INTERFACES, SEARCHES)
COMMON = ("search.max_len_a=0", "search.max_len_b=6", "search.alpha=0", "search.beam_size=1")
TEXTS = ["Open the file.", "Close the window and save all changes.", "Show hidden files."]
SPLIT = ["Open the file. Close the window.", "Save all changes! Show hidden files."]
PREFIXES = ["a", "", "the"]  # forced output starts, one per text
PHRASES = [["e"], [], ["s", "t"]]  # lexical constraints, per text
DOC = Path(__file__).resolve().parents[2] / "docs" / "commands.md"
BEGIN, END = "<!-- matrix: begin (tests/system/test_matrix.py) -->", "<!-- matrix: end -->"


@dataclasses.dataclass(frozen=True)
class Kind:
    """A model kind: its checkpoint, the languages chosen for it (nmt's keys and fields), the
    server's settings and LibreTranslate's source and target codes."""

    checkpoint: Path
    languages: dict  # nmt-translate's keys and nmt's request fields: src_lang, tgt_lang
    serve: tuple[str, ...]  # nmt-serve overrides
    source: str  # LibreTranslate's source code
    target: str  # LibreTranslate's target code
    split_lang: str  # the source's ISO 639-1 code (sentence splitting)


@dataclasses.dataclass(frozen=True)
class Search:
    """One search as each interface asks for it."""

    keys: tuple[str, ...]  # nmt-translate's overrides
    fields: dict  # nmt's API fields
    texts: tuple[str, ...] = tuple(TEXTS)


SEARCH = {
    "greedy": Search((), {}),
    "beam": Search(("search.beam_size=2",), {"beam_size": 2}),
    "sampling": Search(("search.sampling=true", "search.seed=3", "search.temperature=3.0"),
                       {"sampling": True, "seed": 3, "temperature": 3.0}),
    "mbr": Search(("mbr.candidates=3",), {"mbr_candidates": 3}),
    "prefix": Search(("prefix=true",), {"prefix": PREFIXES}),
    "constraints": Search(("constraints=PHRASES", "search.beam_size=2"),
                          {"constraints": PHRASES, "beam_size": 2}),
    "split": Search(("split=sentence", "split_lang=SPLIT_LANG"), {"split": "sentence"},
                    tuple(SPLIT)),
}


def with_vocab(data_dir: Path, path: Path) -> Path:
    """A random tiny model saved as nmt-train saves one trained on data_dir: its vocabulary
    entry, language pair or languages included (load_vocab)."""
    vocab = load_vocab(str(data_dir), read_manifest(data_dir))
    model = tiny_model(vocab.src_size, seed=1, stops=True)
    save_checkpoint({"model": model.state_dict(), "model_cfg": dataclasses.asdict(model.cfg),
                     "vocab": vocab.to_dict(), "update": 0, "epoch": 0}, path)
    return path


@pytest.fixture(scope="module")
def kinds(tiny_data_dir, nllb_dir, tmp_path_factory) -> dict[str, Kind]:  # noqa: F811
    """The five model kinds, built here."""
    out = tmp_path_factory.mktemp("kinds")
    raw = write_raw(out / "raw", n=60)
    preprocess(to_object(compose("preprocess", multi_overrides(raw, out / "multi")),
                         PreprocessConfig))
    marian = import_dir(build_marian(tmp_path_factory), out / "marian.pt")
    opus = import_dir(build_marian(tmp_path_factory, codes=("de", "fr")), out / "opus.pt")
    pair = {"src_lang": "en", "tgt_lang": "de"}
    return {
        "bilingual": Kind(with_vocab(tiny_data_dir, out / "bi.pt"), {}, (), "en", "de", "en"),
        "tag": Kind(with_vocab(out / "multi", out / "tag.pt"), {"tgt_lang": "de"},
                    ("src_lang=en",), "en", "de", "en"),
        "marian": Kind(marian, {}, tuple(f"{k}={v}" for k, v in pair.items()), "en", "de",
                       "en"),
        "opus-mt": Kind(opus, {"tgt_lang": "fr"}, ("src_lang=en",), "en", "fr", "en"),
        "nllb": Kind(import_dir(nllb_dir, out / "nllb.pt"),
                     {"src_lang": "eng_Latn", "tgt_lang": "deu_Latn"}, ("src_lang=eng_Latn",),
                     "eng_Latn", "deu_Latn", "en"),
    }


# ----------------------------------------------------------------------------- the cells
def refusal(error: str) -> str:
    """A one-line refusal's words."""
    assert "\n" not in error and "Traceback" not in error, error
    return f"refused: {error}"


def run_translate(kind: Kind, engine: str, name: str, tmp: Path) -> list[str] | str:
    """nmt-translate's outputs (or its one-line refusal) for one search."""
    search = SEARCH[name]
    inp, out, phrases = tmp / f"{engine}-{name}.in", tmp / f"{engine}-{name}.out", tmp / "p.txt"
    lines = [f"{t}\t{p}" for t, p in zip(search.texts, PREFIXES, strict=False)] \
        if name == "prefix" else list(search.texts)
    inp.write_text("".join(line + "\n" for line in lines), "utf-8")
    phrases.write_text("".join("\t".join(p) + "\n" for p in PHRASES), "utf-8")
    keys = [k.replace("PHRASES", str(phrases)).replace("SPLIT_LANG", kind.split_lang)
            for k in search.keys]
    try:
        cfg = to_object(compose("translate", [
            f"checkpoint={kind.checkpoint}", f"input={inp}", f"output={out}",
            f"engine={engine}", "quiet=true", "workers=1", *COMMON,
            *(f"{k}={v}" for k, v in kind.languages.items()), *keys]), TranslateConfig)
        translate(cfg)
    except NmtError as e:
        return refusal(str(e))
    return read_lines(str(out))


def run_api(srv: InProcess, kind: Kind, name: str) -> list[str] | str:
    """nmt's JSON API: the translations, or the refusal's words."""
    search = SEARCH[name]
    body = {"text": list(search.texts), "split": "none", **kind.languages, **search.fields}
    status, _, answer = srv.call("POST", "/translate", body)
    if status != 200:
        assert 400 <= status < 500 and set(answer) == {"error", "field"}, answer
        return refusal(answer["error"])
    return [t["text"] for t in answer["translations"]]


def run_libre_json(srv: InProcess, kind: Kind, name: str) -> list[str] | str:
    """LibreTranslate's JSON with a list q (alternatives=1 asks for a beam of 2)."""
    body = {"q": list(SEARCH[name].texts), "source": kind.source, "target": kind.target,
            "format": "text", **({"alternatives": 1} if name == "beam" else {})}
    status, _, answer = srv.call("POST", "/translate", body)
    if status != 200:
        assert 400 <= status < 500 and set(answer) == {"error"}, answer
        return refusal(answer["error"])
    return answer["translatedText"]


def run_libre_form(srv: InProcess, kind: Kind, name: str) -> list[str] | str:
    """libretranslatepy (forms), a text a request."""
    client = pytest.importorskip("libretranslatepy").LibreTranslateAPI(
        f"http://127.0.0.1:{srv.port}")
    try:
        return [client.translate(t, kind.source, kind.target) for t in SEARCH[name].texts]
    except HTTPError as e:
        assert 400 <= e.code < 500, e
        return refusal(json.loads(e.read())["error"])


def not_applicable(interface: str, name: str, srv: InProcess) -> str:
    """Why a cell is n/a ("": it applies)."""
    if interface.startswith("libre"):
        if name in ("sampling", "mbr", "prefix", "constraints"):
            return "n/a"
        if name == "beam" and interface == "libre-form":
            return "n/a"
        if name == "split" and srv.service.split != "sentence":
            return "n/a"
    return ""


def cell(engine: str, kind: Kind, interface: str, name: str, srv: InProcess,
         reference: list[str] | str) -> str:
    """One cell: "same", "n/a" or the refusal; an AssertionError where an interface gives
    other text than nmt-translate."""
    if interface == "nmt-translate":
        return "same" if isinstance(reference, list) else reference
    if why := not_applicable(interface, name, srv):
        return why
    run = {"api": run_api, "libre-json": run_libre_json, "libre-form": run_libre_form}
    got = run[interface](srv, kind, name)
    if isinstance(got, str):
        return got
    assert not isinstance(reference, str), (engine, interface, name, reference, got)
    assert got == reference, (engine, interface, name)
    return "same"


def pairwise(dimensions: tuple[tuple[str, ...], ...]) -> list[tuple[str, ...]]:
    """Cells that hold every pair of values of two dimensions (greedy: the cell that covers
    the most pairs not yet held, first in product order among equals)."""
    index = list(itertools.combinations(range(len(dimensions)), 2))
    todo = {(i, j, a, b) for i, j in index for a in dimensions[i] for b in dimensions[j]}
    chosen = []
    candidates = list(itertools.product(*dimensions))
    while todo:
        best = max(candidates, key=lambda c: sum((i, j, c[i], c[j]) in todo for i, j in index))
        chosen.append(best)
        todo -= {(i, j, best[i], best[j]) for i, j in index}
    return sorted(chosen, key=lambda c: tuple(d.index(v) for d, v in zip(dimensions, c,
                                                                          strict=True)))


def run_cells(kinds: dict[str, Kind], cells: list[tuple[str, ...]], tmp: Path,
              continuous: bool) -> dict:
    """Each cell's result, one server per (engine, model kind); continuous: engine=nmt's
    servers batch continuously (else dynamically, as CTranslate2's always do)."""
    results = {}
    for (engine, name), group in itertools.groupby(cells, key=lambda c: c[:2]):
        kind = kinds[name]
        srv = InProcess(kind.checkpoint, f"engine={engine}", "max_beam_size=4", *COMMON,
                        f"continuous={str(continuous and engine == 'nmt').lower()}",
                        *kind.serve)
        references: dict[str, list[str] | str] = {}
        try:
            for _, _, interface, search in group:
                if search not in references:
                    references[search] = run_translate(kind, engine, search, tmp)
                results[engine, name, interface, search] = cell(
                    engine, kind, interface, search, srv, references[search])
        finally:
            srv.stop()
    return results


# ----------------------------------------------------------------------------- the table
def table(results: dict) -> str:
    """The cells as markdown: a row per model kind and search, a column per engine and
    interface; refusals numbered, their words below."""
    words: list[str] = []
    head = [f"{e}: {i}" for e in ENGINES for i in INTERFACES]
    rows = ["| kind | search | " + " | ".join(head) + " |",
            "|---|---|" + "---|" * len(head)]
    for kind, search in itertools.product(KINDS, SEARCHES):
        out = []
        for engine, interface in itertools.product(ENGINES, INTERFACES):
            value = results[engine, kind, interface, search]
            if value.startswith("refused: "):
                text = value.removeprefix("refused: ")
                words += [text] * (text not in words)
                value = f"refused ({words.index(text) + 1})"
            out.append(value)
        rows.append(f"| {kind} | {search} | " + " | ".join(out) + " |")
    notes = [f"{n}. `{text}`" for n, text in enumerate(words, 1)]
    return "\n".join(rows + [""] + notes)


def documented() -> dict:
    """The cells docs/commands.md's table states."""
    block = DOC.read_text("utf-8").split(BEGIN)[1].split(END)[0].strip().splitlines()
    notes = {line.split(". ", 1)[0]: line.split(". ", 1)[1].strip("`")
             for line in block if line[:1].isdigit()}
    head = [c.strip() for c in block[0].strip("|").split("|")][2:]
    out = {}
    for line in block[2:]:
        if not line.startswith("|"):
            break
        kind, search, *values = (c.strip() for c in line.strip("|").split("|"))
        for column, value in zip(head, values, strict=True):
            engine, interface = column.split(": ")
            if value.startswith("refused ("):
                value = "refused: " + notes[value.removeprefix("refused (").rstrip(")")]
            out[engine, kind, interface, search] = value
    return out


def check_refusals_agree(results: dict) -> None:
    """A search refused in several interfaces of one engine and kind: in the same words."""
    for engine, kind, search in itertools.product(ENGINES, KINDS, SEARCHES):
        said = {v for (e, k, _, s), v in results.items()
                if (e, k, s) == (engine, kind, search) and v.startswith("refused")}
        assert len(said) <= 1, (engine, kind, search, said)


def test_every_pair_of_dimensions(kinds, tmp_path):
    """make test: all pairs, engine=nmt's servers batching continuously (the whole product
    runs both policies); each cell as docs/commands.md's table says."""
    cells = pairwise(DIMENSIONS)
    assert len(cells) < len(list(itertools.product(*DIMENSIONS))) // 4
    results = run_cells(kinds, cells, tmp_path, continuous=True)
    check_refusals_agree(results)
    doc = documented()
    assert {c: doc[c] for c in results} == results


@pytest.mark.slow
def test_every_cell(kinds, tmp_path):
    """The whole product, under both batching policies; the table in docs/commands.md is this
    test's (NMT_WRITE_MATRIX=1 writes it)."""
    if not (os.environ.get("NMT_MATRIX_FULL") or os.environ.get("NMT_WRITE_MATRIX")):
        pytest.skip("the whole product runs in make test-matrix (make test: all pairs)")
    cells = list(itertools.product(*DIMENSIONS))
    results = run_cells(kinds, cells, tmp_path, continuous=False)
    assert run_cells(kinds, [c for c in cells if c[0] == "nmt"], tmp_path,
                     continuous=True) == {c: v for c, v in results.items() if c[0] == "nmt"}
    check_refusals_agree(results)
    made = table(results)
    before, rest = DOC.read_text("utf-8").split(BEGIN)
    if os.environ.get("NMT_WRITE_MATRIX"):
        DOC.write_text(f"{before}{BEGIN}\n{made}\n{END}{rest.split(END)[1]}", "utf-8")
    else:
        assert rest.split(END)[0].strip() == made


def test_a_forced_models_request_names_the_language_its_texts_are_split_in(kinds, tmp_path):
    """An NLLB-style server told no source language splits by paragraph by default, yet a
    request's src_lang lets it split sentences, as nmt-translate does with src_lang alone."""
    kind = dataclasses.replace(kinds["nllb"], split_lang="eng_Latn")
    srv = InProcess(kind.checkpoint, *COMMON)
    try:
        assert srv.service.split == "paragraph"
        got = run_api(srv, kind, "split")
    finally:
        srv.stop()
    assert got == run_translate(kind, "nmt", "split", tmp_path)


@pytest.mark.slow
def test_a_many_model_server_gives_each_pair_nmt_translates_text(kinds, tmp_path):
    """nmt-serve models=DIR of a bilingual model (en-de), a tag model trained here (en-fr:
    its en-de is the bilingual one's) and an NLLB-style one: every interface gives
    nmt-translate's text for each pair, from the pair's model."""
    import shutil

    from test_serve_models import ModelsInProcess

    folder = tmp_path / "models"
    folder.mkdir()
    for name in ("bilingual", "tag", "nllb"):
        shutil.copy(kinds[name].checkpoint, folder / f"{name}.pt")
    cases = [kinds["bilingual"],  # each as nmt-translate is told its languages
             dataclasses.replace(kinds["tag"], languages={"tgt_lang": "fr"}, target="fr"),
             kinds["nllb"]]
    srv = ModelsInProcess(folder, *COMMON)
    try:
        for kind in cases:
            want = run_translate(kind, "nmt", "greedy", tmp_path)
            pair = {"src_lang": kind.source, "tgt_lang": kind.target}
            assert run_api(srv, dataclasses.replace(kind, languages=pair), "greedy") == want
            assert run_libre_json(srv, kind, "greedy") == want
            assert run_libre_form(srv, kind, "greedy") == want
    finally:
        srv.stop()
