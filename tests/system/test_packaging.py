"""The configs ship inside the package: a plain (non-editable) install finds them too; the torch
floor is the one `make test-floor` runs on, and has every torch name nmt uses."""

import ast
import importlib
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_wheel_ships_the_configs_not_the_test_harness_and_composes(tmp_path):
    # built from a copy of the tree's files: setuptools' build/ in the checkout would keep
    # whatever an earlier build put there (a file package-data no longer names included)
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"],
                           cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    source = tmp_path / "source"
    for name in files:
        if (ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                    "--no-build-isolation", "-w", str(tmp_path), str(source)], check=True,
                   capture_output=True, timeout=300)
    wheel = next(tmp_path.glob("nmt-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    for yaml in ("train.yaml", "model/base.yaml", "model/big.yaml", "model/small.yaml",
                 "hydra/launcher/slurm.yaml"):
        assert f"nmt/configs/{yaml}" in names
    assert "nmt/serve/page.html" in names  # nmt-serve's GET /
    from nmt.decoding.attention_op import SOURCES  # built just in time, every one
    assert {f"nmt/decoding/{path.name}" for path in SOURCES} <= set(names)
    assert not [n for n in names if n.startswith("nmt/testing/")]  # the tests' GPU harness
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


def version(text: str) -> tuple[int, ...]:
    """'2.6' or '2.6.0+cpu' as (2, 6, 0): release numbers, padded to three."""
    release = [int(x) for x in text.split("+")[0].split(".")[:3]]
    return tuple(release + [0] * (3 - len(release)))


def test_the_torch_floor_is_the_one_make_test_floor_runs():
    """pyproject's floor is the version `make test-floor` runs the suite on, and this torch is
    not older than it."""
    import torch

    (floor,) = [re.fullmatch(r'\s*"torch>=([\d.]+)",', line).group(1)
                for line in (ROOT / "pyproject.toml").read_text().splitlines() if '"torch' in line]
    (tested,) = re.findall(r"^TORCH_FLOOR \?= ([\d.]+)$", (ROOT / "Makefile").read_text(), re.M)
    assert version(floor) == version(tested)
    assert version(torch.__version__) >= version(floor)


def torch_names(source: str) -> set[str]:
    """Every dotted torch name a module's source uses: its torch imports, and the attribute
    chains on them (`F.softmax` after `import torch.nn.functional as F` is
    torch.nn.functional.softmax)."""
    tree = ast.parse(source)
    alias = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            alias |= {a.asname or "torch": a.name if a.asname else "torch"
                      for a in node.names if a.name.split(".")[0] == "torch"}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "torch":
            alias |= {a.asname or a.name: f"{node.module}.{a.name}" for a in node.names}
    names = set(alias.values())
    for node in ast.walk(tree):
        chain = []
        while isinstance(node, ast.Attribute):
            chain.append(node.attr)
            node = node.value
        if chain and isinstance(node, ast.Name) and node.id in alias:
            names.add(".".join([alias[node.id], *reversed(chain)]))
    return names


def resolves(name: str) -> bool:
    """Whether torch has the dotted name (an attribute, or a submodule once imported)."""
    parts = name.split(".")
    obj = importlib.import_module(parts[0])
    for i, part in enumerate(parts[1:], 2):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            try:
                obj = importlib.import_module(".".join(parts[:i]))
            except ImportError:
                return False
    return True


def test_every_torch_name_nmt_uses_exists_in_this_torch():
    """Run on the floor torch (`make test-floor`), a name newer than the floor fails here even
    where no test reaches the code that uses it. The GPU simulation harness (nmt/testing/gpu_sim.py)
    is left out: it probes the torch internals it needs itself, and its tests skip without; so
    are nmt's own operators (torch.ops.nmt, defined when nmt.decoding.attention_op loads them)."""
    used = {name: path.relative_to(ROOT) for path in sorted((ROOT / "nmt").rglob("*.py"))
            if path.name != "gpu_sim.py"
            for name in torch_names(path.read_text()) if not name.startswith("torch.ops.nmt.")}
    assert len(used) > 50  # the scan sees nmt's torch calls
    assert {name: str(path) for name, path in used.items() if not resolves(name)} == {}


def test_the_torch_arguments_nmt_relies_on_exist():
    """What the name scan cannot see: keyword arguments and behaviour (the version each arrived
    in beside it)."""
    import inspect

    import torch
    import torch.distributed as dist

    assert "device_id" in inspect.signature(dist.init_process_group).parameters  # 2.3
    assert issubclass(dist.DistError, RuntimeError)  # 2.2
    assert issubclass(torch.cuda.OutOfMemoryError, RuntimeError)  # 1.13
    assert not torch.amp.GradScaler("cpu", enabled=False).is_enabled()  # torch.amp: 2.3
    torch.optim.Adam([torch.nn.Parameter(torch.ones(1))], fused=True)  # fused on CPU: 2.4
    assert "dynamic" in inspect.signature(torch.compile).parameters  # 2.0
