"""Thin Hydra entry points: each converts its config and calls one plain library function."""

from __future__ import annotations

import sys
from collections.abc import Callable

from omegaconf import DictConfig

from nmt.config import to_object
from nmt.errors import NmtError


def run_cli(prog: str, fn: Callable, cfg: DictConfig, schema: type):
    """Validate `cfg` against `schema` and call `fn`; an NmtError becomes one line and exit 1."""
    try:
        return fn(to_object(cfg, schema))
    except NmtError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        sys.exit(130)
