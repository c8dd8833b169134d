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


def test_the_torch_calls_nmt_relies_on_exist():
    """pyproject's torch floor (2.4) is the oldest release that has all of these (the version
    each arrived in beside it); a newer call needs a fallback or a higher floor."""
    import inspect

    import torch
    import torch.distributed as dist

    from nmt.train import normalise_gradients

    assert "device_id" in inspect.signature(dist.init_process_group).parameters  # 2.3
    assert issubclass(dist.DistError, RuntimeError)  # 2.2
    from torch.nn.attention import SDPBackend, sdpa_kernel  # 2.3

    assert sdpa_kernel and SDPBackend.MATH
    assert not torch.amp.GradScaler("cpu", enabled=False).is_enabled()  # torch.amp: 2.3
    assert issubclass(torch.cuda.OutOfMemoryError, RuntimeError)  # 1.13
    torch.optim.Adam([torch.nn.Parameter(torch.ones(1))], fused=True)  # fused on CPU: 2.4
    assert "dynamic" in inspect.signature(torch.compile).parameters  # 2.0
    g = [torch.ones(2)]
    normalise_gradients(g, torch.tensor(2.0), 1.0)  # _foreach_norm, _foreach_mul_(Tensor): 2.1
    assert g[0].tolist() == [0.5, 0.5]
    requirement = next(line for line in (ROOT / "pyproject.toml").read_text().splitlines()
                       if '"torch' in line)
    assert '"torch>=2.4"' in requirement
