"""Which engine opens a model: `open_translator`, the one switch between nmt's own Translator
(engine=nmt, nmt.engines.translator) and CTranslate2's (engine=ctranslate2, a wing:
nmt.wings.ctranslate2, imported only when it is asked for). It sits above the engines and the
wings, for the front ends (nmt-translate, nmt-serve, the benchmarks); below it everything
decodes through the interface, nmt.engines.engine.Engine."""

from __future__ import annotations

import torch

from nmt.config_checks import check_search_device
from nmt.data.shortlist import load_shortlist
from nmt.engines.engine import Engine
from nmt.engines.translator import Translator
from nmt.errors import NmtError
from nmt.system.runtime import warn_if_bf16_emulated


def open_translator(engine: str, checkpoints: list[str], device: torch.device,
                    weights: str = "auto", dtype: str = "fp32", workers: int = 1,
                    threads: int = 0, ct2_model: str = "", shortlist: str = "",
                    compile: str = "auto", fork: bool = False) -> Engine:
    """The Translator of engine=nmt, or the CT2Translator of engine=ctranslate2 (one
    checkpoint, or an Argos Translate package: nmt.wings.interop.argos; search.dtype checked
    against the device for the engine first; shortlist: search.shortlist, which must be built
    for the checkpoint's target vocabulary and which CTranslate2's export must hold; compile:
    search.compile, engine=nmt's; fork: engine=nmt's one worker a forked process too, whose
    interpreter lock is its own: nmt.engines.translator.Translator)."""
    check_search_device(dtype, device.type, engine=engine)
    if dtype == "bf16" and device.type == "cpu":
        warn_if_bf16_emulated("search.dtype=bf16")
    if engine == "nmt":
        try:
            translator = Translator.load(checkpoints, device, weights, dtype=dtype,
                                         workers=workers, threads=threads, compile=compile,
                                         fork=fork)
        except NmtError:
            refuse_package(checkpoints)
            raise
    else:
        from nmt.wings.ctranslate2 import CT2Translator

        translator = CT2Translator.load(checkpoints, device, weights, dtype, workers, threads,
                                        ct2_model, shortlist)
    try:
        if shortlist:  # built for this vocabulary: checked once here, not per batch
            load_shortlist(shortlist).check(translator.vocab.sha256,
                                            translator.vocab.tgt_size, "the checkpoint")
    except NmtError:
        translator.close()
        raise
    return translator


def refuse_package(checkpoints: list[str]) -> None:
    """engine=nmt's checkpoints that failed to load: an Argos Translate package among them
    (nmt.wings.interop.argos, imported only then) is refused in one line that names the
    engine that reads it."""
    from nmt.wings.interop.argos import is_package

    package = next((c for c in checkpoints if is_package(c)), None)
    if package is not None:
        raise NmtError(f"{package}: an Argos Translate package (a CTranslate2 model): "
                       f"give engine=ctranslate2") from None
