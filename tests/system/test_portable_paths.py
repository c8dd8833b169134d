"""Scripts that run anywhere: no file of the repository's code, configs, scripts or tests names
an absolute path of one machine (a home, a work or data mount, a specific /tmp entry); they
default to paths relative to the repository (work/, ../shared/) or require the argument."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("scripts", "configs", "tests", "nmt")
SUFFIXES = {".py", ".sh", ".yaml", ".yml", ".toml", ".cfg", ".txt"}
TOP = ("Makefile", "pyproject.toml", "setup.cfg")
# A root that names one machine's layout; /dev/null, /proc, /sys, /usr, /bin and /etc are the
# same on every machine and stay allowed.
MACHINE_ROOTS = "|".join(("work", "home", "root", "Users", "mnt", "media", "scratch", "data",
                          "shared", "srv", "opt", "var", "net", "nfs", "gpfs", "lustre"))
# Not after a word, a variable ({work}/data, $HOME/x, ~/x), inside a URL or relative path, or
# in a closing tag (</var>).
PATH = re.compile(rf"(?<![\w.~$:/}})\]<])/(?:(?:{MACHINE_ROOTS})(?=/|\b)|tmp/[\w.-]+)")
# flock's shared CPU lock: a lock file name that any machine creates on first use.
ALLOWED = {"/tmp/nmt-cpu.lock"}


def machine_paths(text: str) -> list[str]:
    """The absolute machine paths in `text` (beyond the allowed ones)."""
    return [m.group(0) for m in PATH.finditer(text) if m.group(0) not in ALLOWED]


def scanned_files() -> list[Path]:
    """The repository's code, config, script and test files (not corpora: scripts/data/*/)."""
    files = [ROOT / name for name in TOP if (ROOT / name).is_file()]
    for top in SCANNED:
        files += [p for p in (ROOT / top).rglob("*")
                  if p.suffix in SUFFIXES and p.is_file() and "__pycache__" not in p.parts]
    return files


def test_the_pattern_finds_machine_paths_and_spares_portable_ones():
    assert machine_paths('default="/work/data/ende8k"') == ["/work"]
    assert machine_paths("RUN=${2:-/home/me/runs}") == ["/home"]
    assert machine_paths("--work /tmp/nmt-bench-preprocess") == ["/tmp/nmt-bench-preprocess"]
    assert machine_paths("cd /root && ls /scratch/x") == ["/root", "/scratch"]
    for fine in ("work/runs", "../shared/data", "/dev/null", "/proc/self", "#!/bin/sh",
                 "https://hydra.cc/docs/1.2/x", "flock /tmp/nmt-cpu.lock", "$HOME/x",
                 "~/wmt14", "a/work/b", "/usr/share/doc", "s/x/y/", 'f"{work}/data"'):
        assert machine_paths(fine) == [], fine


def test_no_file_names_an_absolute_machine_path():
    found = []
    for path in scanned_files():
        if path.name == Path(__file__).name:
            continue  # this file spells the patterns out
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            found += [f"{path.relative_to(ROOT)}:{number}: {p}" for p in machine_paths(line)]
    assert found == [], "\n".join(found)
    assert len(scanned_files()) > 40  # the scan saw the repository
