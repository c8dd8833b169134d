"""nmt-translate: the command-line entry point (configs/translate.yaml, schema TranslateConfig)."""

from nmt.cli import hydra_app
from nmt.config import TranslateConfig


@hydra_app("nmt-translate", "translate", TranslateConfig)
def main(config: TranslateConfig) -> None:
    """Run nmt.commands.translate.translate on the validated config."""
    from nmt.commands.translate import translate

    translate(config)
