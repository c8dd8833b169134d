"""One report of every kernel probe that picks a decoding path on this machine, each asked of
the kernels themselves (not of the CPU's name): the private PyTorch operators nmt calls
(nmt.system.private_ops.missing), the fused one-query attention operator (built just in time:
nmt.decoding.attention_op.status), oneDNN's packed fp32 / bf16 linear maps
(nmt.decoding.affine.packing_works), the int8 products' saturation in each quantized engine
(nmt.decoding.affine.int8_saturates) and the layout of nmt::int8_rows, the int8 maps of a
step's few rows (nmt.decoding.affine.int8_rows_layout), and whether int8 rounds each row alone
(nmt.decoding.affine.rows_alone). `kernel_report()` runs them all
(building the operator if need be) and returns what each found; the benchmarks' headers and
the tests read it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from nmt.decoding import affine, attention_op
from nmt.system import private_ops

PACKED = {"fp32": torch.float32, "bf16": torch.bfloat16}  # the dtypes oneDNN's maps may pack
VNNI, QUADS = (n.bit_length() - 1 for n in (affine.VNNI_PRODUCTS, affine.QUADS_PRODUCTS))


@dataclass(frozen=True)
class KernelReport:
    """What each kernel probe found."""

    missing_ops: tuple[str, ...]  # private operators this PyTorch lacks (none: all there)
    fused_attention: str | None  # why the fused operator is not loaded; None: it is
    packed: tuple[str, ...]  # the dtypes whose packed oneDNN maps compute x W^T + b
    int8_engines: tuple[str, str] | None  # int8's engines, (small, large) products; None: none
    # per quantized engine this PyTorch has: its u8 x s8 products saturate (int8 keeps 7 bits)
    int8_saturates: dict[str, bool]
    int8_rows_layout: str  # nmt::int8_rows' kernel of a few rows: vnni, quads, pairs ("": none)
    int8_rows_amx: int  # ... its VNNI layout's sums through AMX's tiles from this many rows (0)
    rows_alone: bool  # int8 rounds each row by its own range (else one scale a call)

    def lines(self) -> list[str]:
        """One line per probe, for a benchmark's or a log's header."""
        int8 = "unavailable (quantized operators missing)" if self.int8_engines is None else (
            f"engines {' / '.join(self.int8_engines)} (small / large products); saturating: "
            + (", ".join(f"{e} {'yes (7-bit activations)' if s else 'no'}"
                         for e, s in sorted(self.int8_saturates.items()))))
        ops = "missing " + ", ".join(self.missing_ops) if self.missing_ops else "all there"
        layout = {"vnni": f"VNNI layout (rows x weights up to 2^{VNNI})",
                  "quads": f"quads layout without VNNI (rows x weights up to 2^{QUADS}, 7-bit "
                           "activations)",
                  "pairs": "pairs layout (1 row)"}.get(self.int8_rows_layout, "none")
        tiles = (f", its sums through AMX's tiles from {self.int8_rows_amx} rows"
                 if self.int8_rows_amx else "")
        few = "fbgemm's" if self.fused_attention else f"nmt::int8_rows' {layout}{tiles}"
        alone = ("each row alone (oneDNN's products of many rows)" if self.rows_alone
                 else "one scale a call")
        return [f"private operators: {ops}",
                f"fused attention operator: {self.fused_attention or 'loaded'}",
                f"packed oneDNN linear maps: {', '.join(self.packed) or 'none'}",
                f"int8: {int8}; activations rounded {alone}",
                f"int8 maps of a few rows: {few}"]


def kernel_report() -> KernelReport:
    """Every kernel probe's answer on this machine (each probe runs once a process)."""
    missing = tuple(private_ops.missing())
    packed = tuple(name for name, dtype in PACKED.items() if affine.packing_works(dtype))
    engines, saturates = None, {}
    if not any(op.startswith("quantized.") for op in missing):
        engines = affine.int8_engines()
        found = set(torch.backends.quantized.supported_engines) & {"fbgemm", "onednn"}
        saturates = {e: affine.int8_saturates(e) for e in sorted(found)}
    return KernelReport(missing, attention_op.status(), packed, engines, saturates,
                        affine.int8_rows_layout(), affine.int8_rows_amx(), affine.rows_alone())
