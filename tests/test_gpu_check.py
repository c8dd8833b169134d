"""`make gpu-check` (scripts/gpu_check.py), the prepared command of a GPU session, and what it
relies on: the checkout's nmt finds its configs beside a plain install of nmt."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_a_checkout_that_no_install_maps_finds_its_configs(tmp_path):
    """`python -m pytest` in a checkout beside a plain install imports the checkout's nmt,
    whose configs/ lies beside it (the GPU session's `Primary config module 'nmt.configs' not
    found`): the editable install's finder, which maps them, is taken out here."""
    for name in ("nmt", "configs"):
        shutil.copytree(ROOT / name, tmp_path / name,
                        ignore=shutil.ignore_patterns("__pycache__"))
    code = ("import sys; sys.meta_path[:] = [f for f in sys.meta_path "
            "if 'editable' not in repr(f).lower()];"
            "import nmt; from nmt.config import compose;"
            "print(nmt.__file__, compose('train', ['+model=big']).model.d_model)")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    path, d_model = out.stdout.split()
    assert Path(path).parent == tmp_path / "nmt" and d_model == "1024"
