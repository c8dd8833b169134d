"""nmt-train: the command-line entry point (configs/train.yaml, schema TrainConfig)."""

from nmt.cli import hydra_app
from nmt.config import TrainConfig


@hydra_app("nmt-train", "train", TrainConfig)
def main(config: TrainConfig) -> None:
    """Run nmt.commands.train.train on the validated config."""
    from nmt.commands.train import train

    train(config)
