"""nmt-train: the command-line entry point (configs/train.yaml, schema TrainConfig)."""

from nmt.cli import exit_without_teardown, hydra_app
from nmt.config import TrainConfig


@hydra_app("nmt-train", "train", TrainConfig)
def train_app(config: TrainConfig) -> None:
    """Run nmt.commands.train.train on the validated config."""
    from nmt.commands.train import train

    train(config)


def main(cfg=None) -> None:
    """nmt-train: train_app; the command (cfg None) of a torchrun rank then ends the process
    at once, without the interpreter's teardown (exit_without_teardown, which imports no torch:
    --cfg job and --help answer before torch is imported)."""
    if cfg is not None:
        return train_app(cfg)
    with exit_without_teardown():
        train_app()
