"""nmt-preprocess: the command-line entry point (configs/preprocess.yaml, PreprocessConfig)."""

from nmt.cli import hydra_app
from nmt.config import PreprocessConfig


@hydra_app("nmt-preprocess", "preprocess", PreprocessConfig, preload=())  # no torch
def main(config: PreprocessConfig) -> None:
    """Run nmt.commands.preprocess.preprocess on the validated config."""
    from nmt.commands.preprocess import preprocess

    preprocess(config)
