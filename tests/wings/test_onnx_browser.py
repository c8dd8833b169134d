"""nmt-export format=onnx's page in headless chromium: transformers.js translates as nmt does.

A random pre-norm model (tests/wings/test_export.py's, a real SentencePiece vocabulary) is exported
with web_runtime= (make test-browser runs `npm install @huggingface/transformers` into
build/transformers-js) and served by nmt-serve offline=DIR at /offline/. In the browser
(tests/system/test_browser.py's DevTools driver) the page loads the fp32 model; then
- the first 50 lines of the bundled test.en translate (greedy, in WebAssembly) to nmt-translate's
  text (split=none, search.beam_size=1), and the browser sends no request while translating;
- tokenizer.json in transformers.js encodes every source and reference line of the bundled test
  split to nmt's ids and decodes nmt's ids to nmt's text;
- no script failed, nothing came from anywhere but the server (the page's content security
  policy held).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("onnxruntime")
from test_export import DATA, run_export, sample_spm, varied_checkpoint  # noqa: E402
from test_serve import Server  # noqa: E402

from nmt.data.tokenizer import Tokenizer  # noqa: E402
from nmt.system.files import read_lines  # noqa: E402
from nmt.testing.browser import CHROMIUM, Browser  # noqa: E402
from nmt.wings.interop.onnx_export import RUNTIME  # noqa: E402

pytestmark = [pytest.mark.browser, pytest.mark.skipif(os.environ.get("NMT_BROWSER") != "1",
                                                      reason="make test-browser runs it")]
ROOT = Path(__file__).resolve().parents[2]
NPM = ROOT / "build" / "transformers-js"  # make test-browser's npm install
TRANSLATE = str(Path(sys.executable).parent / "nmt-translate")
SENTENCES = 50


@pytest.fixture(scope="module")
def offline(tmp_path_factory):
    """(server, browser, URL of the page, SentencePiece model) with the page loaded, fp32."""
    if CHROMIUM is None:
        pytest.skip("needs chromium (make test-browser installs it)")
    if not all((NPM / name).is_file() for name in RUNTIME):
        pytest.skip(f"needs transformers.js in {NPM} (make test-browser installs it)")
    tmp = tmp_path_factory.mktemp("onnx-browser")
    spm = sample_spm("joint")
    ckpt = varied_checkpoint(tmp / "c.pt", spm, spm, "pre")
    model = run_export(ckpt, tmp / "web", "onnx", web_runtime=str(NPM))
    server = Server(ckpt, f"offline={model}")
    browser = Browser(tmp / "profile")
    try:
        url = f"http://127.0.0.1:{server.port}/offline/"
        browser.send("Page.navigate", session=True, url=url + "?dtype=fp32")
        browser.wait_for("window.nmtReady !== undefined")
        assert browser.run("window.nmtReady") is True, browser.run(
            "document.getElementById('error').textContent")
        yield ckpt, browser, url, Tokenizer(spm)
    finally:
        try:
            browser.close()
        finally:
            assert server.stop() == 0


def requests(browser: Browser) -> list[str]:
    """The URLs the page asked for so far."""
    return [e["params"]["request"]["url"] for e in browser.events
            if e.get("method") == "Network.requestWillBeSent"]


def test_the_browser_translates_as_nmt_translate(offline):
    ckpt, browser, url, _ = offline
    lines = read_lines(str(DATA / "test.en.xz"))[:SENTENCES]
    want = subprocess.run([TRANSLATE, f"checkpoint={ckpt}", "search.beam_size=1", "split=none"],
                          input="\n".join(lines) + "\n", capture_output=True, text=True,
                          check=True).stdout.splitlines()
    before = len(requests(browser))
    got = browser.run(f"window.nmtTranslateLines({json.dumps(lines)})")
    assert got == want
    assert requests(browser)[before:] == []  # nothing fetched while translating
    origin = url.removesuffix("offline/")  # the browser's own /favicon.ico included
    assert all(u.startswith(origin) for u in requests(browser)), requests(browser)
    assert not [e for e in browser.events if e.get("method") == "Runtime.exceptionThrown"]
    assert browser.run("document.getElementById('error').hidden") is True


def test_tokenizer_json_round_trips_in_the_browser(offline):
    _, browser, _, tok = offline
    lines = read_lines(str(DATA / "test.en.xz")) + read_lines(str(DATA / "test.de.xz"))
    ids = tok.encode(lines)
    got = browser.run(f"(() => {{ const t = window.nmtTranslator.tokenizer; "
                      f"return {json.dumps(lines)}.map(l => t.encode(l)); }})()")
    eos = tok.specials.eos
    differ = [line for line, a, b in zip(lines, ids, got, strict=True) if a + [eos] != b]
    assert not differ, f"{len(differ)} lines encode otherwise, e.g. {differ[:3]}"
    texts = browser.run(f"(() => {{ const t = window.nmtTranslator.tokenizer; "
                        f"return {json.dumps(ids)}.map(i => t.decode(i, "
                        f"{{skip_special_tokens: true}})); }})()")
    differ = [(a, b) for a, b in zip(tok.decode(ids), texts, strict=True) if a != b]
    assert not differ, f"{len(differ)} lines decode otherwise, e.g. {differ[:3]}"
