"""nmt-translate: the command-line entry point (configs/translate.yaml, schema TranslateConfig)."""

import hydra
from omegaconf import DictConfig

from nmt.cli import cli_errors
from nmt.config import TranslateConfig, register_configs, to_object

register_configs()


@hydra.main(version_base="1.3", config_path="pkg://nmt.configs", config_name="translate")
def main(cfg: DictConfig) -> None:
    """Validate the composed config, then run nmt.translate.translate."""
    with cli_errors("nmt-translate"):
        config = to_object(cfg, TranslateConfig)
        from nmt.translate import translate

        translate(config)
