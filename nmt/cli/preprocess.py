"""nmt-preprocess: the command-line entry point (configs/preprocess.yaml, schema PreprocessConfig)."""

import hydra
from omegaconf import DictConfig

from nmt.cli import run_cli
from nmt.config import PreprocessConfig, register_configs

register_configs()


@hydra.main(version_base="1.3", config_path="pkg://nmt.configs", config_name="preprocess")
def main(cfg: DictConfig) -> None:
    """Run nmt.preprocess.preprocess on the composed config."""
    from nmt.preprocess import preprocess

    run_cli("nmt-preprocess", preprocess, cfg, PreprocessConfig)
