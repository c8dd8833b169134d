"""nmt-serve models=DIR: every model in a folder behind one server, as LibreTranslate serves
every installed pair.

Discovery (one level deep, in name order): nmt checkpoints (*.pt: bilingual, by the pair their
vocabulary records or else a name ending in SRC-TGT, e.g. en-de.pt; or multilingual, by the
languages it records: nmt.data.languages), nmt-export CTranslate2 folders (nmt.json) and Argos
Translate packages (nmt.wings.interop.argos: a folder with metadata.json and model/, or a
.argosmodel zip; one that cannot be served, e.g. a BPE package, is skipped, said in one line).
Anything else there is ignored; a folder without a model, an nmt model that cannot be read, or
two models of the same kind (bilingual, multilingual) that translate the same pair are one-line
errors. A bilingual model wins a pair over a multilingual one.

Routing: each pair (src, tgt) goes to the model that covers it; with pivot=true, a pair that
none covers, whose sides both pair with English, goes through English: two hops, each queued
as its own request in its model's batches.

Memory: a model is loaded on its first request (preload=true: at start), each with its own
decoding workers and Batcher (nmt.serve.batcher), so that each model's requests batch
together; max_models and memory_gb (the loaded models' size on disk) bound what is loaded at
once: a load evicts the least recently used model that has no request in flight (waiting for
one to finish where all are busy), and closes its workers.
"""

from __future__ import annotations

import asyncio
import os
import re
from collections import Counter, OrderedDict
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from nmt.checkpoint import Checkpoint
from nmt.config import ServeConfig
from nmt.data.languages import recorded_pair
from nmt.data.vocab import Vocab
from nmt.errors import ApiError, NmtError
from nmt.serve.schemas import TranslateRequest, TranslateResponse
from nmt.serve.service import Service, log
from nmt.wings.interop.ct2_export import INFO, read_info
from nmt.wings.libretranslate.api import NAMES, Languages, LibreError

PIVOT = "en"  # the language a pair that no model covers goes through
ARGOS = "argos"  # models=argos: argostranslate's own package folder
PAIR_NAME = re.compile(r"(?:^|.*[^a-z])([a-z]{2,3})[-_]([a-z]{2,3})$")  # ...en-de, en_de


@dataclass(frozen=True)
class ModelEntry:
    """A model found in the folder: where, what kind, which languages, its size on disk."""

    path: Path
    kind: str  # "nmt" (a checkpoint), "ctranslate2" (an nmt-export folder) or "argos"
    languages: Languages  # what it translates (a bilingual model's one pair)
    size: int  # bytes on disk (what memory_gb counts)

    @property
    def pairs(self) -> list[tuple[str, str]]:
        """The (source, target) pairs it translates."""
        return [(s, t) for s in self.languages.sources for t in self.languages.targets if s != t]

    @property
    def bilingual(self) -> bool:
        """One pair, no language token."""
        return not self.languages.multilingual


def argos_folder() -> Path:
    """argostranslate's own package folder: $XDG_DATA_HOME (else ~/.local/share)
    /argos-translate/packages."""
    data = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(data) / "argos-translate" / "packages"


def models_folder(value: str) -> Path:
    """models=: a folder, or `argos` for argostranslate's own."""
    return argos_folder() if value == ARGOS else Path(value)


def discover(folder: Path) -> list[ModelEntry]:
    """Every model in `folder` (one level deep, in name order); a one-line NmtError for a
    folder that is missing or holds no model, or a model that cannot be read."""
    if not folder.is_dir():
        raise NmtError(f"models={folder}: not a folder")
    entries = [e for path in sorted(folder.iterdir()) if (e := read_entry(path)) is not None]
    if not entries:
        raise NmtError(f"models={folder}: no model in it (nmt checkpoints *.pt, nmt-export "
                       f"folders with {INFO}, Argos packages)")
    return entries


def read_entry(path: Path) -> ModelEntry | None:
    """The model at `path`, None for anything that is not one; an Argos package that cannot
    be served (a BPE one, a broken one) is skipped, said in one line (its error)."""
    if path.suffix == ".pt" and path.is_file():
        return _checkpoint_entry(path)
    if path.is_dir() and (path / INFO).is_file():
        return _export_entry(path)
    argos = _argos()
    if argos is not None and argos.is_package(path):
        return _argos_entry(path, argos)
    return None


def _checkpoint_entry(path: Path) -> ModelEntry:
    """An nmt checkpoint's entry, from the vocabulary it records (its weights not read)."""
    vocab = Checkpoint.load(path, mmap=True).vocab
    return ModelEntry(path, "nmt", _languages(vocab, path), path.stat().st_size)


def _export_entry(path: Path) -> ModelEntry:
    """An nmt-export CTranslate2 folder's entry, from its nmt.json's vocabulary."""
    info = read_info(path)
    if not isinstance(info, dict) or not isinstance(info.get("vocab"), dict):
        raise NmtError(f"{path / INFO}: not readable (not the JSON nmt-export writes)")
    vocab = Vocab.from_dict(info["vocab"], str(path / INFO), protos=False)
    return ModelEntry(path, "ctranslate2", _languages(vocab, path), _size(path))


def _argos_entry(path: Path, argos) -> ModelEntry | None:
    """An Argos package's entry: its metadata's from_code and to_code (None: it cannot be
    served, said in one line)."""
    try:
        package = argos.read_package(path)
    except NmtError as e:
        log(f"skipped: {e}")
        return None
    pair = Languages.of(None, package.from_code, package.to_code)
    return ModelEntry(path, "argos", pair, _size(path))


def _argos():
    """nmt.wings.interop.argos (Argos packages), or None in a tree without it."""
    try:
        from nmt.wings.interop import argos
    except ImportError:
        return None
    return argos


def _languages(vocab: Vocab, path: Path) -> Languages:
    """What a model translates: a multilingual one's recorded languages (a tag model that
    records no source, as a one-to-many OPUS-MT import: the source its name gives,
    opus-mt-en-mul.pt); a bilingual one's recorded pair, else the pair its name ends with
    (en-de.pt); else a one-line NmtError."""
    named = PAIR_NAME.fullmatch(path.stem if path.is_file() else path.name)
    entry = vocab.languages
    if entry is not None and (entry.forced or entry.sources):
        return Languages.of(entry, "", "")
    if entry is not None:
        if named is None:
            raise NmtError(f"{path}: a multilingual model that records no source language; "
                           f"name it after it, e.g. en-mul{path.suffix}")
        return Languages.of(entry, named.group(1), "")
    pair = recorded_pair(vocab)
    src, tgt = pair.src_lang, pair.tgt_lang
    if not (src and tgt) and named:
        src, tgt = named.groups()
    if not (src and tgt):
        raise NmtError(f"{path}: records no language pair; name it after its pair, e.g. "
                       f"en-de{path.suffix}")
    return Languages.of(None, src, tgt)


def _size(path: Path) -> int:
    """A file's size, or a folder's files' together."""
    if path.is_file():
        return path.stat().st_size
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


# ----------------------------------------------------------------------------- routing
@dataclass(frozen=True)
class Hop:
    """One model's step of a route: from source into target."""

    entry: ModelEntry
    source: str
    target: str

    def request(self, req: TranslateRequest) -> TranslateRequest:
        """The request as this hop's model takes it: its languages as the model is told
        them (none for a bilingual one)."""
        told = self.entry.languages.fields(self.source, self.target)
        return req.model_copy(update={"src_lang": None, "tgt_lang": None, **told})


@dataclass(frozen=True)
class Route:
    """How a pair is translated: one hop, or two through the pivot language."""

    hops: tuple[Hop, ...]

    @property
    def pivot(self) -> str:
        """The language the texts go through ("": none, one model translates the pair)."""
        return self.hops[0].target if len(self.hops) > 1 else ""


def routes(entries: list[ModelEntry], pivot: bool) -> dict[tuple[str, str], Route]:
    """Each pair's route: its model's (a bilingual one before a multilingual one; two of the
    same kind for one pair are a one-line NmtError naming both), then, with pivot, the pairs
    that go through English."""
    direct: dict[tuple[str, str], ModelEntry] = {}
    for entry in entries:
        for pair in entry.pairs:
            other = direct.get(pair)
            if other is not None and other.bilingual == entry.bilingual:
                raise NmtError(f"{other.path} and {entry.path} both translate {pair[0]} into "
                               f"{pair[1]}: keep one of them in the folder")
            if other is None or entry.bilingual:
                direct[pair] = entry
    found = {pair: Route((Hop(e, *pair),)) for pair, e in direct.items()}
    if pivot:
        into = {t for _, t in direct}
        for src in {s for s, _ in direct}:
            for tgt in into:
                first, second = direct.get((src, PIVOT)), direct.get((PIVOT, tgt))
                if src != tgt and (src, tgt) not in found and first and second:
                    found[src, tgt] = Route((Hop(first, src, PIVOT), Hop(second, PIVOT, tgt)))
    return found


@dataclass(frozen=True)
class Pairs:
    """What LibreTranslate's API offers of a many-model server (nmt.wings.libretranslate.api's
    Offer, as one model's Languages): every routed pair, each source with its own targets;
    a request names both languages (nmt's src_lang and tgt_lang)."""

    routes: dict[tuple[str, str], Route]

    @property
    def sources(self) -> tuple[str, ...]:
        """Every language some pair translates from."""
        return tuple(sorted({s for s, _ in self.routes}))

    @property
    def targets(self) -> tuple[str, ...]:
        """Every language some pair translates into."""
        return tuple(sorted({t for _, t in self.routes}))

    @property
    def all(self) -> tuple[str, ...]:
        """What /detect and source=auto choose among: the installed sources."""
        return self.sources

    def require(self) -> None:
        """A many-model server always knows its languages."""

    def reachable(self, source: str) -> list[str]:
        """The targets `source` translates into."""
        return sorted(t for s, t in self.routes if s == source)

    def listing(self) -> list[dict]:
        """GET /languages: every language, with the targets each source reaches."""
        codes = sorted(set(self.sources) | set(self.targets))
        return [{"code": c, "name": NAMES.get(c, c), "targets": self.reachable(c)}
                for c in codes]

    def pivots(self) -> dict[str, str]:
        """"src-tgt" -> the language it goes through, for each pair that pivots."""
        return {f"{s}-{t}": r.pivot for (s, t), r in sorted(self.routes.items()) if r.pivot}

    def fields(self, source: str, target: str) -> dict:
        """nmt's request fields of the pair; a LibreError where no route serves it."""
        if (source, target) not in self.routes:
            into = self.reachable(source)
            offered = (f"from {source}: into {', '.join(into)}" if into else
                       f"it translates from {', '.join(self.sources)}")
            raise LibreError(400, f"{source} into {target} is not supported (this server "
                                  f"translates {offered})")
        return {"src_lang": source, "tgt_lang": target}


# ----------------------------------------------------------------------------- the registry
@dataclass
class Loaded:
    """A loaded model: its Service and the task that runs its Batcher."""

    service: Service
    task: asyncio.Task | None = None


class Registry:
    """The models of a many-model server: the routes, the loaded models (least recently used
    first) and what each has in flight. open_service(entry) loads one (blocking: run in a
    thread)."""

    def __init__(self, entries: list[ModelEntry], cfg: ServeConfig,
                 open_service: Callable[[ModelEntry], Service]):
        self.entries, self.cfg, self.open_service = entries, cfg, open_service
        self.pairs = Pairs(routes(entries, cfg.pivot))
        self.loaded: OrderedDict[Path, Loaded] = OrderedDict()
        self.busy: Counter[Path] = Counter()  # requests in flight per model
        self.loads = 0  # models loaded so far (evicted ones loaded again count again)
        self._lock: asyncio.Lock | None = None  # one load at a time
        self._freed: asyncio.Event | None = None  # a model's last request ended

    def route(self, source: str | None, target: str | None) -> Route:
        """The pair's route; a 422 naming the field where a language is missing or no model
        serves the pair."""
        for key, value in (("src_lang", source), ("tgt_lang", target)):
            if not value:
                raise ApiError(422, key, f"this server has several models: name the "
                                         f"language (it translates from "
                                         f"{', '.join(self.pairs.sources)})")
        try:
            self.pairs.fields(source, target)
        except LibreError as e:
            raise ApiError(422, "tgt_lang", str(e)) from None
        return self.pairs.routes[source, target]

    def preload(self) -> None:
        """Load models at start (before the server's threads and sockets), in order, as many
        as the budget holds."""
        for entry in self.entries:
            if not self.fits(entry, [e.path for e in self.entries if e.path in self.loaded]):
                log(f"preload: {entry.path} and the rest wait for their first request "
                    f"(max_models={self.cfg.max_models}, memory_gb={self.cfg.memory_gb:g})")
                return
            self.loaded[entry.path] = Loaded(self.open_service(entry))
            self.loads += 1

    def start(self) -> None:
        """On the event loop: run the preloaded models' batchers."""
        for loaded in self.loaded.values():
            loaded.task = asyncio.create_task(loaded.service.batcher.run())

    def fits(self, entry: ModelEntry, kept: list[Path]) -> bool:
        """Does `entry` fit the budget beside the models `kept`?"""
        cfg, sizes = self.cfg, {e.path: e.size for e in self.entries}
        return not ((cfg.max_models and len(kept) + 1 > cfg.max_models) or (
            cfg.memory_gb and sum(sizes[p] for p in kept) + entry.size > cfg.memory_gb * 1e9))

    async def translate(self, req: TranslateRequest, source: str | None,
                        target: str | None) -> TranslateResponse:
        """The request translated from source into target: by the pair's model, or through
        English (the first hop's texts, blank ones left as they are, are the second's)."""
        route = self.route(source, target)
        first = req
        if route.pivot:  # what the last hop's output alone is asked for
            first = req.model_copy(update={
                "nbest": None, "prefix": None, "constraints": None, "glossary": None,
                "keep": None, "attention": False, "word_scores": False})
        answer = await self.run(route.hops[0], first)
        for hop in route.hops[1:]:
            texts = [t.text for t in answer.translations]
            mine = [t for t in texts if t.strip()]
            if not mine:
                return answer
            got = iter((await self.run(hop, req.model_copy(update={"text": mine}))
                        ).translations)
            answer = TranslateResponse(translations=[
                next(got) if t.strip() else a for t, a in zip(texts, answer.translations,
                                                             strict=True)])
        return answer

    async def run(self, hop: Hop, req: TranslateRequest) -> TranslateResponse:
        """One hop on its model's service (loaded now if it is not)."""
        async with self.using(hop.entry) as service:
            return await service.translate(hop.request(req))

    @asynccontextmanager
    async def using(self, entry: ModelEntry) -> AsyncIterator[Service]:
        """The entry's Service, loaded if needed, counted in flight (not evicted) meanwhile."""
        self.busy[entry.path] += 1
        try:
            yield await self.service(entry)
        finally:
            self.busy[entry.path] -= 1
            if self._freed is not None and not self.busy[entry.path]:
                self._freed.set()

    async def service(self, entry: ModelEntry) -> Service:
        """The entry's Service, the most recently used now; loaded (off the event loop, after
        evicting what the budget needs) if it is not."""
        if entry.path in self.loaded:  # no wait behind another model's load
            self.loaded.move_to_end(entry.path)
            return self.loaded[entry.path].service
        if self._lock is None:
            self._lock, self._freed = asyncio.Lock(), asyncio.Event()
        async with self._lock:
            if entry.path not in self.loaded:
                await self._make_room(entry)
                try:
                    service = await asyncio.to_thread(self.open_service, entry)
                except NmtError as e:
                    raise ApiError(500, None, f"cannot load {entry.path}: {e}") from None
                self.loads += 1
                self.loaded[entry.path] = Loaded(service, asyncio.create_task(
                    service.batcher.run()))
            self.loaded.move_to_end(entry.path)
            return self.loaded[entry.path].service

    async def _make_room(self, entry: ModelEntry) -> None:
        """Evict the least recently used idle models until `entry` fits; while every loaded
        one is busy, wait for one to finish (a 503 after timeout_s)."""
        deadline = asyncio.get_running_loop().time() + self.cfg.timeout_s
        while not self.fits(entry, list(self.loaded)):
            idle = next((p for p in self.loaded if not self.busy[p]), None)
            if idle is None:
                self._freed.clear()
                try:
                    await asyncio.wait_for(self._freed.wait(),
                                           deadline - asyncio.get_running_loop().time())
                except TimeoutError:
                    raise ApiError(503, None, f"busy: the {len(self.loaded)} models loaded "
                                              f"(the budget's most) each have requests in "
                                              f"flight; {entry.path} waits for one to end",
                                   {"Retry-After": "1"}) from None
                continue
            loaded = self.loaded.pop(idle)
            if loaded.task is not None:
                loaded.task.cancel()
            await asyncio.to_thread(loaded.service.translator.close)
            log(f"{idle}: unloaded (max_models={self.cfg.max_models}, "
                f"memory_gb={self.cfg.memory_gb:g}) for {entry.path}")

    def broken(self) -> str:
        """Why a loaded model cannot translate ("": every one can)."""
        return next((f"{p}: {why}" for p, m in self.loaded.items()
                     if (why := m.service.broken)), "")

    def close(self) -> None:
        """Stop every loaded model's workers."""
        for loaded in self.loaded.values():
            loaded.service.translator.close()
        self.loaded.clear()


def budget_line(entries: list[ModelEntry], cfg: ServeConfig) -> str:
    """At start: the largest model and the budget, in one line; a one-line NmtError for a
    memory_gb the largest model does not fit."""
    largest = max(entries, key=lambda e: e.size)
    size = f"{largest.size / 1e9:.3g} GB" if largest.size >= 1e8 else f"{largest.size / 1e6:.3g} MB"
    if cfg.memory_gb and largest.size > cfg.memory_gb * 1e9:
        raise NmtError(f"memory_gb={cfg.memory_gb:g}: smaller than the largest model, "
                       f"{largest.path} ({size})")
    limits = [f"max_models={cfg.max_models}"] * bool(cfg.max_models) + [
        f"memory_gb={cfg.memory_gb:g}"] * bool(cfg.memory_gb)
    return (f"{len(entries)} models; the largest {largest.path} ({size}); budget: "
            f"{', '.join(limits) or 'none (every model may be loaded at once)'}")


def model_config(cfg: ServeConfig, entry: ModelEntry) -> ServeConfig:
    """The server's settings for one model's Service: its checkpoint, a bilingual one's pair
    (which it may not record: named after it); a CTranslate2 model (an export folder, an
    Argos package) decodes with search.alpha=0 and batches dynamically, what that engine has
    (an nmt model beside it keeps the server's settings)."""
    pair = entry.languages if entry.bilingual else None
    ct2 = {"engine": "ctranslate2", "continuous": False,
           "search": replace(cfg.search, alpha=0.0)} if entry.kind != "nmt" else {}
    return replace(cfg, models="", checkpoint=str(entry.path),
                   src_lang=pair.sources[0] if pair else "",
                   tgt_lang=pair.targets[0] if pair else "", **ct2)
