"""Load test of a many-model nmt-serve (models=DIR) against one single-model server per pair.

Issue 61's goal: at 32 and 128 clients spread over 3 pairs, the many-model server's throughput
is >= 70% of the same requests sent to 3 single-model servers started with the same total
cores, and its p95 latency within 1.5x. Both setups run pinned to the same --cores cores
(taskset): the many-model server with --per-model workers per model (default: cores / pairs,
the single servers' share; cores: each model may use every core, the others idle), each
single server with cores / pairs workers. Each client sends LibreTranslate's JSON requests
({"q", "source", "target"}) of one pair (clients are dealt to the pairs in turn), one line a
request, the input's lines in order, until --seconds have passed or every client has sent
--lines lines. The setups run interleaved, --rounds times each; reported per setup and client
count: sentences/s, p50 and p95 latency, errors, the servers' CPU time a sentence (all their
processes, and their main processes alone: a many-model server's event loop serves every
pair; Linux's /proc), and how many translations differ between the setups (0 expected: the
same model and search).

    flock /tmp/nmt-cpu.lock .venv/bin/python scripts/bench_serve_models.py \\
        --models work/models --pairs en-de de-en en-fr --input scripts/data/debian-po/en-de/test.en

Timings need an idle machine (flock /tmp/nmt-cpu.lock, nothing else running).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from bench_serve import launch, percentile

from nmt.serve.models import discover, routes

BIN = Path(sys.executable).parent


def parse_args() -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", required=True, help="the folder nmt-serve models= serves")
    p.add_argument("--pairs", nargs="+", default=["en-de", "de-en", "en-fr"],
                   help="the pairs the clients ask for, each served by one model directly")
    p.add_argument("--input", required=True, help="source sentences, one a line (every pair)")
    p.add_argument("--clients", type=int, nargs="+", default=[32, 128])
    p.add_argument("--cores", type=int, default=3, help="cores both setups are pinned to")
    p.add_argument("--per-model", type=int, default=0,
                   help="the many-model server's workers per model (0: cores / pairs)")
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--lines", type=int, default=0, help="lines per client at most (0: all)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--search", nargs="*", default=["search.beam_size=4"],
                   help="search.* overrides of every server")
    return p.parse_args()


def start(overrides: list[str], cores: int) -> tuple[subprocess.Popen, int]:
    """nmt-serve pinned to the first `cores` cores on a free loopback port; the process and
    its port once it listens."""
    return launch(["taskset", "-c", f"0-{cores - 1}", str(BIN / "nmt-serve"), "port=0",
                   "access_log=false", *overrides])


class Load:
    """Clients, each on its own connection, sending one pair's lines one a request."""

    def __init__(self, ports: dict[str, int], lines: list[str], clients: int, seconds: float,
                 stagger: bool = False):
        self.ports, self.lines, self.clients, self.seconds = ports, lines, clients, seconds
        self.stagger = stagger  # each client starts at its own line (else all at the first)
        self.lock = threading.Lock()
        self.latencies: list[float] = []
        self.errors: list[str] = []
        self.results: dict[tuple[str, int], str] = {}  # (pair, line) -> translation

    def client(self, pair: str, first: int = 0) -> None:
        """One connection: the pair's requests, a line each from line `first` on (then from
        the start), until done or out of time."""
        source, target = pair.split("-")
        conn = http.client.HTTPConnection("127.0.0.1", self.ports[pair], timeout=300)
        for i in [*range(first, len(self.lines)), *range(first)]:
            if time.perf_counter() > self.deadline:
                break
            line = self.lines[i]
            body = json.dumps({"q": line, "source": source, "target": target}).encode()
            start = time.perf_counter()
            try:
                conn.request("POST", "/translate", body, {"Content-Type": "application/json"})
                response = conn.getresponse()
                data = response.read()
            except (OSError, http.client.HTTPException) as e:
                self.errors.append(f"{pair} line {i + 1}: {e!r}")
                conn = http.client.HTTPConnection("127.0.0.1", self.ports[pair], timeout=300)
                continue
            if response.status != 200:
                self.errors.append(f"{pair} line {i + 1}: {response.status} {data[:200]!r}")
                continue
            with self.lock:
                self.latencies.append(time.perf_counter() - start)
                self.results[pair, i] = json.loads(data)["translatedText"]
        conn.close()

    def run(self, pairs: list[str]) -> float:
        """The clients dealt to the pairs in turn; the seconds they took."""
        start = time.perf_counter()
        self.deadline = start + self.seconds
        threads = [threading.Thread(target=self.client, args=(
            pairs[c % len(pairs)], c * len(self.lines) // self.clients if self.stagger else 0))
                   for c in range(self.clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return time.perf_counter() - start


def pair_models(folder: str, pairs: list[str]) -> dict[str, list[str]]:
    """Each pair's single-model server (its overrides: the model in the folder, a bilingual
    one's pair, which it may not record); an error for a pair no model serves directly."""
    found = routes(discover(Path(folder)), pivot=False)
    out = {}
    for pair in pairs:
        route = found.get(tuple(pair.split("-")))
        if route is None:
            raise SystemExit(f"--pairs: no model of {folder} translates {pair} directly")
        entry, (src, tgt) = route.hops[0].entry, pair.split("-")
        if entry.kind == "ctranslate2":
            raise SystemExit(f"--pairs: {pair} is an nmt-export folder's, which a single-model "
                             f"server serves only beside its checkpoint: use the checkpoint")
        out[pair] = [f"checkpoint={entry.path}",
                     *([f"src_lang={src}", f"tgt_lang={tgt}"] if entry.bilingual else []),
                     *(["engine=ctranslate2", "search.alpha=0"] if entry.kind == "argos" else [])]
    return out


def setups(args) -> dict[str, list[list[str]]]:
    """Each setup's servers (their overrides): one many-model server; a server per pair."""
    share = max(1, args.cores // len(args.pairs))
    models = pair_models(args.models, args.pairs)
    return {"many": [[f"models={args.models}", f"workers={args.per_model or share}",
                      "preload=true", *args.search]],
            "singles": [[*models[p], f"workers={share}", *args.search]
                        for p in args.pairs]}


def cpu_seconds(pid: int) -> tuple[float, float]:
    """CPU seconds (user + system) of a process and its children (its decoding workers),
    and of the process alone."""
    def own(p: int) -> float:
        fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    tasks = Path(f"/proc/{pid}/task")
    children = [int(c) for t in tasks.iterdir() for c in (t / "children").read_text().split()]
    main = own(pid)
    return main + sum(own(c) for c in children), main


def run_setup(servers: list[list[str]], pairs: list[str], lines: list[str], clients: int,
              seconds: float, cores: int) -> Load:
    """Start the servers, run the load (its CPU time counted: load.cpu, load.main_cpu),
    stop them."""
    started = [start(s, cores) for s in servers]
    ports = ({p: started[0][1] for p in pairs} if len(started) == 1
             else {p: port for p, (_, port) in zip(pairs, started, strict=True)})
    load = Load(ports, lines, clients, seconds)
    before = [cpu_seconds(proc.pid) for proc, _ in started]
    load.took = load.run(pairs)
    after = [cpu_seconds(proc.pid) for proc, _ in started]
    load.cpu, load.main_cpu = (sum(a[i] - b[i] for a, b in zip(after, before, strict=True))
                               for i in (0, 1))
    for proc, _ in started:
        proc.terminate()
        proc.wait(timeout=60)
    return load


def per_sentence(cpu: float, load: Load) -> float:
    """CPU seconds as milliseconds a translated sentence of the load."""
    return 1000 * cpu / max(1, len(load.latencies))


def main() -> None:
    """Interleave the setups; print a line per setup and client count."""
    args = parse_args()
    lines = Path(args.input).read_text(encoding="utf-8").splitlines()
    lines = lines[:args.lines] if args.lines else lines
    made = setups(args)
    for clients in args.clients:
        rates: dict[str, list[float]] = {name: [] for name in made}
        loads: dict[str, Load] = {}
        for _ in range(args.rounds):
            for name, servers in made.items():
                load = run_setup(servers, args.pairs, lines, clients, args.seconds, args.cores)
                rates[name].append(len(load.latencies) / load.took)
                loads[name] = load
        for name, load in loads.items():
            p50, p95 = (percentile(load.latencies, q) for q in (50, 95)) if len(
                load.latencies) > 1 else (0.0, 0.0)
            print(f"{clients} clients, {name}: {statistics.median(rates[name]):.1f} "
                  f"sentences/s (rounds: {', '.join(f'{r:.1f}' for r in rates[name])}), "
                  f"p50 {p50:.0f} ms, p95 {p95:.0f} ms, {len(load.errors)} errors; CPU a "
                  f"sentence {per_sentence(load.cpu, load):.1f} ms (main processes "
                  f"{per_sentence(load.main_cpu, load):.1f})")
        many, singles = loads["many"].results, loads["singles"].results
        differ = sum(many[k] != singles[k] for k in many.keys() & singles.keys())
        print(f"{clients} clients: many / singles throughput "
              f"{statistics.median(rates['many']) / statistics.median(rates['singles']):.2f}; "
              f"{differ} of {len(many.keys() & singles.keys())} translations differ")


if __name__ == "__main__":
    main()
