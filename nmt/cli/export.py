"""nmt-export: the command-line entry point (configs/export.yaml, schema ExportConfig)."""

import hydra
from omegaconf import DictConfig

from nmt.cli import cli_errors
from nmt.config import ExportConfig, register_configs, to_object

register_configs()


@hydra.main(version_base="1.3", config_path="pkg://nmt.configs", config_name="export")
def main(cfg: DictConfig) -> None:
    """Validate the composed config, then run nmt.export.export."""
    with cli_errors("nmt-export"):
        config = to_object(cfg, ExportConfig)
        from nmt.export import export

        export(config)
