"""Headless chromium driven over the DevTools protocol on a pipe (--remote-debugging-pipe:
NUL-terminated JSON messages, commands on the browser's fd 3, answers and events on its fd 4):
what tests/system/test_browser.py, tests/wings/test_onnx_browser.py and
scripts/bench_onnx_browser.py drive pages with. `make test-browser` installs chromium."""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import time
from pathlib import Path

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


class Browser:
    """Headless chromium with one page, spoken to over the DevTools protocol."""

    def __init__(self, profile: Path):
        commands, self.to_browser = os.pipe()
        self.from_browser, answers = os.pipe()
        flags = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                 "--remote-debugging-pipe", f"--user-data-dir={profile}",
                 "--window-size=1100,1000", "about:blank"]
        # the browser reads fd 3 and writes fd 4: the pipes' ends moved there by bash
        self.proc = subprocess.Popen(
            ["bash", "-c", f'exec "$0" "$@" 3<&{commands} 4>&{answers}', CHROMIUM, *flags],
            pass_fds=(commands, answers), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True)
        os.close(commands)
        os.close(answers)
        self.buffer, self.events, self.next_id = b"", [], 0
        target = self.send("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.send("Target.attachToTarget", targetId=target,
                                 flatten=True)["sessionId"]
        for domain in ("Page", "Runtime", "Network", "Log"):
            self.send(f"{domain}.enable", session=True)

    def send(self, method: str, session: bool = False, **params) -> dict:
        """One command (to the page's session if `session`); its result."""
        self.next_id += 1
        message = {"id": self.next_id, "method": method, "params": params}
        if session:
            message["sessionId"] = self.session
        os.write(self.to_browser, json.dumps(message).encode() + b"\0")
        while True:
            got = self.receive(30)
            if got.get("id") == self.next_id:
                assert "error" not in got, got
                return got["result"]
            self.events.append(got)

    def receive(self, timeout: float) -> dict:
        """The next message from the browser (waiting at most `timeout` seconds)."""
        deadline = time.monotonic() + timeout
        while b"\0" not in self.buffer:
            ready, _, _ = select.select([self.from_browser], [], [],
                                        max(0.0, deadline - time.monotonic()))
            chunk = os.read(self.from_browser, 1 << 20) if ready else b""
            assert chunk, "chromium did not answer"
            self.buffer += chunk
        message, self.buffer = self.buffer.split(b"\0", 1)
        return json.loads(message)

    def run(self, script: str):
        """The value of a JavaScript expression in the page (awaited if a promise)."""
        result = self.send("Runtime.evaluate", session=True, expression=script,
                           awaitPromise=True, returnByValue=True)
        assert "exceptionDetails" not in result, result
        return result["result"].get("value")

    def failures(self) -> list[str]:
        """What went wrong in the page so far: uncaught exceptions and promise rejections,
        console.error calls, and the browser's errors (a request answered 4xx or 5xx, one
        refused by the content security policy), but for the browser's own /favicon.ico."""
        found = []
        for event in self.events:
            method, params = event.get("method"), event.get("params", {})
            if method == "Runtime.exceptionThrown":
                details = params["exceptionDetails"]
                thrown = details.get("exception", {}).get("description", "")
                found.append(f"{details['text']} {thrown}")
            elif method == "Runtime.consoleAPICalled" and params["type"] in ("error", "assert"):
                found.append("console.error: " + " ".join(
                    str(a.get("value", a.get("description", ""))) for a in params["args"]))
            elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
                where = params["entry"].get("url", "")
                if not where.endswith("/favicon.ico"):  # the browser's own ask, not the page's
                    found.append(f"{params['entry']['text']} ({where})")
        return found

    def wait_for(self, script: str, timeout: float = 30.0):
        """Poll a JavaScript expression until it is truthy; its value."""
        deadline = time.monotonic() + timeout
        while not (value := self.run(script)):
            assert time.monotonic() < deadline, f"timed out waiting for {script}"
            time.sleep(0.05)
        return value

    def close(self) -> None:
        """Close the browser (killed if it does not go)."""
        try:
            self.send("Browser.close")
        except (AssertionError, OSError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, 9)
        os.close(self.to_browser)
        os.close(self.from_browser)
