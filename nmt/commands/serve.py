"""nmt-serve: a checkpoint behind an HTTP endpoint (nmt.serve.app) until SIGTERM: the
translator loaded and its decoding workers started and warmed up once, the socket opened,
uvicorn run; SIGTERM answers the requests in flight, then exits with status 0."""

from __future__ import annotations

import logging
import queue
import signal
import socket
from functools import partial
from urllib.parse import unquote_plus

import torch
from fastapi import FastAPI

from nmt.config import SearchConfig, ServeConfig
from nmt.decoding.messages import Batch, Failed, Sentence
from nmt.engines.engine import Workers, check_vocab
from nmt.errors import NmtError
from nmt.inference.engines import open_translator
from nmt.serve.app import create_app
from nmt.serve.many import create_models_app
from nmt.serve.models import (
    ModelEntry,
    Registry,
    budget_line,
    discover,
    model_config,
    models_folder,
)
from nmt.serve.offline import check_offline
from nmt.serve.service import Service, log
from nmt.system.preemption import restore_handler
from nmt.system.runtime import cap_onednn_cache, keep_freed_memory, pick_device, usable_cores
from nmt.wings.libretranslate.api import KEY_FIELDS


def open_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket; a taken port or an unknown host is a one-line error."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        family, _, _, _, address = infos[0]
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)
    except OSError as e:
        raise NmtError(f"host={host} port={port}: cannot listen "
                       f"({e.strerror or e})") from None
    sock.set_inheritable(True)
    return sock


def socket_url(sock: socket.socket) -> str:
    """The URL a listening socket answers at (an IPv6 host in brackets)."""
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def serve(cfg: ServeConfig) -> None:
    """nmt-serve: load the checkpoint once, start the decoding workers, serve until SIGTERM
    (models=DIR: serve_models)."""
    if cfg.offline:  # the page's folder, checked before the model loads
        check_offline(cfg.offline)
    device, workers = devices(cfg)
    if cfg.models:
        return serve_models(cfg, device, workers)
    # Prepared for search.dtype here, then the workers forked: before any socket or thread.
    translator = open_translator(cfg.engine, [cfg.checkpoint], device, dtype=cfg.search.dtype,
                                 workers=workers, threads=cfg.threads, ct2_model=cfg.ct2_model,
                                 shortlist=cfg.search.shortlist, compile=cfg.search.compile)
    try:
        if cfg.vocab_check:
            check_vocab(translator, cfg.vocab_check, cfg.checkpoint)
        translator.ready(cfg.search)
        warm_up(translator.stepper(), cfg.search.dtype, cfg.search.compile)
    except NmtError:
        translator.close()
        raise
    # uvicorn stops gracefully on SIGTERM, then raises it again to end the process: a handler
    # that only notes it (until the workers are stopped too) makes that end with status 0.
    stop = []
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    try:
        with open_socket(cfg.host, cfg.port) as sock:
            service = Service(translator, cfg)
            url = socket_url(sock)
            n = service.workers
            if not service.libre.sources:
                log(f"{cfg.checkpoint} records no languages: LibreTranslate's API answers 400 "
                    f"until nmt-serve is started with src_lang=... tgt_lang=...")
            kind = "process" if service.stepper.processes else "thread"
            kind = {"process": "processes", "thread": "threads"}[kind] if n > 1 else kind
            log(f"{cfg.checkpoint} on {device} ({n} decoding {kind}, "
                f"{'continuous' if cfg.continuous else 'dynamic'} batching, split="
                f"{service.split}); listening on {url} "
                f"(API: {url}/docs)")
            if not stop:
                run_until_stopped(create_app(service), sock, cfg)
        s = service.batcher.stats
        log(f"stopped: {service.requests} requests, {s.sentences} sentences in {s.batches} "
            f"batches")
    finally:
        translator.close()
        restore_handler(signal.SIGTERM, previous)


def devices(cfg: ServeConfig) -> tuple[torch.device, int]:
    """The device and the decoding workers (of each model), the CPU's memory and oneDNN's
    caches set up first."""
    device = pick_device(cfg.device)
    workers = (cfg.workers or usable_cores()) if device.type == "cpu" else 1
    if device.type == "cpu":
        keep_freed_memory()
        cap_onednn_cache()  # before the model's first product: the workers inherit the caps
    return device, workers


def serve_models(cfg: ServeConfig, device: torch.device, workers: int) -> None:
    """nmt-serve models=DIR: every model of the folder (nmt.serve.models), loaded at start
    (preload=true) or on first use, served until SIGTERM."""
    folder = models_folder(cfg.models)
    entries = discover(folder)
    log(budget_line(entries, cfg))
    registry = Registry(entries, cfg, partial(open_service, cfg=cfg, device=device,
                                              workers=workers))
    stop = []
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    try:
        if cfg.preload:
            registry.preload()
        with open_socket(cfg.host, cfg.port) as sock:
            url = socket_url(sock)
            pairs = registry.pairs
            log(f"{folder}: {len(pairs.routes)} pairs ({len(pairs.pivots())} through "
                f"English) on {device}, {len(registry.loaded)} models loaded; listening on "
                f"{url} (API: {url}/docs)")
            if not stop:
                run_until_stopped(create_models_app(registry, str(device)), sock, cfg)
        log(f"stopped: {registry.loads} model loads")
    finally:
        registry.close()
        restore_handler(signal.SIGTERM, previous)


def open_service(entry: ModelEntry, cfg: ServeConfig, device: torch.device,
                 workers: int) -> Service:
    """One model of a many-model server, its workers started and warmed up, as a Service.
    On the CPU even one worker is a forked process (a thread of this process would share its
    interpreter lock with the event loop and every other model's loop: issue 61)."""
    engine = cfg.engine if entry.kind == "nmt" else "ctranslate2"  # an export, a package
    translator = open_translator(engine, [str(entry.path)], device, dtype=cfg.search.dtype,
                                 workers=workers, threads=cfg.threads, compile=cfg.search.compile,
                                 fork=True)
    try:
        translator.ready(cfg.search)
        warm_up(translator.stepper(), cfg.search.dtype, cfg.search.compile)
        return Service(translator, model_config(cfg, entry))
    except NmtError:
        translator.close()
        raise


def warm_up(pool: Workers, dtype: str, compile: str = "auto") -> None:
    """Decode one short sentence on every worker (a process's first steps are slower; with
    search.compile=true two, which compiles the step of several rows); NmtError if a worker
    fails or does not answer within a minute (ten with search.compile=true)."""
    compiles = compile == "true"  # torch.compile in each worker
    warm = SearchConfig(beam_size=1, max_len_b=1, dtype=dtype, compile=compile)
    for w in range(pool.workers):
        sentences = [Sentence(("warm", w, i), [4]) for i in range(1 + compiles)]
        pool.send(w, Batch(warm, sentences, whole=True))
    seconds, within = (600, "ten minutes") if compiles else (60, "a minute")
    for _ in range(pool.workers):
        try:
            message = pool.read(timeout=seconds)
        except queue.Empty:
            raise NmtError(f"a decoding worker did not start within {within}") from None
        if isinstance(message, Failed):
            raise NmtError(f"a decoding worker failed while starting ({message.error!r})")


def run_until_stopped(app: FastAPI, sock: socket.socket, cfg: ServeConfig) -> None:
    """uvicorn on a listening socket until SIGTERM or Ctrl-C; in-flight requests are answered
    first (for at most timeout_s + 5 seconds)."""
    import uvicorn

    config = uvicorn.Config(app, log_level=cfg.log_level, access_log=cfg.access_log,
                            timeout_graceful_shutdown=int(cfg.timeout_s) + 5)
    logging.getLogger("uvicorn.access").addFilter(RedactKeys())  # after Config set logging up
    uvicorn.Server(config).run(sockets=[sock])


class RedactKeys(logging.Filter):
    """uvicorn's access log lines with every API key in a query string (deep-translator sends
    LibreTranslate's api_key there) written as ***."""

    def filter(self, record: logging.LogRecord) -> bool:
        """The line, its path redacted (uvicorn's args: client, method, path, version,
        status)."""
        if isinstance(record.args, tuple) and len(record.args) == 5:
            client, method, path, version, status = record.args
            record.args = (client, method, redact_query(str(path)), version, status)
        return True


def redact_query(path: str) -> str:
    """A request's path and query with the value of each api_key or apiKey field (its name as
    the server decodes it: api%5Fkey too) written as ***."""
    path, mark, query = path.partition("?")
    fields = [f"{name}=***" if unquote_plus(name) in KEY_FIELDS and sep else f"{name}{sep}{value}"
              for name, sep, value in (part.partition("=") for part in query.split("&"))]
    return path + mark + "&".join(fields) if mark else path
