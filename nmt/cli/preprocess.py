"""nmt-preprocess: the command-line entry point (configs/preprocess.yaml, PreprocessConfig)."""

import hydra
from omegaconf import DictConfig

from nmt.cli import cli_errors
from nmt.config import PreprocessConfig, register_configs, to_object

register_configs()


@hydra.main(version_base="1.3", config_path="pkg://nmt.configs", config_name="preprocess")
def main(cfg: DictConfig) -> None:
    """Validate the composed config, then run nmt.preprocess.preprocess."""
    with cli_errors("nmt-preprocess"):
        config = to_object(cfg, PreprocessConfig)
        from nmt.preprocess import preprocess

        preprocess(config)
