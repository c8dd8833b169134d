"""nmt-average: the command-line entry point (configs/average.yaml, schema AverageConfig)."""

import hydra
from omegaconf import DictConfig

from nmt.cli import cli_errors
from nmt.config import AverageConfig, register_configs, to_object

register_configs()


@hydra.main(version_base="1.3", config_path="pkg://nmt.configs", config_name="average")
def main(cfg: DictConfig) -> None:
    """Validate the composed config, then run nmt.checkpoint.average."""
    with cli_errors("nmt-average"):
        config = to_object(cfg, AverageConfig)
        from nmt.checkpoint import average

        average(config)
