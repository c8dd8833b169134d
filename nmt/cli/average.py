"""nmt-average: the command-line entry point (configs/average.yaml, schema AverageConfig)."""

import hydra
from omegaconf import DictConfig

from nmt.cli import run_cli
from nmt.config import AverageConfig, register_configs

register_configs()


@hydra.main(version_base="1.3", config_path="pkg://nmt.configs", config_name="average")
def main(cfg: DictConfig) -> None:
    """Run nmt.checkpoint.average on the composed config."""
    from nmt.checkpoint import average

    run_cli("nmt-average", average, cfg, AverageConfig)
