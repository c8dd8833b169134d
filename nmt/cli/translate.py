"""nmt-translate: the command-line entry point (configs/translate.yaml, schema TranslateConfig)."""

import hydra
from omegaconf import DictConfig

from nmt.cli import run_cli
from nmt.config import TranslateConfig, register_configs

register_configs()


@hydra.main(version_base="1.3", config_path="pkg://nmt.configs", config_name="translate")
def main(cfg: DictConfig) -> None:
    """Run nmt.translate.translate on the composed config."""
    from nmt.translate import translate

    run_cli("nmt-translate", translate, cfg, TranslateConfig)
