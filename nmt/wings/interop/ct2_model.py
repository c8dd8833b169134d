"""CTranslate2's model.bin read without CTranslate2: the one reader of nmt-import
(nmt.wings.interop.ct2_import: the weights) and of Argos packages (nmt.wings.interop.argos: the
spec and shapes only, weights=False, which seeks past the bytes).

CTranslate2's python/ctranslate2/specs/model_spec.py (ModelSpec._serialize) writes a binary
version (2 to 6 are read), the spec's name and revision, then each variable's name, shape,
dtype and bytes, then the aliases (a tied matrix is stored once). Strings are a uint16 length
(the NUL included), the bytes, a NUL. Versions 2 and 3 give an item size and count where later
ones give a dtype id and a byte count; aliases came with version 3.
"""

from __future__ import annotations

import math
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import torch
from torch import Tensor

from nmt.errors import NmtError

VERSIONS = range(2, 7)  # model.bin's binary versions read (1: OpenNMT-tf 1 names)
DTYPES = (torch.float32, torch.int8, torch.int16, torch.int32, torch.float16, torch.bfloat16)
ITEM_SIZES = {4: torch.float32, 2: torch.int16, 1: torch.int8}  # binary versions 2 and 3


@dataclass
class Ct2Model:
    """model.bin read: its binary version, spec name and revision, every variable's shape by
    name and, where its weights were read, every variable (an alias is the tensor it names)."""

    version: int
    spec: str
    revision: int
    shapes: dict[str, tuple[int, ...]]
    variables: dict[str, Tensor] = field(default_factory=dict)


class _Reader:
    """A cursor over model.bin; a read past the end is a one-line NmtError."""

    def __init__(self, f: BinaryIO, path: Path):
        self.f, self.path, self.at = f, path, 0
        self.size = os.fstat(f.fileno()).st_size

    def _advance(self, n: int) -> None:
        """Move the cursor n bytes on; past the end of the file is an error."""
        if self.at + n > self.size:
            raise NmtError(f"{self.path}: truncated at byte {self.size:,} (needs "
                           f"{self.at + n:,}): copy the model again")
        self.at += n

    def take(self, n: int) -> bytes:
        """The next n bytes."""
        self._advance(n)
        return self.f.read(n)

    def skip(self, n: int) -> None:
        """Step over the next n bytes."""
        self._advance(n)
        self.f.seek(n, os.SEEK_CUR)

    def number(self, fmt: str) -> int:
        """A little-endian struct number (I: uint32, H: uint16, B: uint8)."""
        return struct.unpack("<" + fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        """A uint16 length (NUL included), the UTF-8 bytes, a NUL."""
        n = self.number("H")
        if n == 0:
            raise NmtError(f"{self.path}: an empty string at byte {self.at - 2:,}")
        return self.take(n)[:-1].decode("utf-8", errors="replace")


def read_model_bin(path: Path, weights: bool = True) -> Ct2Model:
    """model.bin's version, spec, shapes and (weights) variables; a one-line NmtError for an
    unreadable or truncated file, an unknown version, a variable whose bytes do not fill its
    shape. Without weights, binary version 1 (no spec name) reads as spec "" and no shapes."""
    try:
        with open(path, "rb") as f:
            return _read(_Reader(f, path), weights)
    except OSError as e:
        raise NmtError(f"{path}: cannot read ({e.strerror})") from None


def _read(r: _Reader, weights: bool) -> Ct2Model:
    """The body of read_model_bin."""
    version = r.number("I")
    if version < VERSIONS[0] and not weights:
        return Ct2Model(version, "", 0, {})
    if version not in VERSIONS:
        raise NmtError(f"{r.path}: binary version {version}: nmt reads versions "
                       f"{VERSIONS[0]} to {VERSIONS[-1]} (CTranslate2 2.x to 4.x)")
    model = Ct2Model(version, r.string(), r.number("I"), {})
    for _ in range(r.number("I")):
        name = r.string()
        shape = tuple(r.number("I") for _ in range(r.number("B")))
        model.shapes[name] = shape
        value = _variable(r, name, shape, version, weights)
        if value is not None:
            model.variables[name] = value
    for _ in range(r.number("I") if version >= 3 else 0):
        alias, target = r.string(), r.string()
        for suffix in ("", "_scale"):
            if target + suffix in model.shapes:
                model.shapes[alias + suffix] = model.shapes[target + suffix]
            if target + suffix in model.variables:
                model.variables[alias + suffix] = model.variables[target + suffix]
    if r.at != r.size:
        raise NmtError(f"{r.path}: {r.size - r.at:,} bytes after the aliases: not a "
                       f"CTranslate2 model.bin of version {version}")
    return model


def _variable(r: _Reader, name: str, shape: tuple[int, ...], version: int, weights: bool
              ) -> Tensor | None:
    """One variable's dtype, size and bytes as a tensor of its shape (None: skipped)."""
    if version >= 4:
        type_id, size = r.number("B"), r.number("I")
        if type_id >= len(DTYPES):
            raise NmtError(f"{r.path}: {name}: unknown dtype {type_id}")
        dtype = DTYPES[type_id]
    else:
        item = r.number("B")
        dtype, size = ITEM_SIZES.get(item), r.number("I") * item
        if dtype is None:
            raise NmtError(f"{r.path}: {name}: unknown item size {item}")
    if size != math.prod(shape) * dtype.itemsize:
        raise NmtError(f"{r.path}: {name}: {size:,} bytes do not fill shape {list(shape)} of "
                       f"{dtype}")
    if not weights:
        r.skip(size)
        return None
    data = r.take(size)
    return torch.frombuffer(bytearray(data), dtype=dtype).reshape(shape) if size else (
        torch.zeros(shape, dtype=dtype))
