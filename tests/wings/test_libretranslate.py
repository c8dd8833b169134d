"""nmt-serve's LibreTranslate API (nmt/wings/libretranslate/api.py): the HTML pieces, the requests
told apart from nmt's own on POST /translate, LibreTranslate's answers and errors; then the
real libretranslatepy client and curl against an nmt-serve process on the loopback."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import html
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace
from urllib.error import HTTPError
from urllib.parse import urlencode

import pytest
from translate_helpers import save_tiny_checkpoint

pytest.importorskip("fastapi")
from test_serve import InProcess, Server  # noqa: E402

from nmt.data.vocab import FORCED, TAG, Languages  # noqa: E402
from nmt.errors import NmtError  # noqa: E402
from nmt.wings.libretranslate import api as libretranslate  # noqa: E402
from nmt.wings.libretranslate import requests as libre_requests  # noqa: E402
from nmt.wings.libretranslate.api import translate_html, translate_plain  # noqa: E402
from nmt.wings.libretranslate.api_keys import ApiKeys  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")
FORM = {"Content-Type": "application/x-www-form-urlencoded"}
TEXT = "Open the file. Show hidden files!\n\nClose the window."


@pytest.fixture(scope="module")
def ckpt(tiny_data_dir, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("run") / "checkpoint.pt"
    return save_tiny_checkpoint(path, (tiny_data_dir / "spm.model").read_bytes(), seed=0)


@pytest.fixture(scope="module")
def libre(ckpt):
    """An in-process server that knows its languages (LibreTranslate's API needs them)."""
    srv = InProcess(ckpt, "src_lang=en", "tgt_lang=de", "max_chars=300")
    yield srv
    srv.stop()


def form(srv, path: str, **fields):
    """POST a urlencoded form, as libretranslatepy does: (status, decoded JSON)."""
    status, _, body = srv.call("POST", path, urlencode(fields).encode(), FORM)
    return status, body


def test_html_is_nmts_markup_html_and_text_that_shows_as_spaces_stays(libre):
    status, body = form(libre, "/translate", q="<td>&nbsp;</td><td>Open the file.</td>",
                        source="en", target="de", format="html")
    want = libre.translate(["Open the file."])[0]["text"]
    assert (status, body) == (200, {"translatedText": f"<td>&nbsp;</td><td>{want}</td>"})


def test_a_text_of_markup_alone_comes_back_as_it_is(libre):
    """Tags and entities with no sentence between them decode nothing (no request waits for
    its timeout), in LibreTranslate's format=html and in nmt's own API."""
    for q in ("<br>", "<b></b>", "&nbsp;", "<td>&nbsp;</td>"):
        assert form(libre, "/translate", q=q, source="en", target="de",
                    format="html") == (200, {"translatedText": q})
    (got,) = libre.translate(["<br>"], markup="html")
    assert got["text"] == "<br>"


def test_html_and_blank_texts_keep_their_markup_and_spaces():
    asked = []

    async def translate(texts, **search):  # nmt's API: each text upper-cased and marked
        asked.append((texts, search))
        return SimpleNamespace(translations=[
            SimpleNamespace(text=f"<{t.upper()}>", nbest=[SimpleNamespace(text=t)] * 3)
            for t in texts])

    html = '<p>open  the\n file &amp; <a href="x">go</a></p><br>'
    out = asyncio.run(translate_html([html, "  "], translate))
    assert asked == [([html], {"markup": "html"})]  # nmt's API puts the tags back
    assert out == [f"<{html.upper()}>", "  "]
    out = asyncio.run(translate_plain(["open it", " "], translate, 2, 4))
    assert out == [("<OPEN IT>", ["open it"] * 2), (" ", [])]
    assert asked[-1] == (["open it"], {"nbest": 3, "beam_size": 4})


def test_nmts_own_json_is_told_apart_without_parsing_it(monkeypatch):
    parsed = []
    monkeypatch.setattr(libre_requests.json, "loads", lambda body: parsed.append(body) or {})
    assert not libre_requests.is_libre_json(b'{"text": ["Open it."], "beam_size": 2}')
    assert not parsed


def test_post_translate_is_told_apart_by_what_the_request_is(libre):
    own = libre.translate([TEXT])[0]["text"]  # nmt's API: JSON with "text"
    assert form(libre, "/translate", q=TEXT, source="en", target="de") == (
        200, {"translatedText": own})
    status, _, body = libre.call("POST", "/translate", {"q": [TEXT, "Quit."], "source": "en",
                                                        "target": "de", "format": "text"})
    assert (status, body) == (200, {"translatedText": [own, libre.translate(["Quit."])[0][
        "text"]]})
    status, _, body = libre.call("POST", "/libretranslate/translate",
                                 {"q": TEXT, "source": "en", "target": "de"})
    assert (status, body) == (200, {"translatedText": own})  # the prefix answers too
    status, _, body = libre.call("POST", "/translate",
                                 b'{"q": "open \\ud800", "source": "en", "target": "de"}')
    assert (status, body) == (400, {"error": "Invalid request: q is not valid Unicode (lone "
                                             "surrogate at character 5)"})
    status, _, body = libre.call("POST", "/translate", {"text": ["x"], "beam": 2})
    assert status == 422 and body["field"] == "beam"  # nmt's own, as before


def test_languages_and_html(libre):
    for path in ("/languages", "/libretranslate/languages"):
        status, _, body = libre.call("GET", path)
        assert (status, body) == (200, [{"code": "en", "name": "English", "targets": ["de"]},
                                        {"code": "de", "name": "German", "targets": []}])
    q = '<p>Open the <b class="x">file</b>.</p>'
    status, body = form(libre, "/translate", q=q, source="en", target="de", format="html")
    (want,) = libre.translate([q], markup="html")  # nmt's own API, markup=html
    assert (status, body) == (200, {"translatedText": want["text"]})
    assert want["text"].count('<b class="x">') == want["text"].count("</b>") == 1


def test_alternatives_are_the_rest_of_the_n_best_list(libre):
    status, body = form(libre, "/translate", q="Open the file.", source="en", target="de",
                        alternatives="2")
    want = libre.translate(["Open the file."], nbest=3)[0]
    assert (status, body) == (200, {"translatedText": want["text"], "alternatives": [
        h["text"] for h in want["nbest"][1:]]})
    status, _, body = libre.call("POST", "/translate", {"q": [TEXT], "source": "en",
                                                        "target": "de", "alternatives": 2})
    whole = libre.translate([TEXT], nbest=3, split="none")[0]  # split=auto: kept whole
    assert status == 200 and body == {"translatedText": [whole["text"]], "alternatives": [
        [h["text"] for h in whole["nbest"][1:]]]}


@pytest.mark.parametrize(("fields", "status", "error"), [
    ({"source": "en", "target": "de"}, 400, "Invalid request: missing q parameter"),
    ({"q": "Open it.", "target": "de"}, 400, "Invalid request: missing source parameter"),
    ({"q": "Open it.", "source": "fr", "target": "de"}, 400,
     "fr is not supported (this server translates from en into de)"),
    ({"q": "Open it.", "source": "en", "target": "es"}, 400,
     "es is not supported (this server translates from en into de)"),
    ({"q": "Open it.", "source": "en", "target": "de", "format": "pdf"}, 400,
     "pdf format is not supported"),
    ({"q": "Open it.", "source": "en", "target": "de", "alternatives": "-1"}, 400,
     "Invalid request: alternatives must be a whole number >= 0"),
    ({"q": "Open it.", "source": "en", "target": "de", "alternatives": "20"}, 400,
     "Invalid request: beam_size: must be <= 16 (this server's limit), got 21"),
    ({"q": "Open it. " * 40, "source": "en", "target": "de"}, 400,
     "Invalid request: q: 360 characters; this server takes at most 300 per request"),
])
def test_errors_are_libretranslates(libre, fields, status, error):
    assert form(libre, "/translate", **fields) == (status, {"error": error})


def test_a_form_within_max_chars_is_not_refused_for_its_bytes(ckpt):
    srv = InProcess(ckpt, "src_lang=en", "tgt_lang=de", "max_chars=3000", "max_sentences=1")
    try:
        wide = "\u3000" * 2999 + "x"  # ideographic spaces: 9 bytes each in a form
        assert form(srv, "/translate", q=wide, source="en", target="de") == (
            200, {"translatedText": "\u3000" * 2999 + srv.translate(["x"])[0]["text"]})
        status, body = form(srv, "/translate", q="\u3000" * 5000, source="en", target="de")
        assert (status, body) == (400, {"error": "Invalid request: body: larger than 40196 "
                                                 "bytes"})
    finally:
        srv.stop()


@pytest.mark.slow  # py3langid's model loads in ~0.8 s
def test_source_auto_detects_among_the_servers_languages(libre, monkeypatch):
    pytest.importorskip("py3langid")
    status, body = form(libre, "/translate", q="Open the file in a new window.",
                        source="auto", target="de")
    assert status == 200 and body["detectedLanguage"]["language"] == "en"
    status, body = form(libre, "/detect", q="Öffnen Sie die Datei in einem neuen Fenster.")
    assert status == 200 and [d["language"] for d in body] == ["de", "en"]
    assert form(libre, "/translate", q="Öffnen Sie die Datei in einem neuen Fenster.",
                source="auto", target="de")[1]["error"].startswith("de is not supported")
    libretranslate.identifier.cache_clear()
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "py3langid" else real(name, *a))
    status, body = form(libre, "/translate", q="Open it.", source="auto", target="de")
    assert status == 400 and body["error"].startswith("source=auto needs a language identifier")
    libretranslate.identifier.cache_clear()


def test_sources_and_targets_follow_the_models_convention():
    """Forced-token models (NLLB) translate any of their languages into any other and are told
    the source; a tag model's codes are targets only, from the server's src_lang (a one-to-many
    OPUS-MT model: en -> es, fr, it) or the sources its checkpoint records; a bilingual model
    offers its one pair."""
    nllb = libretranslate.Languages.of(
        Languages(FORCED, {"eng_Latn": 5, "deu_Latn": 6}), "", "")
    assert nllb.fields("eng_Latn", "deu_Latn") == {"tgt_lang": "deu_Latn",
                                                   "src_lang": "eng_Latn"}
    assert nllb.listing()[0] == {"code": "deu_Latn", "name": "deu_Latn",
                                 "targets": ["eng_Latn"]}
    opus = libretranslate.Languages.of(
        Languages(TAG, {"es": 5, "fr": 6, "it": 7}), "en", "")
    assert opus.fields("en", "fr") == {"tgt_lang": "fr"}
    for source, target in (("es", "fr"), ("en", "en")):
        with pytest.raises(libretranslate.LibreError, match=rf"^{source} is not supported "
                                                            r"\(this server translates from en"):
            opus.fields(source, target)
    assert opus.listing() == [
        {"code": "en", "name": "English", "targets": ["es", "fr", "it"]},
        {"code": "es", "name": "Spanish", "targets": []},
        {"code": "fr", "name": "French", "targets": []},
        {"code": "it", "name": "Italian", "targets": []}]
    trained = libretranslate.Languages.of(
        Languages(TAG, {"de": 4, "en": 5, "fr": 6}, ("de", "en")), "", "")
    assert trained.sources == ("de", "en") and trained.targets == ("de", "en", "fr")
    pair = libretranslate.Languages.of(None, "en", "de")
    assert pair.fields("en", "de") == {} and pair.listing()[1]["targets"] == []
    nllb.require()
    with pytest.raises(libretranslate.LibreError, match="languages are not known") as e:
        libretranslate.Languages.of(None, "en", "").require()
    assert e.value.status == 400


def test_without_languages_the_api_answers_400_in_its_shape(ckpt):
    """A checkpoint that records no pair (an older one) and a server not told its languages:
    LibreTranslate's endpoints answer 400 {"error": ...}, never 500."""
    srv = InProcess(ckpt)
    try:
        for method, path, body in (("GET", "/languages", None),
                                   ("POST", "/detect", {"q": "Open the file."}),
                                   ("POST", "/translate", {"q": "x", "source": "en",
                                                           "target": "de"})):
            status, _, answer = srv.call(method, path, body)
            assert status == 400 and "src_lang=... tgt_lang=..." in answer["error"], path
    finally:
        srv.stop()


def test_a_checkpoint_that_records_its_pair_serves_libretranslate_untold(ckpt, tmp_path):
    """nmt-train records the data's pair: a plain nmt-serve answers /languages and
    /translate with it, and splits sentences (split=auto is sentence)."""
    from nmt.training.checkpoint import load_checkpoint, save_checkpoint

    state = load_checkpoint(ckpt)
    state["vocab"]["pair"] = {"src_lang": "en", "tgt_lang": "de"}
    save_checkpoint(state, tmp_path / "paired.pt")
    srv = InProcess(tmp_path / "paired.pt")
    try:
        status, _, body = srv.call("GET", "/languages")
        assert status == 200 and body == [
            {"code": "en", "name": "English", "targets": ["de"]},
            {"code": "de", "name": "German", "targets": []}]
        status, body = form(srv, "/translate", q="Open the file.", source="en", target="de")
        assert (status, body) == (200, {"translatedText": srv.translate(["Open the file."])[0][
            "text"]})
        assert srv.call("GET", "/health")[2]["split"] == "sentence"
    finally:
        srv.stop()


def test_html_markup_comes_back_as_written(libre):
    one, two = (t["text"] for t in libre.translate(["line1", "line2"]))
    for q, want in (("<pre>  line1\n  line2</pre>", f"<pre>  {one}\n  {two}</pre>"),
                    ("<p>line1</p", f"<p>{one}</p")):
        assert form(libre, "/translate", q=q, source="en", target="de", format="html") == (
            200, {"translatedText": want})
    (compare,) = libre.translate(["a < b and c > d"])
    status, body = form(libre, "/translate", q="a < b and c > d", source="en",
                        target="de", format="html")
    assert status == 200 and body["translatedText"] == html.escape(compare["text"], quote=False)


@pytest.mark.parametrize("fields, error", [
    ({"target": "d\udc80"}, "d\udc80 is not supported"),
    ({"format": "\ud800"}, "\ud800 format is not supported"),
    ({"alternatives": "\u00b2"}, "Invalid request: alternatives must be a whole number >= 0"),
    ({"glossary": {"it": "es\ud800"}}, "Invalid request: glossary target term 'es\\ud800' is "
                                       "not valid Unicode"),
    ({"glossary": "open\ud800\toffen"}, "Invalid request: glossary source term "),
    ({"keep": "Open\n\udc80"}, "Invalid request: keep is not valid Unicode"),
])
def test_lone_surrogates_and_other_digits_are_400s_not_500s(libre, fields, error):
    body = {"q": "Open it.", "source": "en", "target": "de", **fields}
    status, _, answer = libre.call("POST", "/translate", body)
    assert status == 400 and answer["error"].startswith(error)


def test_a_lone_surrogate_in_an_attribute_comes_back_escaped(libre):
    (want,) = libre.translate(["Open"])
    q = '<a title="\udc80">Open</a>'
    status, _, answer = libre.call("POST", "/translate", {"q": q, "source": "en", "target": "de",
                                                         "format": "html"})
    assert (status, answer) == (200, {"translatedText": f'<a title="\udc80">{want["text"]}</a>'})


def test_a_too_large_json_request_with_q_is_answered_in_libretranslates_shape(libre):
    limit = 12 * 300 + 100 * 2048 + 4096  # max_chars=300, max_sentences 2048 (the default)
    big = "x" * (limit + 10)
    status, _, answer = libre.call("POST", "/translate", {"q": big, "source": "en",
                                                         "target": "de"})
    assert (status, answer) == (400, {"error": f"Invalid request: body: larger than {limit} "
                                               f"bytes"})
    status, _, answer = libre.call("POST", "/translate", {"text": [big]})
    assert status == 413 and answer["field"] == "body"  # nmt's own shape


def test_detection_maps_every_code_style_to_the_identifiers():
    from nmt.wings.libretranslate.langid_codes import label

    known = {"en", "de", "zh", "gcf", "wa"}
    assert [label(c, known) for c in ("eng_Latn", "deu_Latn", "zho_Hant", "pt_br", "gcf_Latn",
                                      "xyz_Latn", "de")] == ["en", "de", "zh", None, "gcf",
                                                             None, "de"]


@pytest.mark.slow  # py3langid's model loads in ~0.8 s
def test_nllb_codes_are_detected_among_the_models_own_languages():
    pytest.importorskip("py3langid")
    codes = ("eng_Latn", "deu_Latn", "fra_Latn", "gcf_Latn", "zho_Hans")
    ranked = libretranslate.detect("Öffnen Sie die Datei in einem neuen Fenster.", codes)
    assert ranked[0]["language"] == "deu_Latn"
    assert {r["language"] for r in ranked} == set(codes)  # every code, as the model writes it
    assert libretranslate.detect("Open the file in a new window.", codes)[0]["language"] == \
        "eng_Latn"


@pytest.mark.slow
def test_a_list_q_gets_one_detected_language_per_text(libre):
    pytest.importorskip("py3langid")
    texts = ["Open the file in a new window.", "Close every window and save the files."]
    status, _, body = libre.call("POST", "/translate", {"q": texts, "source": "auto",
                                                        "target": "de"})
    assert status == 200 and [d["language"] for d in body["detectedLanguage"]] == ["en", "en"]
    assert body["translatedText"] == [t["text"] for t in libre.translate(texts)]


def test_api_keys_are_checked_and_reread_when_their_file_changes(ckpt, tmp_path):
    """api_keys=FILE: LibreTranslate's api_key and nmt's bearer header, 403 in each API's shape
    without a valid one; /frontend/settings says keyRequired; a new file takes effect at once;
    without the setting every request is let in."""
    keys = tmp_path / "keys.txt"
    keys.write_text("# keys\nalpha\n\n")
    srv = InProcess(ckpt, "src_lang=en", "tgt_lang=de", f"api_keys={keys}")
    try:
        fields = {"q": "Open it.", "source": "en", "target": "de"}
        assert form(srv, "/translate", **fields) == (403, {"error": "Invalid API key"})
        assert form(srv, "/translate", **fields, api_key="beta")[0] == 403
        status, body = form(srv, "/translate", **fields, api_key="alpha")
        assert status == 200
        status, _, answer = srv.call("POST", "/translate", {"text": ["Open it."]})
        assert status == 403 and "Bearer" in answer["error"]
        status, _, answer = srv.call("POST", "/translate", {"text": ["Open it."]},
                                     {"Authorization": "Bearer alpha"})
        assert status == 200 and answer["translations"][0]["text"] == body["translatedText"]
        assert srv.call("GET", "/frontend/settings")[2]["keyRequired"] is True
        assert srv.call("GET", "/health")[2]["features"]["key_required"] is True  # the page's
        status, _, answer = srv.call("POST", "/translate", {**fields, "api_key": "\ud800"})
        assert (status, answer) == (403, {"error": "Invalid API key"})  # not a 500
        new = tmp_path / "new.txt"
        new.write_text("beta\n")
        new.replace(keys)  # revoked and added without a restart
        assert form(srv, "/translate", **fields, api_key="alpha")[0] == 403
        assert form(srv, "/translate", **fields, api_key="beta")[0] == 200
    finally:
        srv.stop()


def test_without_api_keys_every_request_is_let_in(libre):
    settings = libre.call("GET", "/frontend/settings")[2]
    assert settings["keyRequired"] is False and settings["charLimit"] == 300
    assert settings["language"] == {"source": {"code": "en", "name": "English"},
                                    "target": {"code": "de", "name": "German"}}
    assert form(libre, "/translate", q="Open it.", source="en", target="de",
                api_key="anything")[0] == 200


@pytest.fixture(scope="module")
def keyed(ckpt, tmp_path_factory):
    """An in-process server that needs the key alpha."""
    keys = tmp_path_factory.mktemp("keys") / "keys.txt"
    keys.write_text("alpha\n")
    srv = InProcess(ckpt, "src_lang=en", "tgt_lang=de", f"api_keys={keys}")
    yield srv
    srv.stop()


def test_a_wrong_key_is_refused_before_the_body_is_read(keyed):
    """nmt's own API: 403, not the 422 or 400 of a body the key does not let in."""
    for body in ({"text": 5}, b'{"text": [', {"text": ["Open it."]}):
        for headers in ({}, {"Authorization": "Bearer beta"}):
            status, _, answer = keyed.call("POST", "/translate", body, headers)
            assert (status, answer["field"]) == (403, None), (body, headers)
            assert "Authorization: Bearer KEY" in answer["error"]
    status, _, answer = keyed.call("POST", "/translate", {"text": 5},
                                   {"Authorization": "Bearer alpha"})
    assert (status, answer["field"]) == (422, "text")  # the key lets it in: the body's fault


def test_the_npm_clients_apikey_is_a_key_too(keyed):
    fields = {"q": "Open it.", "source": "en", "target": "de"}
    assert keyed.call("POST", "/translate", {**fields, "apiKey": "alpha"})[0] == 200
    assert keyed.call("POST", "/translate", {**fields, "apiKey": "beta"})[:3:2] == (
        403, {"error": "Invalid API key"})
    assert keyed.call("POST", "/translate", {**fields, "api_key": "alpha", "apiKey": ""})[0] == 200


def test_fields_in_the_query_string_of_a_post_without_a_body(libre, keyed):
    """deep-translator's request: LibreTranslate's fields in the query string, no body and no
    Content-Type; the key there too."""
    fields = {"q": TEXT, "source": "en", "target": "de", "format": "text"}
    want = libre.translate([TEXT])[0]["text"]
    for srv, key in ((libre, {}), (keyed, {"api_key": "alpha"})):
        status, _, body = srv.call("POST", "/translate?" + urlencode({**fields, **key}), b"",
                                   {"Content-Type": ""})
        assert (status, body) == (200, {"translatedText": want})
    status, _, body = keyed.call("POST", "/translate?" + urlencode({**fields, "api_key": "b"}),
                                 b"", {"Content-Type": ""})
    assert (status, body) == (403, {"error": "Invalid API key"})
    status, _, body = libre.call("POST", "/translate?q=x", {"text": ["Open it."]})
    assert status == 200 and "translations" in body  # JSON: nmt's own, by its body


def test_languages_answers_a_post_and_405s_are_in_libretranslates_shape(libre):
    """libretranslatepy 2.1.1 (what the translate package pins) asks POST /languages; a
    method a LibreTranslate route lacks gets its {"error": ...}."""
    status, body = form(libre, "/languages", api_key="")
    assert (status, body) == (200, [{"code": "en", "name": "English", "targets": ["de"]},
                                    {"code": "de", "name": "German", "targets": []}])
    for path in ("/detect", "/libretranslate/translate", "/libretranslate/detect"):
        status, _, body = libre.call("GET", path)
        assert (status, body) == (405, {"error": "Method Not Allowed"}), path
    status, _, body = libre.call("GET", "/libretranslate/nothing")
    assert (status, body) == (404, {"error": "Not Found"})
    status, _, body = libre.call("POST", "/stats")
    assert (status, body["field"]) == (405, "path")  # nmt's own routes: nmt's shape


def test_a_key_file_without_a_key_or_with_a_non_ascii_one_is_one_line(ckpt, tmp_path):
    """Refused when read (at start-up: the server does not start); changed so later, said
    once on stderr, and no request is let in until it is fixed."""
    path = tmp_path / "keys.txt"
    for text, fault in (("", "no key in it"), ("# keys\n\n", "no key in it"),
                        ("alpha\n\ncl\u00e9\n", "line 3: a key must be ASCII")):
        path.write_text(text)
        with pytest.raises(NmtError, match=f"^api_keys={re.escape(str(path))}: {fault}"):
            ApiKeys(str(path), print)
    with pytest.raises(NmtError, match="line 3: a key must be ASCII"):  # nmt-serve stops
        InProcess(ckpt, "src_lang=en", "tgt_lang=de", f"api_keys={tmp_path / 'keys.txt'}")
    path.write_text("alpha\n")
    said = []
    keys = ApiKeys(str(path), said.append)
    assert keys.valid("alpha") and not keys.valid("cl\u00e9")
    path.write_text("alpha\ncl\u00e9\n")
    assert not keys.valid("alpha") and not keys.valid("alpha")
    assert said == [f"api_keys={path}: line 2: a key must be ASCII (an HTTP header cannot "
                    f"carry other characters): no request is let in until it is fixed"]
    path.write_text("beta\n")
    assert keys.valid("beta") and len(said) == 1


# ----------------------------------------------------------------------------- real clients
@pytest.fixture(scope="module")
def server(ckpt):
    """An nmt-serve process on a loopback port."""
    srv = Server(ckpt, "workers=1", "src_lang=en", "tgt_lang=de")
    yield srv
    assert srv.stop() == 0


@pytest.mark.slow
def test_the_libretranslatepy_client(server):
    client_module = pytest.importorskip("libretranslatepy")
    client = client_module.LibreTranslateAPI(f"http://127.0.0.1:{server.port}")
    assert client.languages() == [{"code": "en", "name": "English", "targets": ["de"]},
                                  {"code": "de", "name": "German", "targets": []}]
    assert client.translate(TEXT, "en", "de") == server.translate([TEXT])[0]["text"]
    with pytest.raises(HTTPError) as refused:
        client.translate(TEXT, "fr", "de")
    assert refused.value.code == 400
    assert json.loads(refused.value.read()) == {
        "error": "fr is not supported (this server translates from en into de)"}


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("curl") is None, reason="needs curl")
def test_curl(server):
    url = f"http://127.0.0.1:{server.port}"

    def curl(*args: str) -> tuple[int, dict]:
        out = subprocess.run(["curl", "-sS", "-w", "\n%{http_code}", *args], check=True,
                             capture_output=True, text=True, timeout=60).stdout
        body, status = out.rsplit("\n", 1)
        return int(status), json.loads(body)

    own = server.translate([TEXT, "Quit."])
    assert curl(f"{url}/translate", "--data-urlencode", f"q={TEXT}", "-d", "source=en",
                "-d", "target=de") == (200, {"translatedText": own[0]["text"]})
    assert curl(f"{url}/translate", "-F", f"q={TEXT}", "-F", "source=en",
                "-F", "target=de") == (200, {"translatedText": own[0]["text"]})  # multipart
    body = json.dumps({"q": [TEXT, "Quit."], "source": "en", "target": "de"})
    assert curl(f"{url}/translate", "-H", "Content-Type: application/json", "-d", body) == (
        200, {"translatedText": [t["text"] for t in own]})
    assert curl(f"{url}/translate", "-d", "q=Quit.&source=en") == (
        400, {"error": "Invalid request: missing target parameter"})


KEY = "k3y-Alpha-7q"  # keyed_server's only key
LINE = "Open the file in a new window."  # one line that the language identifier finds English
CLIENTS = Path(__file__).resolve().parents[2] / "build" / "clients"  # installed once, kept
TRANSLATE_PACKAGE = """
import json, sys
import libretranslatepy
from translate import Translator

url, key, text = sys.argv[1:]
def run(call):
    try:
        return call()
    except Exception as e:
        return f"{type(e).__name__}: {e}"
told, auto = (Translator("de", source, provider="libre", base_url=url,
                         secret_access_key=key or None) for source in ("en", "autodetect"))
print(json.dumps({"client": libretranslatepy.__file__,
                  "languages": run(told.provider.api.languages),
                  "en": run(lambda: told.translate(text)),
                  "auto": run(lambda: auto.translate(text))}))
"""
NPM_CLIENT = """
const { translate } = require("libretranslate");
const [apiurl, apiKey, query] = process.argv.slice(1);
async function run(source) {
  try {
    return (await translate({ query, source, target: "de", apiurl, apiKey })) ?? null;
  } catch (e) {
    return `${e.name}: ${e.message}`;
  }
}
(async () => console.log(JSON.stringify({ en: await run("en"), auto: await run("auto"),
                                          fr: await run("fr") })))();
"""


@pytest.fixture(scope="module")
def keyed_server(ckpt, tmp_path_factory):
    """An nmt-serve process that needs KEY; its access log (stdout) in the file .access_log."""
    folder = tmp_path_factory.mktemp("keyed")
    (folder / "keys.txt").write_text(f"{KEY}\n")
    with open(folder / "access.log", "w") as log:
        srv = Server(ckpt, "workers=1", "src_lang=en", "tgt_lang=de", "access_log=true",
                     f"api_keys={folder / 'keys.txt'}", stdout=log)
    srv.access_log = folder / "access.log"
    yield srv
    assert srv.stop() == 0


def installed(name: str, command: list[str]) -> Path:
    """build/clients/NAME, where `command` (the folder its last argument) installed a client
    as its users install it, once (later runs reuse it); the test is skipped, with the
    installer's last line, where its registry cannot be reached."""
    home = CLIENTS / name
    if home.is_dir():
        return home
    CLIENTS.mkdir(parents=True, exist_ok=True)
    fresh = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=CLIENTS))  # this test's own
    try:
        done = subprocess.run([*command, str(fresh)], capture_output=True, text=True,
                              timeout=600)
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no message"])[-1]
            pytest.skip(f"cannot install {name} (is its registry reachable?): {last}")
        with contextlib.suppress(OSError):  # whole or not at all; another's may be there
            fresh.rename(home)
    except subprocess.TimeoutExpired:
        pytest.skip(f"cannot install {name}: its installer did not finish in 10 minutes")
    finally:
        shutil.rmtree(fresh, ignore_errors=True)
    return home


@pytest.mark.slow
def test_the_deep_translator_client(server, keyed_server):
    """deep-translator's LibreTranslator at the server's root: its fields, key included, in
    the query string of a POST without a body. It translates only (its languages are its
    own list) and insists on a key, any key where none is needed."""
    deep = pytest.importorskip("deep_translator")

    def client(srv: Server, key: str):
        return deep.LibreTranslator(source="en", target="de", api_key=key,
                                    custom_url=f"http://127.0.0.1:{srv.port}/")

    want = [t["text"] for t in server.translate([TEXT, LINE])]
    assert client(server, "any").translate(TEXT) == want[0]
    assert client(keyed_server, KEY).translate_batch([TEXT, LINE]) == want
    with pytest.raises(deep.exceptions.AuthorizationException):
        client(keyed_server, "wrong").translate(TEXT)


@pytest.mark.slow
def test_a_key_is_never_written_in_the_access_log(keyed_server):
    """A key in the query string (deep-translator's), valid or not, by either name."""
    requests = pytest.importorskip("requests")
    url = f"http://127.0.0.1:{keyed_server.port}/translate"
    statuses = [requests.post(url, params={"source": "en", name: key}, timeout=60,
                              data={"q": LINE, "target": "de"}).status_code
                for key in (KEY, "wr0ng-key") for name in ("api_key", "apiKey")]
    logged = keyed_server.access_log.read_text()
    assert KEY not in logged and "wr0ng" not in logged
    assert '"POST /translate?source=en&api_key=*** HTTP/1.1" 200' in logged  # uvicorn's line
    assert '"POST /translate?source=en&apiKey=*** HTTP/1.1" 403' in logged
    assert statuses == [200, 200, 403, 403]


@pytest.mark.slow
def test_the_translate_packages_libre_provider(server, keyed_server):
    """`pip install translate`, as its users install it: with libretranslatepy 2.1.1, which
    asks POST /languages; translation, source detection (autodetect) and the languages."""
    pytest.importorskip("py3langid")  # the server's source detection
    home = installed("translate", [sys.executable, "-m", "pip", "install", "-q", "--retries",
                                   "1", "--timeout", "20", "translate", "--target"])
    want = server.translate([LINE])[0]["text"]
    listing = [{"code": "en", "name": "English", "targets": ["de"]},
               {"code": "de", "name": "German", "targets": []}]

    def run(srv: Server, key: str) -> dict:
        out = subprocess.run([sys.executable, "-c", TRANSLATE_PACKAGE,
                              f"http://127.0.0.1:{srv.port}", key, LINE], check=True,
                             capture_output=True, text=True, timeout=120,
                             env={**os.environ, "PYTHONPATH": str(home)}).stdout
        found = json.loads(out)
        assert found.pop("client").startswith(str(home))  # its own libretranslatepy
        return found

    works = {"languages": listing, "en": want, "auto": want}
    assert run(server, "") == works
    assert run(keyed_server, KEY) == works
    assert run(keyed_server, "wrong") == {"languages": listing,
                                          "en": "TranslationError: HTTP Error 403: Forbidden",
                                          "auto": "HTTPError: HTTP Error 403: Forbidden"}


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("npm") is None or shutil.which("node") is None,
                    reason="needs node and npm")
def test_the_npm_libretranslate_client(server, keyed_server):
    """`npm install libretranslate`: GET /languages (to check the languages), then a JSON
    POST /translate with apiKey; source auto detects."""
    pytest.importorskip("py3langid")  # the server's source detection
    home = installed("npm", ["npm", "install", "--no-audit", "--no-fund", "--fetch-retries=1",
                             "libretranslate", "--prefix"])
    want = server.translate([LINE])[0]["text"]

    def run(srv: Server, key: str) -> dict:
        out = subprocess.run(["node", "-e", NPM_CLIENT, f"http://127.0.0.1:{srv.port}", key,
                              LINE], check=True, capture_output=True, text=True, timeout=120,
                             cwd=home).stdout
        return json.loads(out)

    works = {"en": want, "auto": want, "fr": "TypeError: This language was not found/does "
                                             "not exist."}
    assert run(server, "") == works
    assert run(keyed_server, KEY) == works
    assert run(keyed_server, "wrong") == {**works, "en": None, "auto": None}  # 403s


def test_a_debian_faq_page_translates_end_to_end_as_html(ckpt):
    """A real page (tests/data/debian_faq_kernel.en.html, Debian's debian-faq; its licence
    beside it) through LibreTranslate's API with format=html, as a plain HTTP POST: the same
    tags with the same attributes, well-formed, its style and code untouched."""
    from collections import Counter

    from test_markup import OPAQUE, TAG, well_formed

    page = (Path(__file__).parents[1] / "data" / "debian_faq_kernel.en.html").read_text()
    srv = InProcess(ckpt, "src_lang=en", "tgt_lang=de", "max_chars=20000",
                    "max_sentences=1000", "max_queued=1000")
    try:
        status, _, body = srv.call("POST", "/translate", {"q": page, "source": "en",
                                                          "target": "de", "format": "html"})
    finally:
        srv.stop()
    assert status == 200
    out = body["translatedText"]
    assert well_formed(page) and well_formed(out)
    assert Counter(TAG.findall(OPAQUE.sub("", out))) == Counter(TAG.findall(OPAQUE.sub("", page)))
    def untranslated(text: str) -> list[str]:
        return [m.group() for m in re.finditer(r"<(style|code)\b.*?</\1>", text, re.S)]
    assert len(untranslated(page)) >= 10 and untranslated(out) == untranslated(page)
    assert out != page  # its text translated


def test_nmts_own_api_keeps_markup_and_an_engine_without_attention_refuses_it(libre):
    text = 'Open <x id="1"/> the <b>file</b> {0} now.'
    (got,) = libre.translate([text], markup="xml", placeholders=True)
    assert sorted(re.findall(r"<[^>]*>|\{0\}", got["text"])) == sorted(
        ['<x id="1"/>', "<b>", "</b>", "{0}"])
    status, _, body = libre.call("POST", "/translate", {"text": ["<b>x</b>"], "markup": "html",
                                                        "nbest": 2, "beam_size": 2})
    assert status == 422 and body["field"] == "nbest"
    translator = libre.service.translator
    saved = translator.capabilities
    translator.capabilities = dataclasses.replace(saved, engine="ctranslate2", attention=False)
    try:
        status, _, body = libre.call("POST", "/translate", {"text": [text], "markup": "xml"})
        assert (status, body["field"]) == (422, "markup")
        assert form(libre, "/translate", q="<p>Open it.</p>", source="en", target="de",
                    format="html") == (400, {"error": "Invalid request: markup: engine="
                                                      "ctranslate2 does not return attention; "
                                                      "use engine=nmt"})
    finally:
        translator.capabilities = saved
