"""int8 against fp32 in translation quality, nmt and CTranslate2, on this CPU's dispatch
(docs/results.md, "int8 on every CPU").

One checkpoint, the test split, beam --beam with alpha 0 (CTranslate2's beam search has no
GNMT penalty): BLEU and chrF (sacreBLEU) of nmt-translate with engine=nmt and
engine=ctranslate2 (the same cached export), search.dtype fp32 and int8. Without VNNI (or
under ONEDNN_MAX_CPU_ISA=AVX2) nmt's int8 keeps 7-bit activations (nmt.decoding.affine
.int8_saturates); the row "nmt int8, 8-bit activations" runs the old path, which saturates
there, to show what the probe avoids. The header names the CPU and every cap in force: run it
under AVX2 dispatch on a bigger machine with the variables of tests/system/test_isa.py.

    flock /tmp/nmt-cpu.lock .venv/bin/python scripts/bench_int8.py \\
        --checkpoint RUN/averaged.pt --src CORPUS/test.en.xz --ref CORPUS/test.de.xz
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

import torch

from nmt.commands.translate import translate
from nmt.config import TranslateConfig, compose, to_object
from nmt.decoding import affine
from nmt.decoding.probes import kernel_report
from nmt.metrics.scoring import score
from nmt.system.files import read_lines
from nmt.system.runtime import cpu_bf16, cpu_flags

CAPS = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS",
        "FBGEMM_ENABLE_INSTRUCTIONS", "CT2_FORCE_CPU_ISA")
ROWS = [("nmt", "fp32", "nmt fp32"), ("nmt", "int8", "nmt int8"),
        ("nmt", "int8-8bit", "nmt int8, 8-bit activations"),
        ("ctranslate2", "fp32", "ctranslate2 fp32"), ("ctranslate2", "int8", "ctranslate2 int8")]


def parse_args() -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--src", required=True, help="test source, a segment a line (.xz too)")
    p.add_argument("--ref", required=True, help="its reference translations")
    p.add_argument("--beam", type=int, default=4)
    return p.parse_args()


def describe_cpu() -> str:
    """The CPU's name, its int8 and bf16 instructions, the caps in force, then the kernel
    probes' answers (nmt.decoding.probes: int8 saturation among them), a line each."""
    name = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                 if line.startswith("model name")), "unknown")
    flags = sorted(f for f in cpu_flags() if f in ("avx2", "avx512f", "avx512_vnni",
                                                     "avx_vnni", "avx512_bf16", "amx_bf16"))
    caps = " ".join(f"{k}={os.environ[k]}" for k in CAPS if os.environ.get(k)) or "none"
    return (f"CPU: {name}; flags {' '.join(flags)}; caps: {caps}; ATen dispatch "
            f"{torch.backends.cpu.get_cpu_capability()}; bf16: {cpu_bf16().why}\n"
            + "\n".join(kernel_report().lines()))


def run(args, engine: str, dtype: str, out: Path) -> list[str]:
    """nmt-translate's output of the test split with one engine and search.dtype (int8-8bit:
    nmt's int8 with 8-bit activations whatever the CPU, the path before the probe; the forked
    workers inherit the patch)."""
    probe = affine.int8_saturates
    if dtype == "int8-8bit":
        affine.int8_saturates = lambda engine=None: False
    try:
        translate(to_object(compose("translate", [
            f"checkpoint={args.checkpoint}", f"input={args.src}", f"output={out}",
            f"engine={engine}", f"search.dtype={dtype.split('-')[0]}",
            f"search.beam_size={args.beam}", "search.alpha=0", "quiet=true"]), TranslateConfig))
    finally:
        affine.int8_saturates = probe
    return read_lines(str(out))


def main() -> None:
    """Print the table."""
    args = parse_args()
    print(describe_cpu())
    refs = read_lines(args.ref)
    print(f"{'row':32} {'BLEU':>6} {'chrF':>6}")
    with tempfile.TemporaryDirectory() as tmp:
        for engine, dtype, label in ROWS:
            hyps = run(args, engine, dtype, Path(tmp) / f"{engine}-{dtype}.txt")
            s = score(hyps, refs)
            print(f"{label:32} {s.bleu:6.2f} {s.chrf:6.2f}", flush=True)


if __name__ == "__main__":
    main()
