"""Beyond one machine: two torchrun "nodes" through the c10d rendezvous, SLURM tasks through
Hydra's submitit launcher, each equal to one process with update_freq 2; the SLURM launcher
config (hydra/launcher=slurm) composed, validated by submitit and turned into its sbatch script
without a cluster. Every address is 127.0.0.1 (gloo on the loopback interface)."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import make_data_dir

from nmt.commands.train import train
from nmt.config import TrainConfig, compose, to_object
from nmt.training.checkpoint import load_checkpoint

BIN = Path(sys.executable).parent
TINY = ["+model=small", "model.N=1", "model.d_model=32", "model.d_ff=64", "model.h=4",
        "model.dropout=0.1", "train.max_tokens=256", "train.save_interval_updates=3",
        "train.valid_interval_updates=3", "train.log_interval=1", "train.max_updates=3",
        "train.device=cpu", "train.plot=false", "train.tensorboard=false"]  # neither to load
LOOPBACK = {"GLOO_SOCKET_IFNAME": "lo", "MASTER_ADDR": "127.0.0.1", "OMP_NUM_THREADS": "1"}


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def environment() -> dict:
    """This venv's console scripts first on PATH, one thread, loopback only."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    return {**env, **LOOPBACK, "PATH": f"{BIN}{os.pathsep}{env['PATH']}"}


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return make_data_dir(tmp_path_factory.mktemp("launch") / "data", n_train=150)


@pytest.fixture(scope="module")
def one_process(data, tmp_path_factory) -> dict:
    """The reference: one process, two batches per update, 3 updates."""
    run = tmp_path_factory.mktemp("launch") / "single"
    train(to_object(compose("train", [f"data_dir={data}", f"run_dir={run}", *TINY,
                                      "train.update_freq=2", "train.threads=1"]), TrainConfig))
    return load_checkpoint(run / "checkpoint_3.pt")


def assert_same_model(run: Path, reference: dict) -> None:
    """Two ranks' checkpoint_3.pt equals the one-process reference."""
    state = load_checkpoint(run / "checkpoint_3.pt")
    for name, p in reference["model"].items():
        torch.testing.assert_close(state["model"][name], p, rtol=0, atol=1e-5, msg=name)
    assert state["iterator"]["consumed"] == 3 and reference["iterator"]["consumed"] == 6


@pytest.mark.long
def test_two_nodes_through_the_c10d_rendezvous(data, one_process, tmp_path):
    run, port = tmp_path / "run", free_port()
    nodes = []
    for node in (0, 1):  # what each machine runs; is_host: node 0 serves the rendezvous store
        cmd = [str(BIN / "torchrun"), "--nnodes", "2", "--nproc_per_node", "1",
               "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
               "--rdzv-id", "nmt-test", "--rdzv-conf", f"is_host={int(node == 0)}",
               "--local-addr", "127.0.0.1", "--no-python", "nmt-train",
               f"data_dir={data}", f"run_dir={run}", *TINY]
        nodes.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True, env=environment(), cwd=tmp_path))
    outputs = [p.communicate(timeout=240)[0] for p in nodes]
    assert [p.returncode for p in nodes] == [0, 0], "\n".join(o[-3000:] for o in outputs)
    assert "device cpu x 2" in "".join(outputs)  # one rank on each "node"
    assert_same_model(run, one_process)


@pytest.mark.long
def test_submitit_tasks_are_ddp_ranks(data, one_process, tmp_path):
    """hydra/launcher=submitit_local with 2 tasks: the code path of a SLURM job's tasks."""
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    run = tmp_path / "run"
    env = {**environment(), "MASTER_PORT": str(free_port())}
    out = subprocess.run([str(BIN / "nmt-train"), "-m", "hydra/launcher=submitit_local",
                          "hydra.launcher.tasks_per_node=2", f"data_dir={data}",
                          f"run_dir={run}", *TINY], capture_output=True, text=True, env=env,
                         cwd=tmp_path, timeout=240)
    logs = "".join(p.read_text() for p in tmp_path.glob("multirun/*/.submitit/*/*_log.*"))
    assert out.returncode == 0, out.stderr[-3000:] + logs[-3000:]
    assert "global_rank=1(2)" in logs and "device cpu x 2" in logs
    assert_same_model(run, one_process)


PROBE = """
import json, submitit
captured = {}
def map_array(self, fn, *job_args):  # what the launcher would submit, not submitted
    captured["jobs"] = len(job_args[0])
    captured["sbatch"] = self._executor._make_submission_file_text("python -m X", "uid")
    return []
submitit.AutoExecutor.map_array = map_array
from nmt.cli.train import main
main()
print("CAPTURED " + json.dumps(captured))
"""


@pytest.mark.slow
def test_the_slurm_launcher_config_composes_and_validates(tmp_path):
    """hydra/launcher=slurm through the plugin's own launch(): submitit checks every parameter
    and writes the sbatch script; only the submission is replaced (a fake srun on PATH makes
    submitit believe it is on a cluster; nothing calls it)."""
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "srun").write_text("#!/bin/sh\nexit 1\n")
    (fake / "srun").chmod(0o755)
    env = {**environment(), "PATH": f"{fake}{os.pathsep}{environment()['PATH']}"}
    out = subprocess.run([sys.executable, "-c", PROBE, "-m", "hydra/launcher=slurm",
                          "hydra.launcher.nodes=2", "hydra.launcher.partition=gpu",
                          "+model=base", "data_dir=d", "run_dir=r",
                          f"hydra.sweep.dir={tmp_path / 'sweep'}"],
                         capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    captured = json.loads(out.stdout.split("CAPTURED ", 1)[1])
    assert captured["jobs"] == 1
    sbatch = captured["sbatch"].splitlines()
    for line in ("#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=8", "#SBATCH --gpus-per-node=8",
                 "#SBATCH --cpus-per-task=8", "#SBATCH --partition=gpu",
                 "#SBATCH --time=4320", "#SBATCH --signal=USR2@120",
                 "export SUBMITIT_EXECUTOR=slurm"):
        assert line in sbatch, captured["sbatch"]
    assert not (tmp_path / "r").exists()  # nothing trained


@pytest.mark.slow
def test_bad_launcher_values_are_one_line():
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    out = subprocess.run([str(BIN / "nmt-train"), "-m", "hydra/launcher=slurm",
                          "hydra.launcher.nodes=two", "+model=base", "data_dir=d", "run_dir=r"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1
    assert out.stderr.splitlines() == [
        "nmt-train: error: hydra.launcher.nodes: Value 'two' of type 'str' could not be "
        "converted to Integer"]
