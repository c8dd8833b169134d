"""nmt-serve offline=DIR: the page of an nmt-export format=onnx folder at /offline/.

The folder's files (index.html, offline.js, runtime/, config.json, tokenizer.json, onnx/...)
are served as they are, each with a content security policy of its own: scripts from this
server only, WebAssembly compiled from them ('wasm-unsafe-eval'), fetches to this server only,
nothing else. The page then translates in the browser; the server is not asked to translate.
"""

from __future__ import annotations

from pathlib import Path

from nmt.errors import ConfigError

CSP = ("default-src 'none'; script-src 'self' 'wasm-unsafe-eval'; connect-src 'self'; "
       "style-src 'unsafe-inline'; img-src 'self' data:; base-uri 'none'; form-action 'none'")
TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript", ".mjs": "text/javascript",
         ".wasm": "application/wasm", ".json": "application/json"}  # else octet-stream
NEEDS = ("index.html", "offline.js", "config.json", "tokenizer.json",
         "onnx/encoder_model.onnx", "runtime/transformers.min.js")


def check_offline(folder: str) -> Path:
    """The folder, resolved; a one-line ConfigError (key offline) unless it holds an export
    with its page and runtime (nmt-export format=onnx web_runtime=...)."""
    path = Path(folder).resolve()
    missing = [name for name in NEEDS if not (path / name).is_file()]
    if missing:
        raise ConfigError("offline", f"{folder} has no {missing[0]} (write it with nmt-export "
                                     "format=onnx web_runtime=DIR)")
    return path


def install_offline(app, folder: str) -> None:
    """GET /offline (a redirect to /offline/) and GET /offline/PATH: the folder's files."""
    from fastapi import HTTPException
    from fastapi.responses import FileResponse, RedirectResponse

    root = check_offline(folder)

    @app.get("/offline", include_in_schema=False)
    async def offline_redirect() -> RedirectResponse:
        """The page's folder URL, so that its relative URLs resolve inside it."""
        return RedirectResponse("/offline/")

    @app.get("/offline/{name:path}", summary="The page that translates in the browser")
    async def offline(name: str) -> FileResponse:
        """A file of the export (index.html for the folder itself); 404 outside it."""
        path = (root / (name or "index.html")).resolve()
        if not path.is_relative_to(root) or not path.is_file():
            raise HTTPException(404, f"no such file: /offline/{name}")
        return FileResponse(path, media_type=TYPES.get(path.suffix, "application/octet-stream"),
                            headers={"Content-Security-Policy": CSP})
