"""nmt-train: the command-line entry point (configs/train.yaml, schema TrainConfig)."""

from nmt.cli import hydra_app
from nmt.config import TrainConfig


@hydra_app("nmt-train", "train", TrainConfig)
def train_app(config: TrainConfig) -> None:
    """Run nmt.commands.train.train on the validated config."""
    from nmt.commands.train import train

    train(config)


def main(cfg=None) -> None:
    """nmt-train: train_app; the command (cfg None) of a torchrun rank then ends the process
    at once, without the interpreter's teardown (distributed.exit_without_teardown)."""
    if cfg is not None:
        return train_app(cfg)
    from nmt.system.distributed import exit_without_teardown

    with exit_without_teardown():
        train_app()
