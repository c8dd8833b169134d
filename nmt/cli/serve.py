"""nmt-serve: the command-line entry point (configs/serve.yaml, schema ServeConfig)."""

from nmt.cli import hydra_app
from nmt.config import ServeConfig
from nmt.errors import NmtError


@hydra_app("nmt-serve", "serve", ServeConfig)
def main(config: ServeConfig) -> None:
    """Run nmt.commands.serve.serve on the validated config until SIGTERM or Ctrl-C."""
    try:
        from nmt.commands.serve import serve
    except ModuleNotFoundError as e:  # fastapi or uvicorn: the optional extra "serve"
        if (e.name or "").split(".")[0] not in ("fastapi", "uvicorn", "starlette"):
            raise
        raise NmtError(f"{e.name} is not installed: pip install 'nmt[serve]'") from None
    serve(config)
