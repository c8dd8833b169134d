"""The tests whose kernels depend on the CPU's instruction set (marked isa: int8, bf16, oneDNN
packing, the shape caches) run again here under an AVX2 machine's dispatch, so that a developer
on an AVX-512 / VNNI / bf16 machine sees what fails on an AVX2-only CPU. The variables only cap
each library (ATEN_CPU_CAPABILITY is echoed even where the CPU lacks the ISA): the tier's own
int8 test asserts that the cap reached the int8 kernels (they saturate under it). On a CPU
without AVX-512 every library dispatches so already: the suite's own run is this one (and twice
the time of those tests on a slow AVX2 machine), so it skips."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from nmt.system.runtime import cpu_flags

ROOT = Path(__file__).resolve().parents[2]
# An AVX2 + FMA CPU (AMD Zen 2/3): every library nmt's kernels come from, capped.
AVX2 = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2",
        "MKL_ENABLE_INSTRUCTIONS": "AVX2", "FBGEMM_ENABLE_INSTRUCTIONS": "AVX2",
        "CT2_FORCE_CPU_ISA": "AVX2"}


@pytest.mark.slow
@pytest.mark.skipif(any(os.environ.get(k) for k in AVX2), reason="already under a cap")
@pytest.mark.skipif("avx512f" not in cpu_flags(),
                    reason="a CPU without AVX-512: the suite's own run is AVX2's dispatch")
@pytest.mark.parametrize("tier", ["not long", pytest.param("long", marks=pytest.mark.long)])
def test_the_isa_tests_pass_under_avx2_dispatch(tier):
    """make test runs again its own isa tests, make test-long the long ones."""
    # Only the files that mark tests isa are collected (collecting the whole suite, serve and
    # export stacks included, costs seconds and selects nothing more).
    files = [str(p.relative_to(ROOT)) for p in sorted((ROOT / "tests").rglob("test_*.py"))
             if p.name != Path(__file__).name and "mark.isa" in p.read_text(encoding="utf-8")]
    out = subprocess.run([sys.executable, "-m", "pytest", "-m", f"isa and not gpu and {tier}",
                          "-p", "no:cacheprovider", *files], cwd=ROOT,
                         env={**os.environ, **AVX2}, capture_output=True, text=True, timeout=400)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    passed = re.search(r"^(\d+) passed", out.stdout, re.M)  # setup.cfg's -q: the summary line
    assert passed and int(passed[1]) >= (50 if tier == "not long" else 5), out.stdout[-2000:]
