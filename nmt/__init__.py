"""nmt: neural machine translation with the Transformer of Vaswani et al. (2017)."""

__version__ = "0.1.0"


def _checkout_configs() -> None:
    """Imported from a source checkout that no install maps (e.g. `python -m pytest` in the
    checkout beside a plain install of nmt), configs/ lies beside this package: make it the
    package nmt.configs, as an install does (pyproject's package-dir), so that Hydra finds
    pkg://nmt.configs. Nothing is done where nmt.configs is found (an install, editable or not)."""
    import importlib.util
    import sys
    from pathlib import Path

    configs = Path(__file__).resolve().parent.parent / "configs"
    if importlib.util.find_spec(f"{__name__}.configs") or not (configs / "__init__.py").is_file():
        return
    spec = importlib.util.spec_from_file_location(
        f"{__name__}.configs", configs / "__init__.py", submodule_search_locations=[str(configs)])
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    globals()["configs"] = module  # what an import binds in the parent package


_checkout_configs()
