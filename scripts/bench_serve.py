"""Load test of nmt-serve: N concurrent loopback clients against nmt-translate on the same input.

1. nmt-translate translates the input file (its own timing: the search, model loading excluded).
2. nmt-serve starts on a free loopback port with the same search settings; N client threads,
   each on its own keep-alive connection, send one sentence per request (the input's lines
   in order, each once) until every line is done or --seconds have passed.
3. Reported: sentences/s, p50/p95/p99 latency, the error count, the server's mean batch size,
   the throughput relative to nmt-translate's, and how many translations differ from
   nmt-translate's (0 expected: the same search on other batch mates).
4. With --rounds N, steps 1-3 N times in turn, then the medians of the per-round percentages
   (the machine's speed drifts between runs; within a round the programs run minutes apart).
5. With --ceiling, first the offline ceiling of a server under that load: the input in arrival
   order, cut into chunks of --clients sentences, each decoded as one batch through a
   Translator with the server's workers and the same search (the batches a server would have
   if every client's sentence arrived at once, against nmt-translate's length-sorted ones);
   the server's sentences/s is then reported as a % of it too.

    flock /tmp/nmt-cpu.lock .venv/bin/python scripts/bench_serve.py \\
        --checkpoint work/demo/run/averaged.pt --input scripts/data/debian-po/en-de/test.en

Extra nmt-serve settings go after --serve (e.g. --serve workers=1 threads=2); search settings
given with --search apply to both programs (e.g. --search search.beam_size=1).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import http.client
import json
import os
import re
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from nmt.config import SearchConfig
from nmt.decoding.messages import Batch, Failed, Sentence
from nmt.engines.translator import Translator
from nmt.system.runtime import usable_cores

BIN = Path(sys.executable).parent


def parse_args() -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--input", required=True, help="raw source sentences, one a line")
    p.add_argument("--clients", type=int, default=32, help="concurrent connections")
    p.add_argument("--seconds", type=float, default=120.0, help="stop the load after this long")
    p.add_argument("--lines", type=int, default=0, help="use the first N lines (0: all)")
    p.add_argument("--search", nargs="*", default=[],
                   help="search.* overrides given to both nmt-translate and nmt-serve")
    p.add_argument("--serve", nargs="*", default=[], help="further nmt-serve overrides")
    p.add_argument("--skip-translate", action="store_true", help="only the server's figures")
    p.add_argument("--ceiling", action="store_true",
                   help="also time --clients arrival-ordered sentences decoded as one batch")
    p.add_argument("--rounds", type=int, default=1,
                   help="measure this many times in turn; then the medians of the percentages")
    args = p.parse_args()
    if args.rounds < 1:
        p.error(f"--rounds must be at least 1, got {args.rounds}")
    return args


def run_translate(args, lines: list[str]) -> tuple[float, float, list[str]]:
    """nmt-translate on the lines: its sentences/s (search time), the CPU seconds of the whole
    command (its worker processes and model loading included) and its translations."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with tempfile.TemporaryDirectory() as tmp:
        src, out = Path(tmp) / "src.txt", Path(tmp) / "hyp.txt"
        src.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        done = subprocess.run([str(BIN / "nmt-translate"), f"checkpoint={args.checkpoint}",
                               f"input={src}", f"output={out}", *args.search],
                              capture_output=True, text=True, check=True)
        # "translated N lines in S s (...", or "translated N lines (P pieces, split=...) in S s"
        found = re.search(r"translated (\d+) lines (?:\([^)]*\) )?in ([\d.]+) s", done.stderr)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
        rate = int(found.group(1)) / max(float(found.group(2)), 1e-9)  # lines (texts) a second
        return rate, cpu, out.read_text(encoding="utf-8").splitlines()


def search_config(overrides: list[str]) -> SearchConfig:
    """The SearchConfig of search.key=value overrides (values read as Python literals, else
    text)."""
    values = {}
    for item in overrides:
        key, _, text = item.partition("=")
        try:
            values[key.removeprefix("search.")] = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            values[key.removeprefix("search.")] = text
    return SearchConfig(**values)


def run_ceiling(args, lines: list[str]) -> float:
    """The offline ceiling: sentences/s of the lines in arrival order, chunks of --clients each
    decoded as one whole batch (no length sorting, no token budget) on the server's workers,
    through the loops nmt-serve runs (a worker gets the next chunk when it has answered its
    last)."""
    search = search_config(args.search)
    search = dataclasses.replace(search, max_tokens=1 << 30, max_sentences=0)
    workers = [int(s.split("=", 1)[1]) for s in args.serve if s.startswith("workers=")]
    with Translator.load(args.checkpoint, dtype=search.dtype,
                         workers=(workers or [0])[-1] or usable_cores()) as translator:
        ids = translator.src_tok.encode(lines)
        ids = [s[:translator.max_input_tokens] for s in ids]
        chunks = [[Sentence(i + j, s) for j, s in enumerate(ids[i:i + args.clients])]
                  for i in range(0, len(ids), args.clients)]
        pool = translator.stepper()
        n = pool.workers
        decode(pool, [[Sentence(("warm", w), [4])] for w in range(n)], search)
        start = time.perf_counter()
        decode(pool, chunks, search)
        return len(ids) / (time.perf_counter() - start)


def decode(pool, chunks: list[list[Sentence]], search: SearchConfig) -> None:
    """Each chunk sent whole to a worker that has answered all it was sent, until every
    sentence has come back."""
    left = [0] * pool.workers  # sentences each worker still has
    todo = iter(chunks)
    for w in range(pool.workers):
        if (chunk := next(todo, None)) is not None:
            pool.send(w, Batch(search, chunk, whole=True))
            left[w] = len(chunk)
    while any(left):
        message = pool.read(timeout=600)
        if isinstance(message, Failed):
            raise SystemExit(f"decoding failed: {message.error}")
        left[message.worker] -= len(message.results)
        if not left[message.worker] and (chunk := next(todo, None)) is not None:
            pool.send(message.worker, Batch(search, chunk, whole=True))
            left[message.worker] = len(chunk)


def launch(command: list[str]) -> tuple[subprocess.Popen, int]:
    """Run an nmt-serve command line given port=0 (its lines before it listens copied to
    stderr, the rest drained); the process and its port once it listens."""
    proc = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    for line in proc.stderr:
        if "listening on http://127.0.0.1:" in line:
            port = int(line.split("127.0.0.1:")[1].split()[0])
            threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()
            return proc, port
        print(line, end="", file=sys.stderr)
    raise SystemExit(f"{' '.join(command)} did not start")


def start_server(args) -> tuple[subprocess.Popen, int]:
    """nmt-serve on a free loopback port; returns the process and the port once it answers."""
    return launch([str(BIN / "nmt-serve"), f"checkpoint={args.checkpoint}", "port=0",
                   "access_log=false", *args.search, *args.serve])


class Load:
    """N client threads sending the lines one per request until done or out of time."""

    def __init__(self, port: int, lines: list[str], clients: int, seconds: float):
        self.port, self.lines, self.clients, self.seconds = port, lines, clients, seconds
        self.next = 0
        self.lock = threading.Lock()
        self.latencies: list[float] = []
        self.errors: list[str] = []
        self.results: dict[int, str] = {}

    def take(self) -> int | None:
        """The next line's index, or None when done or out of time."""
        with self.lock:
            if self.next >= len(self.lines) or time.perf_counter() > self.deadline:
                return None
            self.next += 1
            return self.next - 1

    def client(self) -> None:
        """One connection, one sentence per request."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        while (i := self.take()) is not None:
            body = json.dumps({"text": [self.lines[i]]}).encode()
            start = time.perf_counter()
            try:
                conn.request("POST", "/translate", body, {"Content-Type": "application/json"})
                response = conn.getresponse()
                data = response.read()
            except (OSError, http.client.HTTPException) as e:
                self.errors.append(f"line {i + 1}: {e!r}")
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
                continue
            if response.status != 200:
                self.errors.append(f"line {i + 1}: {response.status} {data[:200]!r}")
                continue
            with self.lock:
                self.latencies.append(time.perf_counter() - start)
                self.results[i] = json.loads(data)["translations"][0]["text"]
        conn.close()

    def run(self) -> float:
        """Run the clients; the seconds they took."""
        start = time.perf_counter()
        self.deadline = start + self.seconds
        threads = [threading.Thread(target=self.client) for _ in range(self.clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return time.perf_counter() - start


def cpu_seconds(pid: int) -> tuple[float, float]:
    """CPU seconds (user + system) of a process and of its live children (Linux /proc)."""
    def of(p: int) -> float:
        fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        return of(pid), sum(of(int(c)) for c in children)
    except OSError:
        return 0.0, 0.0


def get(port: int, path: str) -> dict:
    """GET a JSON document from the server."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", path)
    return json.loads(conn.getresponse().read())


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0-100) of values, in milliseconds."""
    return 1000 * statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


@dataclasses.dataclass
class Round:
    """One round's figures: nmt-serve's sentences/s, and as a % of nmt-translate's and of the
    ceiling's in the same round (None: not measured)."""

    rate: float
    of_translate: float | None
    of_ceiling: float | None


def main() -> None:
    """Measure nmt-translate, then nmt-serve under load, and print one summary line each; with
    --rounds N, N such rounds one after the other and the medians of their percentages (the
    machine's speed drifts between runs: a percentage within one round is the fair one)."""
    args = parse_args()
    lines = Path(args.input).read_text(encoding="utf-8").splitlines()
    lines = [line for line in lines if line.strip()][:args.lines or None]
    rounds = [one_round(args, lines) for _ in range(args.rounds)]
    if len(rounds) > 1:
        print(f"median of {len(rounds)} rounds: {statistics.median(r.rate for r in rounds):.1f}"
              " sentences/s" + "".join(
                  f"; {name} {statistics.median(got):.0f}% ({min(got):.0f}-{max(got):.0f}%)"
                  for name, got in (("of nmt-translate", [r.of_translate for r in rounds]),
                                    ("of the ceiling", [r.of_ceiling for r in rounds]))
                  if None not in got))


def one_round(args: argparse.Namespace, lines: list[str]) -> Round:
    """nmt-translate (unless --skip-translate), the ceiling (--ceiling), then nmt-serve under
    load, each with its summary line."""
    reference = rate = None
    if not args.skip_translate:
        rate, translate_cpu, reference = run_translate(args, lines)
        translate_cpu -= run_translate(args, lines[:1])[1]  # less start-up and model loading
        print(f"nmt-translate: {len(lines)} sentences, {rate:.1f} sentences/s, "
              f"{len(lines) / translate_cpu:.1f} sentences per CPU second "
              f"({' '.join(args.search) or 'default search'})", flush=True)
    ceiling = run_ceiling(args, lines) if args.ceiling else None
    if ceiling is not None:
        print(f"ceiling: {len(lines)} sentences in arrival order, batches of {args.clients}: "
              f"{ceiling:.1f} sentences/s"
              + (f"; {100 * ceiling / rate:.0f}% of nmt-translate" if reference is not None
                 else ""), flush=True)
    run = run_server(args, lines)
    load, seconds, stats = run.load, run.seconds, run.stats
    done = len(load.latencies)
    line = (f"nmt-serve: {args.clients} clients, {done} sentences in {seconds:.1f} s: "
            f"{done / seconds:.1f} sentences/s, latency p50 {percentile(load.latencies, 50):.0f} "
            f"p95 {percentile(load.latencies, 95):.0f} p99 {percentile(load.latencies, 99):.0f} "
            f"ms, {len(load.errors)} errors, mean batch {stats['mean_batch']:.1f} sentences "
            f"({stats['batches']} batches), exit status {run.status}")
    if reference is not None:
        differ = sum(load.results[i] != reference[i] for i in load.results)
        line += (f"; {100 * done / seconds / rate:.0f}% of nmt-translate, {differ} translations "
                 f"differ")
    if ceiling is not None:
        line += f"; {100 * done / seconds / ceiling:.0f}% of the ceiling"
    print(line, flush=True)
    server = run.server_cpu + run.worker_cpu
    per_cpu = done / server if server else 0.0
    print(f"  CPU seconds during the load: server (HTTP, batcher) {run.server_cpu:.1f}, decoding "
          f"workers {run.worker_cpu:.1f}, load client {run.client_cpu:.1f}; wall {seconds:.1f}; "
          f"{per_cpu:.1f} sentences per server CPU second"
          + (f" ({100 * per_cpu * translate_cpu / len(lines):.0f}% of nmt-translate's)"
             if reference is not None else ""), flush=True)
    for error in load.errors[:5]:
        print(f"  error: {error}")
    return Round(done / seconds, None if rate is None else 100 * done / seconds / rate,
                 None if ceiling is None else 100 * done / seconds / ceiling)


@dataclasses.dataclass
class ServerRun:
    """nmt-serve under the clients' load."""

    load: Load  # the clients' latencies, results and errors
    seconds: float  # the load's wall time
    stats: dict  # GET /stats after it
    status: int  # the server's exit status after SIGTERM
    server_cpu: float  # CPU seconds of the server process (HTTP, batcher) during the load
    worker_cpu: float  # ... of its decoding workers
    client_cpu: float  # ... of the load client (this process)


def run_server(args: argparse.Namespace, lines: list[str]) -> ServerRun:
    """nmt-serve on a free port under --clients concurrent clients, then stopped."""
    proc, port = start_server(args)
    try:
        get(port, "/health")
        load = Load(port, lines, args.clients, args.seconds)
        cpu_before, client_before = cpu_seconds(proc.pid), time.process_time()
        seconds = load.run()
        cpu_after, client = cpu_seconds(proc.pid), time.process_time() - client_before
        stats = get(port, "/stats")
    finally:
        proc.send_signal(signal.SIGTERM)
        status = proc.wait(timeout=120)
    if not load.latencies:
        raise SystemExit(f"no sentence translated; errors: {load.errors[:5]}")
    main_cpu, worker_cpu = (after - before for after, before in zip(cpu_after, cpu_before,
                                                                     strict=True))
    return ServerRun(load, seconds, stats, status, main_cpu, worker_cpu, client)


if __name__ == "__main__":
    main()
