"""scripts/bench_sweep.py (issue 60, item 5), a smoke test on a tiny checkpoint: every row of
the sweep is there, both sides timed in every round, a ratio per row, the time per output
token at batch 1, and the header that says what the figures were measured on. No timing is
checked: this machine's figures are not results."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def sweep(monkeypatch):
    """The script as a module (scripts/ on the path for the bench modules it imports)."""
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    spec = importlib.util.spec_from_file_location("bench_sweep", ROOT / "scripts/bench_sweep.py")
    module = sys.modules["bench_sweep"] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(sweep, tmp_path, ckpt, source, *options: str) -> dict:
    """Run the sweep on 3 sentences, 2 rounds; its --json."""
    out = tmp_path / "sweep.json"
    sweep.main(["--checkpoint", str(ckpt), "--input", str(source), "--sentences", "3",
                "--rounds", "2", "--workers", "2", "--json", str(out), *options])
    return json.loads(out.read_text(encoding="utf-8"))


def check_rows(result: dict, expected: set[tuple[str, str, str]]) -> None:
    """The rows are those expected, each with both sides timed twice and a ratio."""
    rows = result["rows"]
    assert {(r["mode"], r["search"], r["batch"]) for r in rows} == expected
    for r in rows:
        assert r["nmt"]["runs"] == r["ct2"]["runs"] == 2, r
        # the ratio of the medians, rounded to 3 decimals; the seconds are rounded to 4 (at a
        # few milliseconds a run, over 1%)
        ct2, nmt = r["ct2"]["seconds"], r["nmt"]["seconds"]
        low, high = (ct2 - 5e-5) / (nmt + 5e-5), (ct2 + 5e-5) / max(nmt - 5e-5, 1e-9)
        assert low - 5e-4 <= r["ratio"] <= high + 5e-4, r
    head = result["header"]
    assert head["cpu"].startswith("CPU: ") and "caps: " in head["cpu"]
    assert head["torch"] and head["ctranslate2"] and head["sentences"] == 3
    assert {"load_before", "load_after"} <= head.keys()


@pytest.mark.slow
def test_decode_only_rows_at_fixed_batches_and_each_sides_best(sweep, tmp_path, ckpts, test_en,
                                                                capsys):
    result = run(sweep, tmp_path, ckpts[0], test_en, "--modes", "decode", "--batches", "1,4",
                 "--max-tokens", "64,128", "--ct2-batches", "4,8", "--layouts", "2x1,1x2")
    check_rows(result, {("decode", s, b) for s in ("greedy", "beam4") for b in ("1", "4", "best")})
    for r in result["rows"]:
        assert ("ms_per_token" in r["nmt"]) == ("ms_per_token" in r["ct2"]) == (r["batch"] == "1")
        assert r["nmt"]["output_tokens"] > 0 and r["ct2"]["output_tokens"] > 0
        if r["batch"] == "best":  # each from its own sweep
            assert r["nmt"]["setting"] in ("max_tokens=64", "max_tokens=128")
            assert r["ct2"]["setting"] in {f"B={b} {lay}" for b in (4, 8)
                                           for lay in ("2x1", "1x2")}
        else:
            assert r["nmt"]["setting"] == f"max_sentences={r['batch']}"
            assert r["ct2"]["setting"] == f"B={r['batch']} 2x1"
    printed = capsys.readouterr().out
    assert "nmt/CT2" in printed and "ms/token" in printed and "load average" in printed


@pytest.mark.long
def test_whole_process_rows_run_nmt_translate_against_the_ct2_script(sweep, tmp_path, ckpts,
                                                                     test_en):
    result = run(sweep, tmp_path, ckpts[0], test_en, "--modes", "whole", "--searches",
                 "greedy", "--batches", "1", "--max-tokens", "128", "--ct2-batches", "4",
                 "--layouts", "1x2")
    check_rows(result, {("whole", "greedy", "1"), ("whole", "greedy", "best")})
    best = next(r for r in result["rows"] if r["batch"] == "best")
    assert (best["nmt"]["setting"], best["ct2"]["setting"]) == ("max_tokens=128", "B=4 1x2")


def test_the_same_limit_stops_nmt_where_ctranslate2_stops(sweep):
    """--same-limit: nmt's outputs stop at CTranslate2's default limit (256 tokens, whatever
    the source's length); without it, at nmt's own max_len_a * S + max_len_b."""
    from nmt.config import SearchConfig

    same = sweep.nmt_search(4, "int8", 1, same_limit=True)
    own = sweep.nmt_search(4, "int8", 1)
    assert (same.max_len_a, same.max_len_b) == (0.0, sweep.CT2_MAX_DECODING_LENGTH) == (0.0, 256)
    assert (own.max_len_a, own.max_len_b) == (SearchConfig().max_len_a, SearchConfig().max_len_b)
    assert not sweep.parse_args(["--checkpoint", "c"]).same_limit
    assert sweep.parse_args(["--checkpoint", "c", "--same-limit"]).same_limit
