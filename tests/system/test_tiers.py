"""The suite in tiers: tests/unit, tests/integration, tests/system and tests/wings are folders;
`make test` runs every test but those marked long, `make test-long` those, and .ci/run both in
turn; `make test-quick` runs the unit, integration and wings tiers without the tests marked slow
(every long test is slow too).

A `-m` filter in setup.cfg's addopts would silently drop tests from `make test` (and from CI); a
misspelt marker would silently put a slow test into the quick tier; a test file outside the tier
folders (or in a misspelt one) would silently leave the quick tier. All are checked here.
"""

import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
TIERS = ("unit", "integration", "system", "wings")
QUICK = ("unit", "integration", "wings")
SELECTING = ("-m", "-k", "--deselect", "--ignore", "--lf", "--last-failed", "--sw")


def pytest_args(target: str) -> list[str]:
    """The arguments the Makefile target's recipe passes to pytest (its one pytest line)."""
    lines = (ROOT / "Makefile").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"{target}:"))
    recipe = []
    for line in lines[start + 1:]:
        if not line.startswith("\t"):
            break
        recipe.append(line)
    (command,) = [line for line in recipe if " -m pytest" in line]
    return shlex.split(command.split(" -m pytest", 1)[1])


def test_the_ini_selects_no_tests_and_rejects_unknown_markers(pytestconfig):
    assert pytestconfig.inipath == ROOT / "setup.cfg"  # no pytest.ini / tox.ini overriding it
    addopts = pytestconfig.getini("addopts")
    assert not [a for a in addopts if a.startswith(SELECTING)], addopts
    assert "--strict-markers" in addopts  # @pytest.mark.slwo is an error, not a quick test
    registered = {m.split(":")[0] for m in pytestconfig.getini("markers")}
    assert {"slow", "gpu"} <= registered
    assert pytestconfig.getini("testpaths") == ["tests"]  # every tier, not some


def test_every_test_file_lies_in_one_tier_folder_under_a_name_of_its_own():
    files = sorted(TESTS.rglob("test_*.py"))
    assert [f for f in files if f.parent.parent != TESTS or f.parent.name not in TIERS] == []
    names = [f.name for f in files]
    assert len(names) == len(set(names))  # pytest imports them by basename
    assert all(list((TESTS / tier).glob("test_*.py")) for tier in TIERS)


def test_make_test_and_make_test_long_split_the_suite_and_ci_runs_both():
    # the ini alone selects, and it selects nothing (worksteal: how the two workers share)
    assert pytest_args("test") == ["-m", "not long", "-n", "2", "--dist", "worksteal"]
    assert pytest_args("test-long") == ["-m", "long", "-n", "2", "--dist", "worksteal"]
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines()
          if line and not line.startswith(("#", "set ", "cd "))]
    assert ci == ["make test", "make test-long"]
    assert not [a for a in pytest_args("test-floor") if a.startswith(SELECTING)]
    quick = pytest_args("test-quick")
    assert quick[:4] == ["-m", "not slow", "-n", "2"]  # two xdist workers
    assert quick[4:] == [f"tests/{tier}" for tier in QUICK]  # the system tier waits for make test
    assert pytest_args("test-slow") == ["-m", "slow"]


def test_the_slow_and_long_tiers_are_not_empty():
    texts = {p.name: p.read_text() for p in TESTS.rglob("test_*.py")}
    for marker in ("slow", "long"):
        marked = [name for name, text in texts.items() if f"pytest.mark.{marker}" in text]
        assert len(marked) >= 3, (marker, marked)


def test_a_long_test_is_marked_slow_at_collection():
    """conftest's hook: make test-quick's -m "not slow" leaves the long tests out too."""
    from conftest import pytest_collection_modifyitems

    class Item:
        def __init__(self, *markers):
            self.markers = set(markers)

        def get_closest_marker(self, name):
            return name if name in self.markers else None

        def add_marker(self, mark):
            self.markers.add(mark.name)

    items = [Item("long"), Item("long", "slow"), Item(), Item("slow")]
    pytest_collection_modifyitems(items)
    assert [sorted(item.markers) for item in items] == [
        ["long", "slow"], ["long", "slow"], [], ["slow"]]
