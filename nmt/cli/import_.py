"""nmt-import: the command-line entry point (configs/import.yaml, schema ImportConfig)."""

from nmt.cli import hydra_app
from nmt.config import ImportConfig


@hydra_app("nmt-import", "import", ImportConfig)
def main(config: ImportConfig) -> None:
    """Run nmt.marian.import_marian on the validated config."""
    from nmt.marian import import_marian

    import_marian(config)
