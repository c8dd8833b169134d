"""nmt-translate beyond one file in, one out: ensembles, sampling, prefixes, pair scoring,
interactive standard input, int8/bf16, several processes under torchrun."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import make_data_dir
from translate_helpers import lines_of, save_tiny_checkpoint
from translate_helpers import translate_config as config

from nmt.commands.translate import translate
from nmt.config import ConfigError
from nmt.decoding.batches import length_penalty
from nmt.errors import NmtError

pytestmark = pytest.mark.usefixtures("one_thread")

BIN = Path(sys.executable).parent
CLI = str(BIN / "nmt-translate")


def write(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def error_of(**kw) -> str:
    with pytest.raises(NmtError) as e:
        translate(config(**kw))
    assert "\n" not in str(e.value)
    return str(e.value)


# ----------------------------------------------------------------------------- ensembles
@pytest.mark.slow
def test_an_ensemble_on_the_command_line(ckpts, test_en, tmp_path):
    a, b = ckpts
    one = translate(config(checkpoint=a, input=test_en, output=tmp_path / "a"))
    same = translate(config(checkpoint=f"[{a},{a}]", input=test_en, output=tmp_path / "aa"))
    both = translate(config(checkpoint=f"[{a},{b}]", input=test_en, output=tmp_path / "ab"))
    assert same.hypotheses == one.hypotheses
    assert both.hypotheses != one.hypotheses
    assert lines_of(tmp_path / "ab") == both.hypotheses


def test_an_ensemble_with_another_vocabulary_is_one_line_error(ckpts, test_en, tmp_path):
    other = make_data_dir(tmp_path / "other", vocab_size=100, seed=1)
    c = save_tiny_checkpoint(tmp_path / "c.pt", (other / "spm.model").read_bytes(), seed=2)
    message = error_of(checkpoint=f"[{ckpts[0]},{c}]", input=test_en)
    assert message.startswith(f"{c}: vocabulary differs from {ckpts[0]}'s")
    assert "an ensemble needs one vocabulary" in message
    with pytest.raises(ConfigError, match="checkpoint: must be a path or a list"):
        config(checkpoint="[]", input=test_en)


# ----------------------------------------------------------------------------- sampling
@pytest.mark.slow
def test_sampling_writes_n_samples_per_line_reproducibly(ckpts, test_en, tmp_path):
    kw = {"checkpoint": ckpts[0], "input": test_en, "search.sampling": "true",
          "search.nbest": 3, "search.top_p": 0.9, "search.seed": 3}
    first = translate(config(output=tmp_path / "s1", **kw))
    translate(config(output=tmp_path / "s2", workers=2, **kw))
    assert lines_of(tmp_path / "s1") == lines_of(tmp_path / "s2")
    rows = [line.split(" ||| ") for line in lines_of(tmp_path / "s1")]
    n = len(lines_of(test_en))
    assert [int(r[0]) for r in rows] == [i for i in range(n) for _ in range(3)]
    assert len(first.nbest) == n and all(len(h) == 3 for h in first.nbest)
    translate(config(output=tmp_path / "s3", **{**kw, "search.seed": 4}))
    assert lines_of(tmp_path / "s3") != lines_of(tmp_path / "s1")


# ----------------------------------------------------------------------------- prefixes
@pytest.mark.slow
def test_prefixes_from_a_tsv_column(ckpts, test_en, tmp_path):
    sources = lines_of(test_en)[:6]
    prefixes = ["Nepo", "", "Evas Elif", "Nepo", "Esolc", "Pleh Weiv"]
    tsv = write(tmp_path / "in.tsv", [f"{s}\t{p}" for s, p in zip(sources, prefixes,
                                                                   strict=True)])
    for beam in (1, 4):
        out = translate(config(checkpoint=ckpts[0], input=tsv, output=tmp_path / "h",
                               prefix="true", **{"search.beam_size": beam}))
        for hyp, p in zip(out.hypotheses, prefixes, strict=True):
            assert hyp.startswith(p)
    free = translate(config(checkpoint=ckpts[0], input=write(tmp_path / "in.en", sources),
                            output=tmp_path / "f", **{"search.beam_size": 4}))
    assert out.hypotheses[1] == free.hypotheses[1]  # an empty prefix changes nothing
    write(tmp_path / "bad.tsv", [f"{sources[0]}\tNepo", sources[1]])
    assert error_of(checkpoint=ckpts[0], input=tmp_path / "bad.tsv", prefix="true") == (
        f"{tmp_path / 'bad.tsv'}: line 2 is not source<TAB>prefix (0 TABs)")


def test_no_repeat_ngram_size_on_the_command_line(ckpts, test_en, tmp_path):
    out = translate(config(checkpoint=ckpts[0], input=test_en, output=tmp_path / "h",
                           **{"search.no_repeat_ngram_size": 1, "search.max_len_b": 20}))
    for hyps in out.nbest:
        assert len(set(hyps[0].tokens)) == len(hyps[0].tokens)


# ----------------------------------------------------------------------------- scoring pairs
@pytest.mark.slow
def test_score_reference_with_ref_or_tsv(ckpts, test_en, tiny_data_dir, tmp_path):
    ref = tiny_data_dir / "test.clean.de"
    out = tmp_path / "scores"
    result = translate(config(checkpoint=ckpts[0], input=test_en, ref=ref, output=out,
                              score_reference="true", **{"search.max_tokens": 50}))
    rows = [line.split("\t") for line in lines_of(out)]
    assert len(rows) == len(lines_of(test_en)) and all(len(r) == 3 for r in rows)
    for (logp, score, n), pair in zip(rows, result.pairs, strict=True):
        assert float(logp) < 0 and int(n) == len(pair.tokens) + 1
        assert float(score) == pytest.approx(float(logp) / length_penalty(int(n), 0.6),
                                             abs=1e-3)
    tsv = write(tmp_path / "pairs.tsv", [f"{s}\t{t}" for s, t in zip(
        lines_of(test_en), lines_of(ref), strict=True)])
    translate(config(checkpoint=ckpts[0], input=tsv, output=tmp_path / "tsv_scores",
                     score_reference="true"))
    for a, b in zip(lines_of(tmp_path / "tsv_scores"), lines_of(out), strict=True):
        assert [float(x) for x in a.split("\t")] == pytest.approx(  # other batches
            [float(x) for x in b.split("\t")], abs=2e-4)
    # the ensemble's log P is the mean of its models'
    translate(config(checkpoint=ckpts[1], input=tsv, output=tmp_path / "b",
                     score_reference="true"))
    translate(config(checkpoint=f"[{ckpts[0]},{ckpts[1]}]", input=tsv,
                     output=tmp_path / "ab", score_reference="true"))
    for a, b, ab in zip(*(lines_of(tmp_path / n) for n in ("tsv_scores", "b", "ab")),
                        strict=True):
        mean = (float(a.split("\t")[0]) + float(b.split("\t")[0])) / 2
        assert float(ab.split("\t")[0]) == pytest.approx(mean, abs=2e-4)


# ----------------------------------------------------------------------------- interactive
@pytest.mark.slow
def test_interactive_stdin_answers_each_line_before_the_next(ckpts, test_en, tmp_path):
    sources = lines_of(test_en)[:4]
    expected = translate(config(checkpoint=ckpts[0], input=write(tmp_path / "in", sources),
                                output=tmp_path / "out")).hypotheses
    proc = subprocess.Popen([CLI, f"checkpoint={ckpts[0]}", "search.max_len_b=8", "quiet=true"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        for source, translation in zip(sources, expected, strict=True):
            proc.stdin.write(source.encode() + b"\n")
            proc.stdin.flush()  # the pipe stays open: only an answer per line can come back
            assert proc.stdout.readline().decode().rstrip("\n") == translation
        proc.stdin.close()
        assert proc.stdout.read() == b""
        assert proc.wait(timeout=60) == 0, proc.stderr.read().decode()
    finally:
        proc.kill()


# ----------------------------------------------------------------------------- dtypes
@pytest.mark.slow
def test_int8_and_bf16_translate_and_fp16_needs_cuda(ckpts, test_en, tmp_path):
    for dtype in ("bf16", "int8"):
        out = translate(config(checkpoint=ckpts[0], input=test_en, output=tmp_path / dtype,
                               **{"search.dtype": dtype}))
        assert len(out.hypotheses) == len(lines_of(test_en))
    assert error_of(checkpoint=ckpts[0], input=test_en, device="cpu",
                    **{"search.dtype": "fp16"}).startswith("search.dtype: fp16 needs a GPU")


# ----------------------------------------------------------------------------- torchrun
@pytest.mark.long
def test_two_processes_under_torchrun_write_one_output_in_order(ckpts, test_en, tmp_path):
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
           "OMP_NUM_THREADS": "1", "TORCH_DISTRIBUTED_DEBUG": "DETAIL"}  # a lone collective fails
    for kw in (["search.beam_size=4"], ["search.sampling=true", "search.nbest=2"]):
        # one process: nmt-translate's function here (its command line: test_translate.py)
        translate(config(checkpoint=ckpts[0], input=test_en, output=tmp_path / "one",
                         **dict(arg.split("=") for arg in kw)))
        proc = subprocess.run(
            [str(BIN / "torchrun"), "--standalone", "--nproc_per_node", "2", "--no-python",
             "nmt-translate", f"checkpoint={ckpts[0]}", f"input={test_en}",
             f"output={tmp_path / 'two'}", "search.max_len_b=8", *kw],
            capture_output=True, text=True, env=env, timeout=180)
        assert proc.returncode == 0, proc.stderr[-3000:]
        two, one = ([line.split(" ||| ") for line in lines_of(tmp_path / name)]
                    for name in ("two", "one"))
        assert [r[:2] for r in two] == [r[:2] for r in one]
        assert [float(r[-1]) for r in two if len(r) == 3] == pytest.approx(
            [float(r[-1]) for r in one if len(r) == 3], abs=2e-4)
        assert proc.stderr.count("translated 40 lines") == 1  # rank 0 reports, alone
