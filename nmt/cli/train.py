"""nmt-train: the command-line entry point (configs/train.yaml, schema TrainConfig)."""

import hydra
from omegaconf import DictConfig

from nmt.cli import cli_errors
from nmt.config import TrainConfig, register_configs, to_object

register_configs()


@hydra.main(version_base="1.3", config_path="pkg://nmt.configs", config_name="train")
def main(cfg: DictConfig) -> None:
    """Validate the composed config, then run nmt.train.train."""
    with cli_errors("nmt-train"):
        config = to_object(cfg, TrainConfig)
        from nmt.train import train

        train(config)
