"""nmt-train: the command-line entry point (configs/train.yaml, schema TrainConfig)."""

import hydra
from omegaconf import DictConfig

from nmt.cli import run_cli
from nmt.config import TrainConfig, register_configs

register_configs()


@hydra.main(version_base="1.3", config_path="pkg://nmt.configs", config_name="train")
def main(cfg: DictConfig) -> None:
    """Run nmt.train.train on the composed config."""
    from nmt.train import train

    run_cli("nmt-train", train, cfg, TrainConfig)
