"""Load test of nmt-serve against LibreTranslate's own request path, the same models (issue 61).

Issue 61's goal: with the same models, nmt-serve >= 3x the throughput of LibreTranslate at 32
clients, interleaved, one machine, the same beam. LibreTranslate is a peer, installed in a
venv of its own (never the repository's):

    python3.11 -m venv LT_VENV && LT_VENV/bin/pip install libretranslate

1. Each pair's checkpoint in --models (e.g. en-de.pt, de-en.pt, en-fr.pt) is exported by
   nmt-export (format=ctranslate2, int8 weights with --dtype int8, as Argos packages ship) and
   laid out as an installed Argos package under WORK/packages (metadata.json, model/,
   sentencepiece.model: a joint vocabulary's SentencePiece model, as argostranslate reads it).
2. Three setups, each pinned to cores 0..--cores-1 (taskset), run interleaved, --rounds times:
   - libretranslate: LibreTranslate (waitress, --threads) with ARGOS_PACKAGES_DIR=WORK/packages
     under a private HOME/XDG_*; with two or more packages installed and no --update-models it
     fetches no package index. argostranslate's sentence splitter (MiniSBD) downloads its ONNX
     model on first use, so here it is replaced by one that returns the text whole (each
     request is one sentence); everything else is LibreTranslate's own code.
     ARGOS_BEAM_SIZE=--beam, ARGOS_COMPUTE_TYPE from --dtype; CTranslate2 as argostranslate
     sets it (inter_threads=1, intra_threads=0). argostranslate's INFO lines of every request
     (printed by default: waitress calls logging.basicConfig()) are silenced unless
     --lt-logging; --lt-env sets more of its environment (e.g. ARGOS_INTRA_THREADS=2, where
     CTranslate2's default of 4 threads oversubscribes 2 cores);
   - nmt-ct2: nmt-serve models=WORK/packages (the same CTranslate2 models, engine=ctranslate2);
   - nmt: nmt-serve models=--models (the checkpoints, nmt's own engine).
   nmt-serve runs with search.beam_size=--beam, search.alpha=0, split=none, search.dtype from
   --dtype, workers= cores / pairs per model, preload=true, plus --serve overrides.
3. Each round: one request per pair first (loads LibreTranslate's lazily created models), then
   --clients clients (dealt to the pairs in turn, each on its own connection, each starting at
   its own line so that argostranslate's cache of the last paragraph does not answer) send
   LibreTranslate's JSON {"q", "source", "target"}, one line a request, until --seconds pass.
   Reported per setup and client count: sentences/s (median of the rounds), p50/p95 latency,
   errors; each nmt setup's throughput over LibreTranslate's; how many translations differ
   (nmt-ct2 against nmt: a few at most in fp32, near-ties summed by two engines, more in int8,
   two engines' kernels; LibreTranslate against nmt-ct2: more, since its length penalty 0.2
   and its "_" -> " " and replace_unknowns are not nmt's).

    flock /tmp/nmt-cpu.lock .venv/bin/python scripts/bench_vs_libretranslate.py \\
        --lt-python LT_VENV/bin/python --models MODELS --input SOURCES \\
        --work work/bench_vs_lt --cores 2

Timings need an idle machine (flock /tmp/nmt-cpu.lock, nothing else running).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from bench_serve import percentile
from bench_serve_models import BIN, Load, start

from nmt.checkpoint import Checkpoint
from nmt.serve.models import discover, routes

SETUPS = ("libretranslate", "nmt-ct2", "nmt")
COMPUTE_TYPES = {"int8": "int8", "fp32": "float32"}  # --dtype -> CTranslate2's compute_type
# LibreTranslate's main() with argostranslate's MiniSBD splitter (which downloads its model on
# first use) replaced by one that keeps the text whole; its command-line options follow.
LAUNCH = ("import sys; from argostranslate import sbd; "
          "sbd.MiniSBDSentencizer.split_sentences = lambda self, text: [text]; "
          "from libretranslate.main import main; sys.exit(main())")
# argostranslate logs each request's sentences, pieces and hypotheses at INFO, which waitress's
# logging.basicConfig() prints: silenced unless --lt-logging.
QUIET = ("import logging, argostranslate.utils; "
         "argostranslate.utils.logger.setLevel(logging.WARNING); ")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lt-python", required=True,
                   help="the Python of the venv LibreTranslate is installed in")
    p.add_argument("--models", required=True, help="a folder of nmt checkpoints, one a pair")
    p.add_argument("--pairs", nargs="+", default=["en-de", "de-en", "en-fr"])
    p.add_argument("--input", required=True, help="source sentences, one a line (every pair)")
    p.add_argument("--work", required=True, help="where the packages and logs are written")
    p.add_argument("--clients", type=int, nargs="+", default=[32, 128])
    p.add_argument("--cores", type=int, default=2, help="cores every setup is pinned to")
    p.add_argument("--beam", type=int, default=4, help="both sides' beam size")
    p.add_argument("--dtype", choices=sorted(COMPUTE_TYPES), default="int8")
    p.add_argument("--lt-threads", type=int, default=4,
                   help="LibreTranslate's --threads (waitress; its default 4)")
    p.add_argument("--lt-logging", action="store_true",
                   help="keep argostranslate's INFO lines of every request (its default)")
    p.add_argument("--lt-env", nargs="*", default=[], metavar="KEY=VALUE",
                   help="further settings of LibreTranslate's (e.g. ARGOS_INTRA_THREADS=2)")
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--lines", type=int, default=0, help="use the first N lines (0: all)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--serve", nargs="*", default=[], help="further overrides of both nmt-serves")
    return p.parse_args(argv)


# ----------------------------------------------------------------------------- the packages
def checkpoints(folder: str, pairs: list[str]) -> dict[str, Path]:
    """Each pair's nmt checkpoint in `folder` (one that translates it directly), each of one
    SentencePiece model for both sides, as argostranslate tokenizes (its sentencepiece.model
    splits the source and joins the output)."""
    found = routes(discover(Path(folder)), pivot=False)
    out = {}
    for pair in pairs:
        route = found.get(tuple(pair.split("-")))
        if route is None or route.hops[0].entry.kind != "nmt":
            raise SystemExit(f"--pairs: no nmt checkpoint of {folder} translates {pair}")
        path = out[pair] = route.hops[0].entry.path
        vocab = Checkpoint.load(path, mmap=True).vocab
        if vocab.src_spm != vocab.tgt_spm or vocab.src_split is not None:
            raise SystemExit(f"{path}: not one SentencePiece model for both sides, which an "
                             f"Argos package needs (one sentencepiece.model)")
    return out


def build_package(checkpoint: Path, pair: str, quantization: str, work: Path) -> Path:
    """The checkpoint (one of checkpoints()) as an installed Argos package,
    WORK/packages/translate-SRC_TGT-1_0: nmt-export's CTranslate2 model as model/, its
    SentencePiece model, metadata.json."""
    src, tgt = pair.split("-")
    export = work / "exports" / pair
    subprocess.run([str(BIN / "nmt-export"), f"checkpoint={checkpoint}", f"output={export}",
                    "format=ctranslate2", f"quantization={quantization}", "force=true"],
                   check=True, stdout=subprocess.DEVNULL)
    package = work / "packages" / f"translate-{src}_{tgt}-1_0"
    shutil.rmtree(package, ignore_errors=True)
    shutil.copytree(export, package / "model", ignore=shutil.ignore_patterns(
        "nmt.json", "*.spm", ".*"))
    (package / "sentencepiece.model").write_bytes((export / "source.spm").read_bytes())
    meta = {"package_version": "1.0", "argos_version": "1.0", "type": "translate",
            "from_code": src, "from_name": src, "to_code": tgt, "to_name": tgt}
    (package / "metadata.json").write_text(json.dumps(meta, indent=1) + "\n", encoding="utf-8")
    return package


def build_packages(args) -> Path:
    """Every pair's package, in a fresh WORK/packages; that folder."""
    work = Path(args.work).resolve()
    shutil.rmtree(work / "packages", ignore_errors=True)
    quantization = "" if args.dtype == "fp32" else args.dtype
    for pair, checkpoint in checkpoints(args.models, args.pairs).items():
        print(f"package of {pair}: {build_package(checkpoint, pair, quantization, work)}",
              file=sys.stderr)
    return work / "packages"


# ----------------------------------------------------------------------------- the servers
def free_port() -> int:
    """A loopback port free now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def libretranslate_env(args, packages: Path) -> dict[str, str]:
    """LibreTranslate's environment: argostranslate's folders private to WORK, its packages
    WORK/packages, the beam and compute type."""
    home = Path(args.work).resolve() / "lt-home"
    if any("=" not in kv for kv in args.lt_env):
        raise SystemExit(f"--lt-env: KEY=VALUE pairs, got {' '.join(args.lt_env)}")
    return {**os.environ, "HOME": str(home), "XDG_DATA_HOME": str(home / "data"),
            "XDG_CONFIG_HOME": str(home / "config"), "XDG_CACHE_HOME": str(home / "cache"),
            "ARGOS_PACKAGES_DIR": str(packages), "ARGOS_DEVICE_TYPE": "cpu",
            "ARGOS_BEAM_SIZE": str(args.beam), "ARGOS_COMPUTE_TYPE": COMPUTE_TYPES[args.dtype],
            **dict(kv.split("=", 1) for kv in args.lt_env)}


def start_libretranslate(args, packages: Path) -> tuple[subprocess.Popen, int]:
    """LibreTranslate pinned to the cores on a free loopback port (its output appended to
    WORK/libretranslate.log); the process and its port once /languages answers."""
    port = free_port()
    launch = LAUNCH if args.lt_logging else QUIET + LAUNCH
    command = ["taskset", "-c", f"0-{args.cores - 1}", args.lt_python, "-c", launch,
               "--host", "127.0.0.1", "--port", str(port), "--threads", str(args.lt_threads),
               "--disable-web-ui", "--disable-files-translation"]
    with open(Path(args.work) / "libretranslate.log", "a", encoding="utf-8") as log:
        proc = subprocess.Popen(command, env=libretranslate_env(args, packages), stdout=log,
                                stderr=subprocess.STDOUT)
    deadline = time.perf_counter() + 300
    while proc.poll() is None and time.perf_counter() < deadline:
        if answers(port):
            return proc, port
        time.sleep(0.5)
    proc.kill()
    raise SystemExit(f"LibreTranslate did not start: see {args.work}/libretranslate.log")


def answers(port: int) -> bool:
    """Whether a server on the loopback port answers GET /languages."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", "/languages")
        return conn.getresponse().status == 200
    except (OSError, http.client.HTTPException):
        return False
    finally:
        conn.close()


def starters(args, packages: Path) -> dict[str, Callable[[], tuple[subprocess.Popen, int]]]:
    """Each setup's start: the process and its port once it answers."""
    share = max(1, args.cores // len(args.pairs))
    serve = [f"workers={share}", "preload=true", "split=none", f"search.beam_size={args.beam}",
             "search.alpha=0", f"search.dtype={args.dtype}", *args.serve]
    return {"libretranslate": lambda: start_libretranslate(args, packages),
            "nmt-ct2": lambda: start([f"models={packages}", *serve], args.cores),
            "nmt": lambda: start([f"models={args.models}", *serve], args.cores)}


def run_setup(begin: Callable[[], tuple[subprocess.Popen, int]], pairs: list[str],
              lines: list[str], clients: int, seconds: float) -> Load:
    """Start the server, send one request per pair, run the load, stop the server."""
    proc, port = begin()
    ports = dict.fromkeys(pairs, port)
    try:
        Load(ports, lines[:1], len(pairs), seconds).run(pairs)
        load = Load(ports, lines, clients, seconds, stagger=True)
        load.took = load.run(pairs)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    return load


def differ(a: Load, b: Load) -> str:
    """How many of the translations both loads got differ."""
    both = a.results.keys() & b.results.keys()
    return f"{sum(a.results[k] != b.results[k] for k in both)} of {len(both)}"


def report(clients: int, rates: dict[str, list[float]], loads: dict[str, Load]) -> None:
    """A line per setup, then the ratios and differing translations."""
    for name, load in loads.items():
        p50, p95 = (percentile(load.latencies, q) for q in (50, 95)) if len(
            load.latencies) > 1 else (0.0, 0.0)
        print(f"{clients} clients, {name}: {statistics.median(rates[name]):.1f} sentences/s "
              f"(rounds: {', '.join(f'{r:.1f}' for r in rates[name])}), p50 {p50:.0f} ms, "
              f"p95 {p95:.0f} ms, {len(load.errors)} errors", flush=True)
        for error in load.errors[:3]:
            print(f"  {error}")
    lt = statistics.median(rates["libretranslate"]) or float("nan")
    print(f"{clients} clients: nmt-ct2 / libretranslate "
          f"{statistics.median(rates['nmt-ct2']) / lt:.2f}x, nmt / libretranslate "
          f"{statistics.median(rates['nmt']) / lt:.2f}x; translations differing: nmt-ct2 vs "
          f"nmt {differ(loads['nmt-ct2'], loads['nmt'])}, libretranslate vs nmt-ct2 "
          f"{differ(loads['libretranslate'], loads['nmt-ct2'])}", flush=True)


def main(argv: list[str] | None = None) -> None:
    """Build the packages, interleave the setups; print a line per setup and client count."""
    args = parse_args(argv)
    lines = Path(args.input).read_text(encoding="utf-8").splitlines()
    lines = lines[:args.lines] if args.lines else lines
    Path(args.work).mkdir(parents=True, exist_ok=True)
    made = starters(args, build_packages(args))
    for clients in args.clients:
        rates: dict[str, list[float]] = {name: [] for name in SETUPS}
        loads: dict[str, Load] = {}
        for _ in range(args.rounds):
            for name in SETUPS:
                loads[name] = run_setup(made[name], args.pairs, lines, clients, args.seconds)
                rates[name].append(len(loads[name].latencies) / loads[name].took)
        report(clients, rates, loads)


if __name__ == "__main__":
    main()
