"""nmt-serve's page (GET /) in a real headless browser: Debian's chromium, driven over the
DevTools protocol on a pipe (--remote-debugging-pipe: NUL-terminated JSON messages, commands
on the browser's fd 3, answers and events on its fd 4). `make test-browser` installs chromium
and runs this; `make test` leaves it out (marker `browser`). The screenshot goes to
build/serve-page.png (or $NMT_SCREENSHOT)."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path

import pytest
from translate_helpers import save_tiny_checkpoint

from nmt.testing.browser import CHROMIUM, Browser

pytest.importorskip("fastapi")
from test_serve import Server  # noqa: E402

# Only `make test-browser` (NMT_BROWSER=1) drives the browser; make test covers the page over HTTP.
pytestmark = [pytest.mark.browser, pytest.mark.skipif(os.environ.get("NMT_BROWSER") != "1",
                                                      reason="make test-browser runs it")]
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def page(tiny_data_dir, tmp_path_factory):
    """nmt-serve (split=sentence: it knows its source language) and chromium on its page."""
    if CHROMIUM is None:
        pytest.skip("needs chromium (make test-browser installs it)")
    tmp = tmp_path_factory.mktemp("browser")
    ckpt = save_tiny_checkpoint(tmp / "checkpoint.pt",
                                (tiny_data_dir / "spm.model").read_bytes(), seed=0)
    server = Server(ckpt, "workers=1", "src_lang=en")
    browser = Browser(tmp / "profile")
    try:
        url = f"http://127.0.0.1:{server.port}/"
        browser.send("Page.navigate", session=True, url=url)
        browser.wait_for("document.readyState === 'complete' && "
                         "document.getElementById('info').textContent.includes('beam size')")
        yield server, browser, url
    finally:
        try:
            browser.close()
        finally:  # the server stops even when the browser will not close
            assert server.stop() == 0


SHOWN = "document.getElementById('translation').textContent"


def test_the_page_translates_as_you_type_in_a_real_browser(page):
    server, browser, url = page
    # typing: the text arrives as input events, and the page translates after a pause
    browser.run("document.getElementById('source').focus()")
    sentence = "open the file in a new window"
    browser.send("Input.insertText", session=True, text=sentence)
    shown = browser.wait_for(SHOWN)
    want = server.translate([sentence], nbest=4, split="sentence", attention=True)[0]
    assert shown == want["text"]
    nbest = browser.run("[...document.querySelectorAll('#nbest tr')].map(r => "
                        "r.children[1].textContent)")
    assert nbest == [h["text"] for h in want["nbest"]]
    cells = browser.run("document.querySelectorAll('#attention svg rect').length")
    assert cells == len(want["attention"]["source"]) * len(want["attention"]["target"])
    # submitting: two lines, their translations on two lines, asked as the page asks (an
    # n-best list under split=auto kept a text whole, the line break lost: the page names
    # the server's split)
    asked = len(posted(browser))
    browser.run("document.getElementById('source').value = 'show hidden files\\n"
                "close the window'; document.getElementById('go').click()")
    browser.wait_for(f"document.getElementById('status').textContent === '' && {SHOWN}")
    body = posted(browser)[asked]
    assert body["nbest"] == 4 and body.get("split") == "sentence", body
    want = server.translate(["show hidden files\nclose the window"])[0]["text"]
    assert "\n" in want and server.translate(**body)[0]["text"] == want
    assert browser.wait_for(f"{SHOWN}.includes('\\n') && {SHOWN}") == want
    assert browser.run("document.getElementById('error').hidden") is True
    # nothing came from anywhere but this server, and nothing failed
    requested = [e["params"]["request"]["url"] for e in browser.events
                 if e.get("method") == "Network.requestWillBeSent"]
    assert requested and all(u.startswith(url) for u in requested), requested
    assert not browser.failures()


def posted(browser) -> list[dict]:
    """The bodies of the page's POST /translate requests so far, in order."""
    return [json.loads(e["params"]["request"]["postData"]) for e in browser.events
            if e.get("method") == "Network.requestWillBeSent"
            and e["params"]["request"]["url"].endswith("/translate")]


def test_the_page_shades_the_words_the_model_is_unsure_of(page):
    """Each word of the translation is a span titled with the probability the API answers,
    of class "low" exactly where that is below the page's 0.5 (Firefox Translations' shading)."""
    server, browser, _ = page
    sentence = "show the hidden files of the window"
    browser.run(f"document.getElementById('source').value = {json.dumps(sentence)}; "
                "document.getElementById('go').click()")
    want = server.translate([sentence], nbest=4, split="sentence", attention=True,
                            word_scores=True)[0]
    browser.wait_for(f"{SHOWN} === {json.dumps(want['text'])}")
    spans = browser.run("[...document.querySelectorAll('#translation span')].map(s => "
                        "[s.textContent, s.title, s.className])")
    assert [w for w, _, _ in spans] == [w["text"] for w in want["words"]]
    assert [float(t) for _, t, _ in spans] == pytest.approx(
        [w["prob"] for w in want["words"]], abs=5e-4)
    assert [c == "low" for _, _, c in spans] == [w["prob"] < 0.5 for w in want["words"]]
    assert any(c == "low" for _, _, c in spans), "a random model is unsure of some word"
    assert browser.run("document.getElementById('low-note').hidden") is False


def test_pasted_paragraphs_come_back_with_their_line_breaks(page):
    server, browser, _ = page
    text = ("Open the file. Show hidden files!\n\nClose the window. Save it?\n"
            "Quit the program.")
    browser.run("const s = document.getElementById('source'); s.value = ''; s.focus()")
    browser.send("Input.insertText", session=True, text=text)  # as a paste arrives
    assert browser.run("document.getElementById('source').value") == text
    want = server.translate([text], nbest=4, split="sentence", attention=True)[0]
    assert len(want["pieces"]) == 5  # split=sentence, each sentence alone
    shown = browser.wait_for(f"{SHOWN} === {json.dumps(want['text'])} && "
                             "document.getElementById('translation').innerText")
    lines = shown.split("\n")  # as rendered: the breaks and the blank line are on the page
    assert len(lines) == 4 and lines[1] == "" and all(lines[i] for i in (0, 2, 3))
    first = want["pieces"][0]
    assert browser.run("[...document.querySelectorAll('#nbest tr')].map(r => "
                       "r.children[1].textContent)") == [h["text"] for h in first["nbest"]]
    assert "5 pieces" in browser.run("document.getElementById('score').textContent")
    assert browser.run("document.getElementById('attention-box').hidden") is False
    size = browser.send("Page.getLayoutMetrics", session=True)["cssContentSize"]
    shot = browser.send("Page.captureScreenshot", session=True, format="png",
                        captureBeyondViewport=True, clip={
                            "x": 0, "y": 0, "width": size["width"],
                            "height": size["height"], "scale": 1})  # the whole page
    path = Path(os.environ.get("NMT_SCREENSHOT", ROOT / "build" / "serve-page.png"))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(base64.b64decode(shot["data"]))


def test_a_text_over_2000_characters_gets_no_heatmap(page):
    _, browser, _ = page  # the server would compute the attention of each of its pieces
    long = "Open the file and show the hidden files. " * 55
    browser.run(f"document.getElementById('source').value = {json.dumps(long)}; "
                "document.getElementById('go').click()")
    browser.wait_for("document.getElementById('score').textContent.includes('55 pieces')")
    assert browser.run("document.getElementById('attention-box').hidden") is True


# ----------------------------------------------------------------------------- five setups
def with_languages(ckpt: Path, out: Path, convention: str, codes: list[str]) -> Path:
    """The tiny checkpoint recorded as a multilingual one: a tag model (OPUS-MT's >>xx<<, or
    one trained here on several pairs) or a forced-token model (NLLB-200 / M2M100 style),
    each language one of its pieces."""
    from nmt.training.checkpoint import load_checkpoint, save_checkpoint

    state = load_checkpoint(ckpt)
    state["vocab"]["languages"] = {"convention": convention,
                                   "codes": {c: 10 + i for i, c in enumerate(codes)}}
    save_checkpoint(state, out)
    return out


SETUPS = {  # name -> (the checkpoint's languages, server settings)
    "bilingual-nmt": (None, ["src_lang=en"]),
    "bilingual-ctranslate2": (None, ["src_lang=en", "engine=ctranslate2", "search.alpha=0"]),
    "mbr": (None, ["src_lang=en", "mbr.candidates=4"]),
    "tag-multilingual": (("tag", ["de", "fr"]), ["tgt_lang=fr"]),
    "nllb-style": (("forced", ["deu_Latn", "eng_Latn", "fra_Latn"]),
                   ["src_lang=eng_Latn", "tgt_lang=deu_Latn"]),
}


@pytest.mark.parametrize("setup", list(SETUPS))
def test_the_page_asks_only_what_the_server_answers(setup, tiny_data_dir, tmp_path):
    """For each setup the page reads /health's features, asks only for what the server
    answers (no attention from CTranslate2 or a forced-token model, no n-best under MBR), shows
    the language pickers of the model's convention, and shows the server's translation with
    no error; a screenshot of each goes to build/serve-page-SETUP.png."""
    if CHROMIUM is None:
        pytest.skip("needs chromium (make test-browser installs it)")
    languages, settings = SETUPS[setup]
    ckpt = save_tiny_checkpoint(tmp_path / "checkpoint.pt",
                                (tiny_data_dir / "spm.model").read_bytes(), seed=0)
    if languages:
        ckpt = with_languages(ckpt, tmp_path / "multi.pt", *languages)
    server = Server(ckpt, "workers=1", *settings)
    browser = Browser(tmp_path / "profile")
    try:
        browser.send("Page.navigate", session=True, url=f"http://127.0.0.1:{server.port}/")
        browser.wait_for("document.readyState === 'complete' && document.getElementById('info')"
                         " && document.getElementById('info').textContent.includes('beam size')")
        health = server.call("GET", "/health")[2]
        features = health["features"]
        shown = {box: not browser.run(f"document.getElementById('{box}').hidden")
                 for box in ("src-box", "tgt-box")}
        convention = features["convention"]
        assert shown == {"src-box": convention == "forced", "tgt-box": convention != "pair"}
        browser.run("document.getElementById('source').focus()")
        sentence = "open the file in a new window"
        browser.send("Input.insertText", session=True, text=sentence)
        text = browser.wait_for(f"{SHOWN} || !document.getElementById('error').hidden && "
                                "'error: ' + document.getElementById('error').textContent")
        asked = {}
        if features["attention"]:
            asked["attention"] = True
        if features["nbest"]:  # with the server's split (under auto it would be none)
            asked["nbest"], asked["split"] = health["search"]["beam_size"], health["split"]
        if convention == "forced":
            asked["src_lang"] = browser.run("document.getElementById('src').value")
        if convention != "pair":
            asked["tgt_lang"] = browser.run("document.getElementById('tgt').value")
        assert text == server.translate([sentence], **asked)[0]["text"]
        assert browser.run("document.getElementById('attention-box').hidden") is (
            not features["attention"])
        assert browser.run("document.getElementById('nbest-box').hidden") is (
            not features["nbest"])
        assert (setup, features["attention"], features["nbest"]) in {
            ("bilingual-nmt", True, True), ("bilingual-ctranslate2", False, True),
            ("mbr", True, False), ("tag-multilingual", True, True), ("nllb-style", False, True)}
        assert not browser.failures()
        shot = browser.send("Page.captureScreenshot", session=True, format="png")
        path = ROOT / "build" / f"serve-page-{setup}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(shot["data"]))
    finally:
        try:
            browser.close()
        finally:
            assert server.stop() == 0
