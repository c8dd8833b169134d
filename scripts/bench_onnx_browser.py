"""nmt-export format=onnx's page in headless chromium: load time, speed, and BLEU beside nmt's.

Serves --model (an export written with web_runtime=) from a local static server, opens its page
in headless chromium (nmt.testing.browser's DevTools driver; `make test-browser` installs
chromium) with --dtype (fp32 or q8), and reports:
- the first load: navigation to a ready pipeline (transformers.js, ONNX Runtime's WebAssembly
  and the model fetched and compiled), and transformers.js's own part of it;
- the source lines translated one at a time (greedy, one WebAssembly thread): sentences/s and
  the latency per sentence (median, 90th percentile);
- how many outputs equal nmt-translate's (greedy, split=none, --checkpoint) and the BLEU of
  both against --reference.
Time it on an idle machine (flock /tmp/nmt-cpu.lock ...): the browser's one thread competes
with everything else on the cores.

    flock /tmp/nmt-cpu.lock .venv/bin/python scripts/bench_onnx_browser.py --model model-web \\
        --checkpoint RUN/averaged.pt --source scripts/data/debian-po/en-de/test.en.xz \\
        --reference scripts/data/debian-po/en-de/test.de.xz --dtype q8
"""

from __future__ import annotations

import argparse
import functools
import http.server
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from nmt.metrics.scoring import score  # noqa: E402
from nmt.system.files import read_lines  # noqa: E402
from nmt.testing.browser import Browser  # noqa: E402

CHUNK = 25  # sentences a call
TIMED = """(async () => { const out = [], ms = [];
  for (const line of %s) { const t = performance.now();
    out.push((await window.nmtTranslateLines([line]))[0]); ms.push(performance.now() - t); }
  return [out, ms]; })()"""


def parse_args() -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="an nmt-export format=onnx folder")
    p.add_argument("--checkpoint", required=True, help="the exported checkpoint")
    p.add_argument("--source", required=True)
    p.add_argument("--reference", required=True)
    p.add_argument("--lines", type=int, default=0, help="the first N lines (0: all)")
    p.add_argument("--dtype", default="q8", choices=("fp32", "q8"))
    return p.parse_args()


def serve(folder: str) -> http.server.ThreadingHTTPServer:
    """A quiet static file server of `folder` on a free loopback port, in a thread."""
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args) -> None:
            """No access log."""

    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(Quiet, directory=folder))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def nmt_translate(checkpoint: str, lines: list[str]) -> list[str]:
    """nmt-translate's greedy outputs (split=none)."""
    cli = str(Path(sys.executable).parent / "nmt-translate")
    return subprocess.run([cli, f"checkpoint={checkpoint}", "search.beam_size=1", "split=none"],
                          input="\n".join(lines) + "\n", capture_output=True, text=True,
                          check=True).stdout.splitlines()


def main() -> None:
    """Load the page, translate, print the figures."""
    args = parse_args()
    sources, references = read_lines(args.source), read_lines(args.reference)
    if args.lines:
        sources, references = sources[:args.lines], references[:args.lines]
    server = serve(args.model)
    with tempfile.TemporaryDirectory() as profile:
        browser = Browser(Path(profile))
        try:
            url = f"http://127.0.0.1:{server.server_address[1]}/index.html?dtype={args.dtype}"
            started = time.perf_counter()
            browser.send("Page.navigate", session=True, url=url)
            browser.wait_for("window.nmtReady !== undefined", timeout=120)
            assert browser.run("window.nmtReady") is True, browser.run(
                "document.getElementById('error').textContent")
            load = time.perf_counter() - started
            print(f"first load: {load:.2f} s to a ready page "
                  f"(transformers.js pipeline: {browser.run('window.nmtLoadSeconds'):.2f} s)")
            started, got, ms = time.perf_counter(), [], []
            for at in range(0, len(sources), CHUNK):  # each call answered within the driver's 30 s
                out, times = browser.run(TIMED % json.dumps(sources[at:at + CHUNK]))
                got, ms = got + out, ms + times
            total = time.perf_counter() - started
        finally:
            browser.close()
            server.shutdown()
    ms = sorted(ms)
    print(f"{len(got)} sentences in {total:.1f} s: {len(got) / total:.1f} sentences/s, "
          f"latency median {statistics.median(ms):.1f} ms, "
          f"90th percentile {ms[int(0.9 * (len(ms) - 1))]:.1f} ms ({args.dtype}, 1 thread)")
    want = nmt_translate(args.checkpoint, sources)
    print(f"{sum(a == b for a, b in zip(got, want, strict=True))}/{len(got)} "
          "outputs equal nmt-translate's")
    for name, hyps in (("browser", got), ("nmt-translate", want)):
        print(f"{name}: {score(hyps, references).bleu_line}")


if __name__ == "__main__":
    main()
