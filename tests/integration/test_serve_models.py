"""nmt-serve models=DIR (issue 61, items 1 and 4): every model of a folder in one server
(nmt/serve/models.py, nmt/serve/many.py): discovery, routing (a pair's own model, a bilingual
one before a multilingual one, else through English), the memory budget, /health, /languages,
/translate_file, and LibreTranslate's clients against one many-model server."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
from functools import partial
from pathlib import Path
from urllib.parse import urlencode

import pytest
import torch
from translate_helpers import save_tiny_checkpoint

pytest.importorskip("fastapi")
from test_serve import CLI, InProcess, Server  # noqa: E402

from nmt.checkpoint import load_checkpoint, save_checkpoint  # noqa: E402
from nmt.commands.export import export  # noqa: E402
from nmt.commands.serve import open_service  # noqa: E402
from nmt.commands.translate import translate  # noqa: E402
from nmt.config import ExportConfig, ServeConfig, TranslateConfig, compose, to_object  # noqa: E402
from nmt.errors import (  # noqa: E402
    ApiError,  # noqa: E402
    ConfigError,
    NmtError,
)
from nmt.serve.many import create_models_app  # noqa: E402
from nmt.serve.models import (  # noqa: E402
    Registry,
    budget_line,
    discover,
    models_folder,
    routes,
)
from nmt.serve.schemas import TranslateRequest, TranslateResponse, Translation  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")
SEARCH = ("search.beam_size=1", "search.max_len_b=8")  # the server's and nmt-translate's
LINES = ["Open the file.", "Show hidden files!"]
ENGLISH = "Open the file in a new window."  # what the language identifier finds English
MULTI = ["en", "es", "it"]  # the NLLB-style model's languages


def checkpoint(proto: bytes, out: Path, seed: int, pair: tuple[str, str] | None = None,
               codes: list[str] | None = None) -> Path:
    """A tiny random checkpoint that records its pair, or (codes) a forced-token multilingual
    one (NLLB-style: the source and the target told by a language token each)."""
    save_tiny_checkpoint(out, proto, seed=seed)
    state = load_checkpoint(out)
    if pair:
        state["vocab"]["pair"] = {"src_lang": pair[0], "tgt_lang": pair[1]}
    if codes:
        state["vocab"]["languages"] = {"convention": "forced",
                                       "codes": {c: 10 + i for i, c in enumerate(codes)}}
    save_checkpoint(state, out)
    return out


@pytest.fixture(scope="module")
def models(tiny_data_dir, tmp_path_factory) -> Path:
    """en-de and de-en (recording their pair), en-fr (named after its pair only), fr-en as an
    nmt-export CTranslate2 folder, and an NLLB-style model of en, es and it; the checkpoint
    of fr-en lies outside the folder (sources/fr-en.pt)."""
    proto = (tiny_data_dir / "spm.model").read_bytes()
    root = tmp_path_factory.mktemp("models")
    folder, sources = root / "models", root / "sources"
    folder.mkdir()
    sources.mkdir()
    checkpoint(proto, folder / "en-de.pt", 1, ("en", "de"))
    checkpoint(proto, folder / "de-en.pt", 2, ("de", "en"))
    checkpoint(proto, folder / "en-fr.pt", 3)
    fr_en = checkpoint(proto, sources / "fr-en.pt", 4, ("fr", "en"))
    checkpoint(proto, folder / "multi.pt", 5, codes=MULTI)
    pytest.importorskip("ctranslate2")
    export(ExportConfig(checkpoint=str(fr_en), output=str(folder / "fr-en")))
    (folder / "notes.txt").write_text("not a model\n")
    return folder


def nmt_translate(model: Path, lines: list[str], tmp_path: Path, *overrides: str) -> list[str]:
    """nmt-translate's output of `lines` (greedy, as the servers here)."""
    src, out = tmp_path / "in.txt", tmp_path / "out.txt"
    src.write_text("".join(line + "\n" for line in lines), "utf-8")
    translate(to_object(compose("translate", [
        f"checkpoint={model}", f"input={src}", f"output={out}", "workers=1", "quiet=true",
        *SEARCH, *overrides]), TranslateConfig))
    return out.read_text("utf-8").splitlines()


# ----------------------------------------------------------------------------- discovery
def test_every_kind_of_model_is_found_and_each_pair_routed(models):
    entries = discover(models)
    assert [(e.path.name, e.kind) for e in entries] == [
        ("de-en.pt", "nmt"), ("en-de.pt", "nmt"), ("en-fr.pt", "nmt"),
        ("fr-en", "ctranslate2"), ("multi.pt", "nmt")]  # notes.txt is no model
    found = routes(entries, pivot=True)
    assert [h.entry.path.name for h in found["en", "es"].hops] == ["multi.pt"]
    assert [(h.entry.path.name, h.source, h.target) for h in found["de", "fr"].hops] == [
        ("de-en.pt", "de", "en"), ("en-fr.pt", "en", "fr")]
    assert found["de", "fr"].pivot == "en" and found["en", "de"].pivot == ""
    assert ("de", "es") in found and ("es", "de") in found  # through the multilingual model
    assert ("de", "fr") not in routes(entries, pivot=False)


def test_a_bilingual_model_wins_its_pair_over_a_multilingual_one(models, tiny_data_dir,
                                                                 tmp_path):
    for entry in (models / "en-de.pt", models / "multi.pt"):
        shutil.copy(entry, tmp_path / entry.name)
    checkpoint((tiny_data_dir / "spm.model").read_bytes(), tmp_path / "more.pt", 6,
               codes=["de", "en"])
    found = routes(discover(tmp_path), pivot=True)
    assert found["en", "de"].hops[0].entry.path.name == "en-de.pt"
    assert found["de", "en"].hops[0].entry.path.name == "more.pt"


def test_a_folder_without_a_model_two_models_of_one_pair_and_a_broken_one_are_one_line(
        models, tmp_path):
    with pytest.raises(NmtError, match=r"^models=.*: no model in it \(nmt checkpoints"):
        discover(tmp_path)
    with pytest.raises(NmtError, match=r"^models=.*nothing: not a folder$"):
        discover(tmp_path / "nothing")
    shutil.copy(models / "en-de.pt", tmp_path / "en-de.pt")
    shutil.copy(models / "en-de.pt", tmp_path / "other.pt")
    with pytest.raises(NmtError) as e:
        routes(discover(tmp_path), pivot=True)
    assert str(e.value) == (f"{tmp_path / 'en-de.pt'} and {tmp_path / 'other.pt'} both "
                            f"translate en into de: keep one of them in the folder")
    (tmp_path / "other.pt").write_bytes(b"garbage")
    with pytest.raises(NmtError, match=r"other.pt: not a readable nmt checkpoint"):
        discover(tmp_path)
    (tmp_path / "other.pt").unlink()
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "nmt.json").write_text("{")
    with pytest.raises(NmtError, match=r"x/nmt.json: not readable"):
        discover(tmp_path)


def test_a_one_to_many_model_that_records_no_source_takes_it_from_its_name(models, tmp_path):
    state = load_checkpoint(models / "en-fr.pt")
    state["vocab"]["languages"] = {"convention": "tag", "codes": {"de": 10, "fr": 11}}
    save_checkpoint(state, tmp_path / "opus-mt-en-mul.pt")
    assert discover(tmp_path)[0].pairs == [("en", "de"), ("en", "fr")]
    (tmp_path / "opus-mt-en-mul.pt").rename(tmp_path / "opus.pt")
    with pytest.raises(NmtError, match=r"opus.pt: a multilingual model that records no "
                                       r"source language; name it after it, e\.g\. en-mul\.pt$"):
        discover(tmp_path)


def test_a_checkpoint_without_a_pair_or_a_pair_name_is_refused(models, tmp_path):
    shutil.copy(models / "en-fr.pt", tmp_path / "model.pt")
    with pytest.raises(NmtError, match=r"model.pt: records no language pair; name it after "
                                       r"its pair, e\.g\. en-de\.pt$"):
        discover(tmp_path)


def test_the_budget_line_names_the_largest_model_and_refuses_a_smaller_budget(models):
    entries = discover(models)
    largest = max(entries, key=lambda e: e.size)
    cfg = serve_config(models, "max_models=2")
    assert budget_line(entries, cfg).startswith(f"5 models; the largest {largest.path} (")
    assert budget_line(entries, cfg).endswith("budget: max_models=2")
    with pytest.raises(NmtError, match=r"^memory_gb=1e-06: smaller than the largest model, "):
        budget_line(entries, serve_config(models, "memory_gb=0.000001"))


@pytest.mark.slow
def test_nmt_serve_refuses_a_folder_without_a_model_in_one_line(tmp_path):
    done = subprocess.run([CLI, f"models={tmp_path}", "port=0"], capture_output=True,
                          text=True, timeout=120)
    assert (done.returncode, done.stderr) == (1, f"nmt-serve: error: models={tmp_path}: no "
                                                 f"model in it (nmt checkpoints *.pt, nmt-export "
                                                 f"folders with nmt.json, Argos packages)\n")


def test_settings_of_one_model_are_refused_with_models_and_one_of_the_two_is_needed(models):
    for args, error in (([f"models={models}", "src_lang=en"],
                         "src_lang: applies to one model: not with models="),
                        ([], "checkpoint: give checkpoint=FILE (one model) or models=DIR "
                             "(every model in a folder), one of them")):
        with pytest.raises(ConfigError) as e:
            to_object(compose("serve", args), ServeConfig)
        assert str(e.value) == error


class StubService:
    """A loaded model's stand-in: translate waits until the test lets it answer."""

    def __init__(self, entry, events: list[str], gate):
        self.name, self.events, self.gate, self.broken = entry.path.name, events, gate, ""
        self.batcher = self.translator = self

    async def run(self) -> None:
        """The batcher's loop: nothing to do."""

    def close(self) -> None:
        self.events.append(f"closed {self.name}")

    async def translate(self, req):
        self.events.append(f"translating {self.name}")
        await self.gate.wait()
        return TranslateResponse(translations=[Translation(
            text=f"{self.name}: {req.text[0]}", score=0.0, truncated=False)])


def test_a_model_with_a_request_in_flight_is_not_evicted_the_next_load_waits_for_it(models):
    """max_models=1: a request for a second model waits until the first model's request is
    answered, then the first model is unloaded (its workers closed) and the second loaded;
    memory_gb counts sizes on disk."""
    entries = {e.path.name: e for e in discover(models)}
    events: list[str] = []

    async def scenario() -> list[str]:
        gate = asyncio.Event()
        registry = Registry(list(entries.values()), serve_config(models, "max_models=1"),
                            lambda entry: StubService(entry, events, gate))
        req = TranslateRequest(text=["x"])
        first = asyncio.create_task(registry.translate(req, "en", "de"))
        await asyncio.sleep(0.05)
        second = asyncio.create_task(registry.translate(req, "de", "en"))
        await asyncio.sleep(0.05)
        assert events == ["translating en-de.pt"] and list(registry.loaded) == [
            models / "en-de.pt"]  # the second waits: the first is busy
        gate.set()
        answers = await asyncio.gather(first, second)
        return [a.translations[0].text for a in answers]

    assert asyncio.run(scenario()) == ["en-de.pt: x", "de-en.pt: x"]
    assert events == ["translating en-de.pt", "closed en-de.pt", "translating de-en.pt"]


    async def starved() -> ApiError:
        gate = asyncio.Event()
        registry = Registry(list(entries.values()), serve_config(
            models, "max_models=1", "timeout_s=0.2"), lambda e: StubService(e, [], gate))
        first = asyncio.create_task(registry.translate(TranslateRequest(text=["x"]), "en",
                                                       "de"))
        await asyncio.sleep(0.05)
        with pytest.raises(ApiError) as e:
            await registry.translate(TranslateRequest(text=["x"]), "de", "en")
        gate.set()
        await first
        return e.value

    refused = asyncio.run(starved())  # the first model never idle within timeout_s
    assert (refused.status, refused.headers) == (503, {"Retry-After": "1"})
    assert str(refused).startswith("busy: the 1 models loaded (the budget's most) each have ")
    small, other, *_, large = sorted(entries.values(), key=lambda e: e.size)
    registry = Registry(list(entries.values()), serve_config(
        models, f"memory_gb={(small.size + other.size + 10) / 1e9}"), print)
    assert registry.fits(small, [other.path]) and not registry.fits(large, [other.path])


# ----------------------------------------------------------------------------- the server
def serve_config(models: Path, *overrides: str) -> ServeConfig:
    """nmt-serve's config of the folder, composed as the command line would."""
    return to_object(compose("serve", [f"models={models}", "workers=1", *SEARCH,
                                       *overrides]), ServeConfig)


class ModelsInProcess(InProcess):
    """A many-model server's app in this process (uvicorn in a thread, each nmt model decoding
    in one forked process); `call` and `translate` as test_serve's Server's."""

    def __init__(self, models: Path, *overrides: str):
        cfg = serve_config(models, *overrides)
        self.registry = Registry(discover(models), cfg, partial(
            open_service, cfg=cfg, device=torch.device("cpu"), workers=1))
        if cfg.preload:
            self.registry.preload()
        self.serve_app(create_models_app(self.registry, "cpu"))

    def stop(self) -> None:
        """Stop uvicorn and every loaded model's workers."""
        self.stop_app()
        self.registry.close()


@pytest.fixture(scope="module")
def many(models):
    srv = ModelsInProcess(models)
    yield srv
    srv.stop()


@pytest.mark.slow
def test_each_pair_gives_nmt_translates_text_and_de_fr_goes_through_english(many, models,
                                                                          tmp_path):
    fr_en = models.parent / "sources" / "fr-en.pt"
    want = {
        ("en", "de"): nmt_translate(models / "en-de.pt", LINES, tmp_path),
        ("de", "en"): nmt_translate(models / "de-en.pt", LINES, tmp_path),
        ("en", "fr"): nmt_translate(models / "en-fr.pt", LINES, tmp_path),
        ("fr", "en"): nmt_translate(fr_en, LINES, tmp_path, "engine=ctranslate2"),
        ("en", "es"): nmt_translate(models / "multi.pt", LINES, tmp_path, "src_lang=en",
                                    "tgt_lang=es"),
    }
    english = nmt_translate(models / "de-en.pt", LINES, tmp_path)
    want["de", "fr"] = nmt_translate(models / "en-fr.pt", english, tmp_path)
    for (src, tgt), lines in want.items():
        got = many.translate(LINES, src_lang=src, tgt_lang=tgt)
        assert [t["text"] for t in got] == lines, (src, tgt)
        status, body = form(many, "/translate", q=LINES[0], source=src, target=tgt)
        assert (status, body) == (200, {"translatedText": lines[0]}), (src, tgt)
    assert len(set(map(tuple, want.values()))) == len(want)  # each model its own text


@pytest.mark.slow
def test_each_nmt_model_decodes_in_a_process_of_its_own_even_with_one_worker(many):
    """A decoding thread would share the server's interpreter lock with the event loop and
    every other model's loop (issue 61: half the throughput of one server per pair)."""
    many.translate(LINES[:1], src_lang="en", tgt_lang="de")
    service = many.registry.loaded[many.registry.route("en", "de").hops[0].entry.path].service
    assert service.workers == 1 and service.stepper.processes
    assert many.translate(LINES[:1], src_lang="en", tgt_lang="de")[0]["text"]


def form(srv, path: str, **fields):
    """POST a urlencoded form, as libretranslatepy does: (status, decoded JSON)."""
    status, _, body = srv.call("POST", path, urlencode(fields).encode(),
                               {"Content-Type": "application/x-www-form-urlencoded"})
    return status, body


@pytest.mark.slow
def test_languages_health_and_settings_offer_every_pair_and_say_which_pivot(many):
    pytest.importorskip("py3langid")
    status, _, listing = many.call("GET", "/languages")
    targets = {entry["code"]: entry["targets"] for entry in listing}
    assert status == 200 and targets["de"] == ["en", "es", "fr", "it"]
    assert targets["es"] == ["de", "en", "fr", "it"] and targets["fr"] == ["de", "en", "es",
                                                                          "it"]
    status, _, health = many.call("GET", "/health")
    assert status == 200 and health["pivots"]["de-fr"] == "en"
    assert "en-de" not in health["pivots"] and "en-es" not in health["pivots"]
    assert {m["path"].rsplit("/", 1)[1]: m["kind"] for m in health["models"]} == {
        "de-en.pt": "nmt", "en-de.pt": "nmt", "en-fr.pt": "nmt", "fr-en": "ctranslate2",
        "multi.pt": "nmt"}
    assert health["features"]["sources"] == ["de", "en", "es", "fr", "it"]
    assert health["features"]["convention"] == "forced"  # the page: a source and a target
    assert 'id="route"' in many.call("GET", "/")[2]  # where the page says a pair pivots
    settings = many.call("GET", "/frontend/settings")[2]
    assert settings["pivots"] == health["pivots"] and settings["filesTranslation"]
    assert [(m["name"], m["loaded"]) for m in settings["models"]] == [
        (m["path"].rsplit("/", 1)[1], m["loaded"]) for m in health["models"]]
    status, body = form(many, "/translate", q=ENGLISH, source="auto", target="de")
    assert status == 200 and body["detectedLanguage"]["language"] == "en"
    assert body["translatedText"] == many.translate([ENGLISH], src_lang="en",
                                                    tgt_lang="de")[0]["text"]
    status, _, body = many.call("POST", "/translate", {"text": ["x"], "tgt_lang": "de"})
    assert (status, body["field"]) == (422, "src_lang")
    status, body = form(many, "/translate", q="x", source="de", target="xx")
    assert status == 400 and body["error"].startswith("de into xx is not supported (this "
                                                      "server translates from de: into en, es")


@pytest.mark.slow
def test_max_models_keeps_at_most_that_many_loaded(models):
    srv = ModelsInProcess(models, "max_models=2")
    try:
        for src, tgt in (("en", "de"), ("de", "en"), ("en", "es"), ("de", "fr"), ("en", "de")):
            srv.translate(LINES[:1], src_lang=src, tgt_lang=tgt)
            health = srv.call("GET", "/health")[2]
            assert health["loaded"] <= 2 and len(srv.registry.loaded) <= 2
        assert health["loads"] == 5  # en-de, de-en, multi (en-de out), en-fr (multi out:
        # de-en was just used), en-de (de-en out)
        assert [m["path"].rsplit("/", 1)[1] for m in health["models"] if m["loaded"]] == [
            "en-de.pt", "en-fr.pt"]
        stats = srv.call("GET", "/stats")[2]  # since each loaded: en-fr's one, en-de's one
        assert {Path(p).name: s["requests"] for p, s in stats.items()} == {"en-fr.pt": 1,
                                                                          "en-de.pt": 1}
    finally:
        srv.stop()


@pytest.mark.slow
def test_a_ctranslate2_model_beside_nmt_ones_beam_searches_without_a_length_penalty(models,
                                                                                    tmp_path):
    """The server's search.alpha applies to the nmt models; a CTranslate2 one (it has no GNMT
    length penalty in beam search) decodes with alpha=0 rather than refusing every request."""
    srv = ModelsInProcess(models, "search.beam_size=2", "search.alpha=1.0")
    try:
        for model, src, tgt, keys in (
                (models / "en-de.pt", "en", "de", ()),
                (models.parent / "sources" / "fr-en.pt", "fr", "en",
                 ("engine=ctranslate2", "search.alpha=0"))):
            want = nmt_translate(model, LINES, tmp_path, "search.beam_size=2",
                                 "search.alpha=1.0", *keys)
            assert [t["text"] for t in srv.translate(LINES, src_lang=src, tgt_lang=tgt)] == want
    finally:
        srv.stop()


@pytest.mark.slow
def test_a_model_that_fails_to_load_fails_its_requests_not_the_server(models, tmp_path):
    for name in ("en-de.pt", "de-en.pt"):
        shutil.copy(models / name, tmp_path / name)
    srv = ModelsInProcess(tmp_path)
    try:
        (tmp_path / "de-en.pt").unlink()  # gone after the server started
        status, _, body = srv.call("POST", "/translate", {"text": ["x"], "src_lang": "de",
                                                          "tgt_lang": "en"})
        assert (status, body["error"]) == (500, f"cannot load {tmp_path / 'de-en.pt'}: "
                                                f"{tmp_path / 'de-en.pt'}: checkpoint not found")
        status, body = form(srv, "/translate", q="x", source="de", target="en")
        assert status == 500 and body["error"].startswith("Cannot translate text: cannot load")
        assert srv.translate(LINES, src_lang="en", tgt_lang="de")
        assert srv.call("GET", "/health")[0] == 200  # the others still translate
    finally:
        srv.stop()


@pytest.mark.slow
def test_translate_file_round_trips_a_txt_and_an_html_file(many):
    requests = pytest.importorskip("requests")
    url = f"http://127.0.0.1:{many.port}"
    text = "Open the file.\n\nShow hidden files!\n"
    page = "<p>Open the <b>file</b>.</p>\n"
    want_text = many.call("POST", "/translate", {"q": text, "source": "en", "target": "de"})
    want_page = many.call("POST", "/translate", {"q": page, "source": "en", "target": "de",
                                                 "format": "html"})
    for name, content, want in (("a.txt", text, want_text), ("b.html", page, want_page)):
        answer = requests.post(f"{url}/translate_file", timeout=60, files={
            "file": (name, content.encode())}, data={"source": "en", "target": "de"})
        assert answer.status_code == 200, answer.text
        link = answer.json()["translatedFileUrl"]
        assert link.startswith(f"{url}/download_file/") and link.endswith(f".de{name[1:]}")
        got = requests.get(link, timeout=60)
        assert got.status_code == 200 and got.content.decode() == want[2]["translatedText"]
    refused = requests.post(f"{url}/translate_file", timeout=60, files={
        "file": ("c.docx", b"PK\x03\x04")}, data={"source": "en", "target": "de"})
    assert (refused.status_code, refused.json()) == (400, {
        "error": "Invalid request: .docx is not supported (only .txt, .html, .htm: office "
                 "formats are not translated)"})
    assert requests.get(f"{url}/download_file/nothing.txt", timeout=60).status_code == 404


# ----------------------------------------------------------------------------- real clients
KEY = "k3y-Many-7q"
CLIENT_PAIRS = (("en", "de"), ("de", "fr"))  # a direct pair and one through English
TRANSLATE_PACKAGE = """
import json, sys
from translate import Translator

url, key, text = sys.argv[1:4]
out = {}
for pair in sys.argv[4:]:
    src, tgt = pair.split("-")
    try:
        out[pair] = Translator(tgt, src, provider="libre", base_url=url,
                               secret_access_key=key or None).translate(text)
    except Exception as e:
        out[pair] = f"{type(e).__name__}: {e}"
print(json.dumps(out))
"""
NPM_CLIENT = """
const { translate } = require("libretranslate");
const [apiurl, apiKey, query, ...pairs] = process.argv.slice(1);
(async () => {
  const out = {};
  for (const pair of pairs) {
    const [source, target] = pair.split("-");
    try {
      out[pair] = (await translate({ query, source, target, apiurl, apiKey })) ?? null;
    } catch (e) {
      out[pair] = `${e.name}: ${e.message}`;
    }
  }
  console.log(JSON.stringify(out));
})();
"""


@pytest.fixture(scope="module")
def servers(models, tmp_path_factory):
    """Two nmt-serve processes of the folder: one open to all, one that needs KEY."""
    keys = tmp_path_factory.mktemp("keys") / "keys.txt"
    keys.write_text(f"{KEY}\n")
    started = [ManyServer(models), ManyServer(models, f"api_keys={keys}")]
    yield started
    assert [srv.stop() for srv in started] == [0, 0]


class ManyServer(Server):
    """A real nmt-serve models=DIR process on a free loopback port."""

    def __init__(self, models: Path, *overrides: str):
        self.start([CLI, f"models={models}", "port=0", "access_log=false", "workers=1",
                    *SEARCH, *overrides])


def wanted(srv: Server, text: str) -> dict[str, str]:
    """The server's own answer for each client pair, as "src-tgt" -> text."""
    return {f"{s}-{t}": srv.translate([text], src_lang=s, tgt_lang=t)[0]["text"]
            for s, t in CLIENT_PAIRS}


@pytest.mark.slow
def test_libretranslatepy_and_deep_translator_against_many_models(servers):
    client_module = pytest.importorskip("libretranslatepy")
    deep = pytest.importorskip("deep_translator")
    open_, keyed = servers
    want = wanted(open_, LINES[0])
    for srv, key in ((open_, None), (keyed, KEY)):
        url = f"http://127.0.0.1:{srv.port}"
        client = client_module.LibreTranslateAPI(url, key)
        assert {c["code"] for c in client.languages()} == {"de", "en", "es", "fr", "it"}
        for pair in want:
            src, tgt = pair.split("-")
            assert client.translate(LINES[0], src, tgt) == want[pair]
            assert deep.LibreTranslator(source=src, target=tgt, api_key=key or "any",
                                        custom_url=url + "/").translate(LINES[0]) == want[pair]
    with pytest.raises(deep.exceptions.AuthorizationException):
        deep.LibreTranslator(source="en", target="de", api_key="wrong",
                             custom_url=f"http://127.0.0.1:{keyed.port}/").translate(LINES[0])


@pytest.mark.slow
def test_the_translate_package_and_the_npm_client_against_many_models(servers):
    from test_libretranslate import installed

    open_, keyed = servers
    want = wanted(open_, LINES[0])
    pairs = list(want)
    home = installed("translate", [sys.executable, "-m", "pip", "install", "-q", "--retries",
                                   "1", "--timeout", "20", "translate", "--target"])
    for srv, key in ((open_, ""), (keyed, KEY)):
        out = subprocess.run([sys.executable, "-c", TRANSLATE_PACKAGE,
                              f"http://127.0.0.1:{srv.port}", key, LINES[0], *pairs],
                             check=True, capture_output=True, text=True, timeout=120,
                             env={**os.environ, "PYTHONPATH": str(home)}).stdout
        assert json.loads(out) == want
    if shutil.which("npm") is None or shutil.which("node") is None:
        pytest.skip("needs node and npm")
    home = installed("npm", ["npm", "install", "--no-audit", "--no-fund", "--fetch-retries=1",
                             "libretranslate", "--prefix"])
    for srv, key in ((open_, ""), (keyed, KEY)):
        out = subprocess.run(["node", "-e", NPM_CLIENT, f"http://127.0.0.1:{srv.port}", key,
                              LINES[0], *pairs], check=True, capture_output=True, text=True,
                             timeout=120, cwd=home).stdout
        assert json.loads(out) == want


# ----------------------------------------------------------------------------- Argos packages
@pytest.mark.slow
def test_argos_packages_are_served_as_they_are_and_pivot_too(models, tmp_path, monkeypatch,
                                                             capsys):
    """A folder of Argos packages as argostranslate installs them (one unpacked, one a
    .argosmodel zip, one BPE package, skipped in one line) beside an nmt checkpoint: each
    package gives its model's text (nmt-translate engine=ctranslate2 of the checkpoint it was
    exported from), and de->es goes through English (de-en.pt, then the package)."""
    pytest.importorskip("nmt.wings.interop.argos")
    from test_argos import make_package, zipped

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # zips unpack here
    folder, made = tmp_path / "argos", tmp_path / "made"
    folder.mkdir()
    made.mkdir()
    fr_en, export = models.parent / "sources" / "fr-en.pt", models / "fr-en"
    spm = (export / "source.spm").read_bytes()
    make_package(folder, export, spm, "en", "es")  # the fr-en model, told it is en->es
    zipped(make_package(made, export, spm, "es", "en"), folder / "translate-es_en.argosmodel")
    make_package(folder, export, spm, "en", "pt", bpe=True)
    shutil.copy(models / "de-en.pt", folder / "de-en.pt")
    entries = discover(folder)
    assert [(e.path.name, e.kind) for e in entries] == [
        ("de-en.pt", "nmt"), ("translate-en_es-1_0", "argos"),
        ("translate-es_en.argosmodel", "argos")]
    assert "skipped: " in capsys.readouterr().err  # the BPE package, in one line
    want = nmt_translate(fr_en, LINES, tmp_path, "engine=ctranslate2")
    english = nmt_translate(models / "de-en.pt", LINES, tmp_path)
    srv = ModelsInProcess(folder)
    try:
        for src, tgt in (("en", "es"), ("es", "en")):
            assert [t["text"] for t in srv.translate(LINES, src_lang=src, tgt_lang=tgt)] == want
        got = srv.translate(LINES, src_lang="de", tgt_lang="es")
        assert [t["text"] for t in got] == nmt_translate(fr_en, english, tmp_path,
                                                         "engine=ctranslate2")
        assert srv.call("GET", "/health")[2]["pivots"] == {"de-es": "en"}
    finally:
        srv.stop()


def test_models_argos_is_argostranslates_own_package_folder(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    assert models_folder("argos") == tmp_path / "argos-translate" / "packages"
    monkeypatch.delenv("XDG_DATA_HOME")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert models_folder("argos") == tmp_path / ".local/share/argos-translate/packages"
    assert models_folder("some/dir") == Path("some/dir")
