"""The configs ship inside the package: a plain (non-editable) install finds them too."""

import os
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_wheel_ships_the_configs_and_composes_from_them(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                    "--no-build-isolation", "-w", str(tmp_path), str(ROOT)], check=True,
                   capture_output=True, timeout=300)
    wheel = next(tmp_path.glob("nmt-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    for yaml in ("train.yaml", "model/base.yaml", "model/big.yaml", "model/small.yaml",
                 "hydra/launcher/slurm.yaml"):
        assert f"nmt/configs/{yaml}" in names
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    code = ("import nmt, sys; from nmt.config import compose;"
            "cfg = compose('train', ['+model=big']);"
            "print(nmt.__file__, cfg.model.d_model)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(site)}, timeout=120)
    assert out.returncode == 0, out.stderr
    path, d_model = out.stdout.split()
    assert path.startswith(str(site)) and d_model == "1024"


def test_the_all_extra_pulls_every_optional_extra():
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    (pulled,) = extras["all"]
    name, _, rest = pulled.partition("[")
    assert name == project["name"]
    named = set(rest.rstrip("]").split(","))
    assert set(extras) - {"dev", "all"} <= named  # every extra defined here
    assert {"plot", "tensorboard", "export", "serve", "slurm"} <= named
