"""nmt-serve offline=DIR: an nmt-export format=onnx folder's page at /offline/, over HTTP.

The folder here holds stand-ins named as the export's files (the browser test,
tests/wings/test_onnx_browser.py, serves a real export): each is served as it is, with the type the
browser needs (a module script as JavaScript, WebAssembly as application/wasm) and the page's
own content security policy; nothing outside the folder is served; a folder that is no export
with its page stops nmt-serve at start with one line naming the key.
"""

import json
import subprocess

import pytest
from translate_helpers import save_tiny_checkpoint

pytest.importorskip("fastapi")
from test_serve import CLI, Server  # noqa: E402

from nmt.serve.offline import CSP, NEEDS  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def checkpoint(tiny_data_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("offline")
    return save_tiny_checkpoint(tmp / "c.pt", (tiny_data_dir / "spm.model").read_bytes())


def test_the_folder_is_served_with_its_policy(checkpoint, tmp_path):
    folder = tmp_path / "web"
    for name in (*NEEDS, "runtime/ort-wasm-simd-threaded.asyncify.wasm"):
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        text = f"this is {name}"
        (folder / name).write_text(json.dumps(text) if name.endswith(".json") else text)
    (tmp_path / "secret.txt").write_text("not for the browser")
    server = Server(checkpoint, f"offline={folder}")
    try:
        status, response, body = server.call("GET", "/offline")
        assert status in (302, 307) and response.getheader("location") == "/offline/"
        for path, name, kind in (("/offline/", "index.html", "text/html"),
                                 ("/offline/offline.js", "offline.js", "text/javascript"),
                                 ("/offline/runtime/ort-wasm-simd-threaded.asyncify.wasm",
                                  "runtime/ort-wasm-simd-threaded.asyncify.wasm",
                                  "application/wasm"),
                                 ("/offline/config.json", "config.json", "application/json")):
            status, response, body = server.call("GET", path)
            assert (status, body) == (200, f"this is {name}"), path
            assert response.getheader("content-type").startswith(kind), path
            assert response.getheader("content-security-policy") == CSP
        for path in ("/offline/../secret.txt", "/offline/%2e%2e/secret.txt",
                     "/offline/nothing.js"):
            status, _, body = server.call("GET", path)
            assert status == 404 and "not for the browser" not in str(body), path
    finally:
        assert server.stop() == 0


def test_a_folder_without_the_page_is_one_line(checkpoint, tmp_path):
    (tmp_path / "web").mkdir()
    (tmp_path / "web" / "config.json").write_text("{}")
    run = subprocess.run([CLI, f"checkpoint={checkpoint}", "port=0", f"offline={tmp_path}/web"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode != 0
    lines = [line for line in run.stderr.splitlines() if "offline" in line]
    assert len(lines) == 1 and "has no index.html" in lines[0], run.stderr
    assert "Traceback" not in run.stderr
