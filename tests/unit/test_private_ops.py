"""nmt.system.private_ops: the private PyTorch operators nmt keeps are all there (a torch upgrade
that drops one fails here, instead of decoding silently slower), and no other module of nmt
calls a private operator (but the GPU simulation harness nmt.testing.gpu_sim, which stands in for
torch's CUDA kernels and checks its internals itself)."""

import re
from pathlib import Path

import pytest
import torch

from nmt.decoding import affine, attention_op
from nmt.decoding.affine import int8_engines, int8_saturates, packing_works
from nmt.decoding.probes import PACKED, kernel_report
from nmt.system import private_ops

pytestmark = pytest.mark.isa

NMT = Path(__file__).resolve().parents[2] / "nmt"
# torch.ops.nmt is nmt's own operator (nmt.decoding.attention_op), not PyTorch's;
# torch.ops.load_library (which loads it) is public, and so are the overloads of public ATen
# operators (torch.ops.aten.mm.default: what torch.utils.checkpoint's selective policies are
# documented to name); an underscore ATen operator is private
PRIVATE = re.compile(r"torch\.ops\.(?!nmt\b|load_library\b|aten\.[a-z])|"
                     r"torch\._[a-z]|\._get_node\(|"
                     r"_step_supports_amp_scaling|\._get_match_statistics|\._compute_f_score|\._preprocess_segment|"
                     r"\._compute_score_from_stats")


def test_every_private_operator_nmt_keeps_is_present():
    assert private_ops.missing() == []
    if torch.backends.mkldnn.is_available():  # the CPU wheels: the packed path must work
        assert packing_works(torch.float32)


def test_a_fused_optimizer_still_says_it_skips_on_the_device():
    """The private flag of a fused Adam (what GradScaler reads): without it nmt-train's update
    would read the device on every step (nmt.commands.train.optimizer_step)."""
    params = [torch.nn.Parameter(torch.zeros(2))]
    assert private_ops.skips_on_the_device(torch.optim.Adam(params, fused=True))
    assert not private_ops.skips_on_the_device(torch.optim.Adam(params))


def test_every_private_sacrebleu_helper_mbr_uses_is_present_and_the_probe_sees_one_go(
        monkeypatch):
    assert private_ops.sacrebleu_missing() == []
    from sacrebleu.metrics import CHRF

    monkeypatch.delattr(CHRF, "_compute_f_score")
    assert private_ops.sacrebleu_missing() == ["CHRF._compute_f_score"]


def test_mbr_without_sacrebleus_private_helpers_scores_with_the_public_api(monkeypatch):
    from nmt.wings import mbr

    texts = ["the cat sat on the mat", "a cat sat on a mat", "the cat sat", "the cat sat"]
    private = {u: mbr.expected_utilities(texts, u) for u in ("chrf", "bleu")}
    monkeypatch.setattr(mbr, "_by_statistics", lambda: False)
    monkeypatch.setattr(mbr.utility_of("chrf"), "fastchrf", None)
    for utility, want in private.items():
        assert mbr.expected_utilities(texts, utility) == pytest.approx(want, abs=1e-9)


def test_the_probe_names_a_missing_operator(monkeypatch):
    monkeypatch.setattr(private_ops, "OPERATORS", (*private_ops.OPERATORS, "mkldnn._gone"))
    assert private_ops.missing() == ["mkldnn._gone"]


def test_one_report_says_what_every_kernel_probe_found(monkeypatch):
    """nmt.decoding.probes: the private operators, the fused operator (its status stood in
    for: no build here), packing and int8 saturation in each engine, int8_rows' layout, one
    line each."""
    monkeypatch.setattr(attention_op, "status", lambda: None)
    monkeypatch.setattr(affine, "int8_rows_layout", lambda: "vnni")
    monkeypatch.setattr(affine, "int8_rows_amx", lambda: 0)
    report = kernel_report()
    assert report.missing_ops == tuple(private_ops.missing()) == ()
    assert report.packed == tuple(d for d, t in PACKED.items() if packing_works(t))
    assert report.int8_engines == int8_engines()
    assert report.int8_saturates[int8_engines()[1]] == int8_saturates()
    assert all(report.int8_saturates[e] == int8_saturates(e) for e in report.int8_saturates)
    assert report.lines()[:2] == ["private operators: all there",
                                  "fused attention operator: loaded"]
    assert report.lines()[-1] == ("int8 maps of a few rows: nmt::int8_rows' VNNI layout "
                                  "(rows x weights up to 2^25)")
    assert report.rows_alone == affine.rows_alone()
    monkeypatch.setattr(affine, "int8_rows_amx", lambda: 3)
    assert kernel_report().lines()[-1].endswith("(rows x weights up to 2^25), its sums through "
                                                "AMX's tiles from 3 rows")
    assert report.lines()[-2].endswith("; activations rounded each row alone (oneDNN's products "
                                       "of many rows)" if report.rows_alone else "one scale a call")
    monkeypatch.setattr(private_ops, "OPERATORS", (*private_ops.OPERATORS, "mkldnn._gone"))
    monkeypatch.setattr(attention_op, "status", lambda: "no C++ compiler (c++)")
    lines = kernel_report().lines()
    assert lines[:2] == ["private operators: missing mkldnn._gone",
                         "fused attention operator: no C++ compiler (c++)"]
    assert lines[-1] == "int8 maps of a few rows: fbgemm's"


def test_no_module_but_private_ops_calls_a_private_operator():
    offenders = [f"{path.name}:{n}" for path in NMT.rglob("*.py")
                 if path.name not in ("private_ops.py", "gpu_sim.py")
                 for n, line in enumerate(path.read_text().splitlines(), 1)
                 if PRIVATE.search(line.split("#")[0])]
    assert offenders == []
    assert PRIVATE.search("torch.ops.aten._addmm_activation") and PRIVATE.search(
        "torch.ops.mkldnn._linear_pointwise") and not PRIVATE.search("torch.ops.aten.mm.default")
