"""nmt-export: a checkpoint in, a CTranslate2, a Hugging Face transformers or an ONNX
(transformers.js) model directory out (nmt.wings.interop.ct2_export,
nmt.wings.interop.transformers_export, nmt.wings.interop.onnx_export), built in a temporary
directory, then renamed into place."""

from __future__ import annotations

import importlib
from pathlib import Path

from nmt.config import ExportConfig
from nmt.errors import NmtError
from nmt.loading import LoadedCheckpoint
from nmt.system.files import check_out_dir, check_output, new_directory
from nmt.wings.interop.ct2_export import export_key, write_ctranslate2
from nmt.wings.interop.onnx_export import write_onnx
from nmt.wings.interop.transformers_export import MARKER, PROG, write_transformers


def export(cfg: ExportConfig) -> Path:
    """nmt-export: write cfg.checkpoint's model to the directory cfg.output in cfg.format."""
    out = Path(cfg.output)
    check_output(out, "output", directory=True)
    check_out_dir(out, cfg.force, MARKER, "model directory")
    for package in REQUIRES[cfg.format]:
        _require(package, cfg.format)
    loaded = LoadedCheckpoint.load(cfg.checkpoint)
    with new_directory(out, cfg.force, MARKER, "model directory") as tmp:
        if cfg.format == "onnx":
            what = write_onnx(loaded, tmp, cfg.web_runtime)
        elif cfg.format == "ctranslate2":
            key = export_key(cfg.checkpoint, "auto", cfg.quantization or "float32",
                             cfg.shortlist)
            what = write_ctranslate2(loaded, tmp, cfg.quantization, key, cfg.shortlist)
        else:
            what = write_transformers(loaded, tmp)
    print(f"{PROG}: {cfg.checkpoint} -> {out} ({what})", flush=True)
    return out


REQUIRES = {"ctranslate2": ("ctranslate2",), "transformers": ("transformers",),
            "onnx": ("onnx", "onnxruntime", "onnxscript", "tokenizers")}  # format -> packages


def _require(package: str, fmt: str) -> None:
    """Check that an optional package imports, or say in one line how to install it."""
    try:
        importlib.import_module(package)
    except ImportError:
        extra = "onnx" if fmt == "onnx" else "export"
        raise NmtError(f"format={fmt} needs the {package} package: "
                       f"pip install 'nmt[{extra}]'") from None
