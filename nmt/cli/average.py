"""nmt-average: the command-line entry point (configs/average.yaml, schema AverageConfig)."""

from nmt.cli import hydra_app
from nmt.config import AverageConfig


@hydra_app("nmt-average", "average", AverageConfig)
def main(config: AverageConfig) -> None:
    """Run nmt.commands.average.average on the validated config."""
    from nmt.commands.average import average

    average(config)
