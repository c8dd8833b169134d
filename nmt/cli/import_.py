"""nmt-import: the command-line entry point (configs/import.yaml, schema ImportConfig)."""

from nmt.cli import hydra_app
from nmt.config import ImportConfig


@hydra_app("nmt-import", "import", ImportConfig)
def main(config: ImportConfig) -> None:
    """Run nmt.commands.import_.import_model on the validated config."""
    from nmt.commands.import_ import import_model

    import_model(config)
