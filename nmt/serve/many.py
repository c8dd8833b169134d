"""The HTTP app of a many-model server (nmt-serve models=DIR; nmt.serve.models): nmt's own POST
/translate, which names src_lang and tgt_lang, LibreTranslate's API over every routed pair
(nmt.wings.libretranslate.api), GET /health (every model, which are loaded, the pivots) and the
page, with the single-model app's limits, keys and error answers (nmt.serve.app)."""

from __future__ import annotations

from contextlib import asynccontextmanager
from dataclasses import asdict
from importlib.resources import files

from fastapi import FastAPI
from fastapi.responses import HTMLResponse, JSONResponse

from nmt.serve.app import CSP, BodyLimit, KeyFirst, add_error_answers, body_limit, libre_request
from nmt.serve.models import Registry
from nmt.serve.schemas import (
    ERRORS,
    Features,
    ModelInfo,
    ModelsHealthResponse,
    StatsResponse,
    TranslateRequest,
    TranslateResponse,
)
from nmt.serve.service import log
from nmt.wings.libretranslate import api as libretranslate
from nmt.wings.libretranslate.api_keys import ApiKeys


def create_models_app(registry: Registry, device: str) -> FastAPI:
    """The FastAPI application over a Registry; the lifespan runs the preloaded models'
    batchers (a model loaded later starts its own)."""
    cfg, keys = registry.cfg, ApiKeys(registry.cfg.api_keys, log)
    page = files("nmt.serve").joinpath("page.html").read_text(encoding="utf-8")

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        registry.start()
        yield
        for loaded in registry.loaded.values():
            if loaded.task is not None:
                loaded.task.cancel()

    app = FastAPI(title="nmt-serve", version="1", lifespan=lifespan, description=(
        "Neural machine translation with every model of a folder; each model's requests are "
        "decoded together in shared batches."))
    add_error_answers(app)
    app.add_middleware(KeyFirst, keys=keys)

    libretranslate.install(
        app, cfg, lambda texts, src_lang, tgt_lang, **search: registry.translate(
            libre_request(texts, **search), src_lang, tgt_lang),
        registry.pairs, keys, extra=lambda: settings_extra(registry))
    app.add_middleware(BodyLimit, max_bytes=body_limit(cfg))

    @app.post("/translate", response_model=TranslateResponse, response_model_exclude_none=True,
              responses=ERRORS, summary="Translate sentences from src_lang into tgt_lang")
    async def translate(req: TranslateRequest) -> TranslateResponse:
        """Translate `text` from src_lang into tgt_lang (both needed): by the pair's model, or
        through English (GET /health's pivots)."""
        return await registry.translate(req, req.src_lang, req.tgt_lang)

    @app.get("/health", response_model=ModelsHealthResponse,
             summary="The models, which are loaded, and whether the server can translate")
    async def health() -> JSONResponse:
        """200 with the models and the limits; 503 if a loaded model cannot translate."""
        answer = models_health(registry, device, keys.required)
        return JSONResponse(answer.model_dump(), 503 if answer.error else 200)

    @app.get("/stats", response_model=dict[str, StatsResponse],
             summary="Each loaded model's requests, sentences and batches since it loaded")
    async def stats() -> dict[str, StatsResponse]:
        """The single-model server's /stats of each loaded model, by its path."""
        return {str(path): m.service.stats() for path, m in registry.loaded.items()}

    @app.get("/", response_class=HTMLResponse, summary="A page to try the server in a browser")
    async def index() -> HTMLResponse:
        """The single-model server's page, with a source and a target picker."""
        return HTMLResponse(page, headers={"Content-Security-Policy": CSP})

    return app


def models_health(registry: Registry, device: str, key_required: bool) -> ModelsHealthResponse:
    """GET /health of a many-model server."""
    cfg, pairs, broken = registry.cfg, registry.pairs, registry.broken()
    models = [ModelInfo(path=str(e.path), kind=e.kind, pairs=[f"{s}-{t}" for s, t in e.pairs],
                        loaded=e.path in registry.loaded, size_mb=round(e.size / 1e6, 3))
              for e in registry.entries]
    features = Features(engine=cfg.engine, attention=False, nbest=not cfg.mbr.candidates,
                        prefix=True, constraints=False, word_scores=False, convention="forced",
                        sources=list(pairs.sources), targets=list(pairs.targets),
                        src_lang=pairs.sources[0], key_required=key_required)
    return ModelsHealthResponse(
        status="error" if broken else "ok", model_loaded=bool(registry.loaded),
        error=broken or None, checkpoint=cfg.models, device=device, models=models,
        loaded=len(registry.loaded), loads=registry.loads, max_models=cfg.max_models,
        memory_gb=cfg.memory_gb, pivots=pairs.pivots(),
        limits={k: getattr(cfg, k) for k in (
            "max_sentences", "max_chars", "max_queued", "max_input_tokens", "timeout_s",
            "max_beam_size", "max_len_b", "max_wait_ms")},
        search=asdict(cfg.search), split=cfg.split, tgt_lang="", features=features)


def settings_extra(registry: Registry) -> dict:
    """GET /frontend/settings' additions of a many-model server: the pairs that pivot, and
    each model's name, pairs and whether it is loaded."""
    return {"pivots": registry.pairs.pivots(), "models": [
        {"name": e.path.name, "pairs": [f"{s}-{t}" for s, t in e.pairs],
         "loaded": e.path in registry.loaded} for e in registry.entries]}
