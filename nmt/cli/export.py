"""nmt-export: the command-line entry point (configs/export.yaml, schema ExportConfig)."""

from nmt.cli import hydra_app
from nmt.config import ExportConfig


@hydra_app("nmt-export", "export", ExportConfig)
def main(config: ExportConfig) -> None:
    """Run nmt.commands.export.export on the validated config."""
    from nmt.commands.export import export

    export(config)
