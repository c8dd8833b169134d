"""Thin Hydra entry points: each converts its config and calls one plain library function."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

from nmt.errors import NmtError


@contextmanager
def cli_errors(prog: str) -> Iterator[None]:
    """Turn an NmtError into one line on stderr and exit status 1 (no traceback)."""
    try:
        yield
    except NmtError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        sys.exit(130)
