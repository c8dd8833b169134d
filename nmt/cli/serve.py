"""nmt-serve: the command-line entry point (configs/serve.yaml, schema ServeConfig)."""

import hydra
from omegaconf import DictConfig

from nmt.cli import cli_errors
from nmt.config import ServeConfig, register_configs, to_object
from nmt.errors import NmtError

register_configs()


@hydra.main(version_base="1.3", config_path="pkg://nmt.configs", config_name="serve")
def main(cfg: DictConfig) -> None:
    """Validate the composed config, then run nmt.serve.serve until SIGTERM or Ctrl-C."""
    with cli_errors("nmt-serve"):
        config = to_object(cfg, ServeConfig)
        try:
            from nmt.serve import serve
        except ModuleNotFoundError as e:  # fastapi or uvicorn: the optional extra "serve"
            if (e.name or "").split(".")[0] not in ("fastapi", "uvicorn", "starlette"):
                raise
            raise NmtError(f"{e.name} is not installed: pip install 'nmt[serve]'") from None
        serve(config)
