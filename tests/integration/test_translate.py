"""nmt-translate: the contract commands, I/O rules, n-best format, scoring, pictures, bad input."""

import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import make_data_dir
from translate_helpers import lines_of, save_tiny_checkpoint
from translate_helpers import translate_config as config

from nmt.commands.translate import translate
from nmt.data.tokenizer import vocab_sha256
from nmt.decoding.batches import translate_ids
from nmt.engines.translator import Translator
from nmt.errors import NmtError
from nmt.metrics.scoring import score
from nmt.training.checkpoint import load_checkpoint, save_checkpoint

pytestmark = pytest.mark.usefixtures("one_thread")

CLI = str(Path(sys.executable).parent / "nmt-translate")


@pytest.fixture(scope="module")
def ckpt(tiny_data_dir, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("run") / "checkpoint_last.pt"
    return save_tiny_checkpoint(path, (tiny_data_dir / "spm.model").read_bytes(), seed=0)


def cli(*args: str, stdin: bytes = b"") -> subprocess.CompletedProcess:
    return subprocess.run([CLI, *args, "search.max_len_b=8"], input=stdin,
                          capture_output=True, timeout=300)


# ----------------------------------------------------------------------------- the contract
@pytest.mark.slow
def test_contract_file_to_file_with_ref_prints_bleu_and_chrf(ckpt, tiny_data_dir, test_en,
                                                             tmp_path):
    hyp = tmp_path / "hyp.de"
    ref = tiny_data_dir / "test.clean.de"
    done = cli(f"checkpoint={ckpt}", f"input={test_en}", f"output={hyp}",
               "search.beam_size=4", f"ref={ref}")
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout == b""
    assert len(lines_of(hyp)) == len(lines_of(test_en))
    err = done.stderr.decode()
    expected = score(lines_of(hyp), lines_of(ref))
    assert expected.bleu_line in err and expected.chrf_line in err
    assert "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:" in err
    assert "nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no|version:" in err
    assert not list(tmp_path.glob(".*tmp"))  # written atomically


@pytest.mark.slow
def test_contract_stdin_to_stdout_carries_only_translations(ckpt, test_en, tmp_path):
    done = cli(f"checkpoint={ckpt}", "search.beam_size=1", stdin=test_en.read_bytes())
    assert done.returncode == 0, done.stderr.decode()
    out = done.stdout.decode().split("\n")[:-1]
    result = translate(config(checkpoint=ckpt, input=test_en, output=tmp_path / "h",
                              **{"search.beam_size": 1}))
    assert out == result.hypotheses


@pytest.mark.slow
def test_a_missing_checkpoint_is_one_line_and_exit_status_1(tmp_path):
    done = cli(f"checkpoint={tmp_path / 'nope.pt'}", stdin=b"hello\n")
    assert done.returncode == 1
    assert done.stderr.decode().strip().splitlines() == [
        f"nmt-translate: error: {tmp_path / 'nope.pt'}: checkpoint not found"]


# ----------------------------------------------------------------------------- I/O rules
def test_translations_match_the_search_and_keep_input_order(ckpt, test_en, tmp_path):
    result = translate(config(checkpoint=ckpt, input=test_en, output=tmp_path / "h"))
    tr = Translator.load(ckpt, dtype=None)
    src = tr.src_tok.encode(lines_of(test_en))
    ids = translate_ids(tr.model, src, config(checkpoint=ckpt).search, tr.specials)
    assert result.hypotheses == tr.tgt_tok.decode(ids) == lines_of(tmp_path / "h")


def test_a_pipe_or_a_device_as_output_is_written_into_not_replaced(ckpt, test_en, named_pipe,
                                                                  null_device):
    pipe, read = named_pipe
    src = pipe.parent / "in.en"
    src.write_text("".join(lines_of(test_en)[i] + "\n" for i in range(4)), encoding="utf-8")
    result = translate(config(checkpoint=ckpt, input=src, output=pipe))
    assert read().decode().splitlines() == result.hypotheses
    translate(config(checkpoint=ckpt, input=src, output=null_device))
    assert stat.S_ISFIFO(pipe.lstat().st_mode) and stat.S_ISCHR(null_device.lstat().st_mode)
    assert sorted(p.name for p in pipe.parent.iterdir()) == ["in.en", "null", "pipe"]


def test_empty_lines_give_empty_lines(ckpt, tmp_path):
    src = tmp_path / "in.en"
    src.write_text("open file\n\nsave all\n   \nclose\n", encoding="utf-8")
    result = translate(config(checkpoint=ckpt, input=src, output=tmp_path / "out"))
    out = lines_of(tmp_path / "out")
    assert len(out) == 5 and out[1] == "" and out[3].strip() == ""  # split=auto keeps spaces
    for i, line in ((0, "open file"), (2, "save all"), (4, "close")):
        (tmp_path / "one").write_text(line + "\n", encoding="utf-8")
        alone = translate(config(checkpoint=ckpt, input=tmp_path / "one", output="-"))
        assert alone.hypotheses == [result.hypotheses[i]]


def test_an_over_long_line_is_truncated_with_a_warning(ckpt, tmp_path, capsys):
    src = tmp_path / "in.en"
    src.write_text("open\n" + "open file save all close window " * 5 + "\n", encoding="utf-8")
    cfg = config(checkpoint=ckpt, input=src, output=tmp_path / "out", max_input_tokens=4,
                 split="none")  # split=auto cuts the line into pieces that fit instead
    cfg.quiet = False
    translate(cfg)
    err = capsys.readouterr().err
    assert f"warning: {src}: line 2 has" in err and "truncated to 4" in err
    assert "line 1 " not in err


def test_nbest_lines_are_index_hypothesis_score(ckpt, test_en, tmp_path):
    out = tmp_path / "nbest"
    translate(config(checkpoint=ckpt, input=test_en, output=out, **{
        "search.beam_size": 4, "search.nbest": 3}))
    rows = [line.split(" ||| ") for line in lines_of(out)]
    n = len(lines_of(test_en))
    assert len(rows) == 3 * n and all(len(r) == 3 for r in rows)
    assert [int(r[0]) for r in rows] == [i for i in range(n) for _ in range(3)]
    for i in range(n):
        scores = [float(r[2]) for r in rows[3 * i:3 * i + 3]]
        assert scores == sorted(scores, reverse=True)


@pytest.mark.long
def test_attention_pictures_are_written(ckpt, test_en, tmp_path):
    image = pytest.importorskip("matplotlib.image")
    pictures = tmp_path / "attention"
    translate(config(checkpoint=ckpt, input=test_en, output=tmp_path / "h",
                     attention_plot=pictures, attention_line=2))
    for kind in ("encoder_self", "decoder_self", "encoder_decoder"):
        pixels = image.imread(pictures / f"{kind}.png")
        assert pixels.shape[0] > 200 and pixels.shape[1] > 200
        assert pixels[..., :3].std() > 0.05  # not a blank picture


# ----------------------------------------------------------------------------- bad input
def error_of(**kw) -> str:
    """The NmtError message translate() raises for this config."""
    with pytest.raises(NmtError) as e:
        translate(config(**kw))
    message = str(e.value)
    assert "\n" not in message
    return message


def test_a_corrupt_checkpoint_is_an_error(ckpt, test_en, tmp_path):
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"\x00not a checkpoint" * 100)
    assert "not a readable nmt checkpoint" in error_of(checkpoint=junk, input=test_en)
    cut = tmp_path / "cut.pt"
    cut.write_bytes(ckpt.read_bytes()[:5000])
    assert "not a readable nmt checkpoint" in error_of(checkpoint=cut, input=test_en)


def test_embeddings_that_do_not_fit_the_vocabulary_are_an_error(ckpt, test_en, tmp_path):
    state = load_checkpoint(ckpt)
    V = state["vocab"]["src_size"]
    state["model"] = {k: (torch.cat([v, v[:5]]) if v.dim() == 2 and v.size(0) == V else v)
                      for k, v in state["model"].items()}
    bad = tmp_path / "bad.pt"
    save_checkpoint(state, bad)
    assert f"has {V + 5} rows but the vocabulary has {V} entries" in error_of(
        checkpoint=bad, input=test_en)


@pytest.mark.slow
def test_a_vocabulary_that_does_not_match_is_an_error(ckpt, tiny_data_dir, test_en, tmp_path):
    other = make_data_dir(tmp_path / "other", vocab_size=100, seed=1)
    message = error_of(checkpoint=ckpt, input=test_en, vocab_check=other)
    assert f"vocabulary differs from {other}'s (sha256 " in message
    assert "vocabulary differs from" in error_of(checkpoint=ckpt, input=test_en,
                                                 vocab_check=other / "spm.model")
    for good in (tiny_data_dir, tiny_data_dir / "manifest.json", tiny_data_dir / "spm.model"):
        translate(config(checkpoint=ckpt, input=test_en, output=tmp_path / "h",
                         vocab_check=good))
    state = load_checkpoint(ckpt)  # stored SentencePiece model swapped for another one
    state["vocab"]["src_spm"] = state["vocab"]["tgt_spm"] = (other / "spm.model").read_bytes()
    save_checkpoint(state, tmp_path / "swapped.pt")
    assert "vocabulary does not match" in error_of(checkpoint=tmp_path / "swapped.pt",
                                                   input=test_en)
    state = load_checkpoint(ckpt)  # the right models, the checksum of other ones
    state["vocab"]["sha256"] = vocab_sha256(state["vocab"]["src_spm"], b"")
    save_checkpoint(state, tmp_path / "resummed.pt")
    assert "do not match the stored vocabulary sha256" in error_of(
        checkpoint=tmp_path / "resummed.pt", input=test_en)


def test_input_that_is_not_utf8_is_an_error(ckpt, tmp_path):
    src = tmp_path / "latin1.en"
    src.write_bytes("open file\nsave as caf\u00e9\n".encode("latin-1"))
    assert error_of(checkpoint=ckpt, input=src) == (
        f"{src}: line 2 is not valid UTF-8 (byte 0xe9 at offset 11)")


def test_missing_files_and_reference_count_are_errors(ckpt, test_en, tiny_data_dir, tmp_path):
    assert "cannot read input" in error_of(checkpoint=ckpt, input=tmp_path / "none.en")
    short = tmp_path / "short.de"
    short.write_text("eins\n", encoding="utf-8")
    assert "1 reference lines but" in error_of(checkpoint=ckpt, input=test_en, ref=short)


@pytest.mark.parametrize("suffix", [".gz", ".xz", ".bz2"])
@pytest.mark.slow
def test_compressed_input_and_references_are_read_transparently(ckpt, test_en, tiny_data_dir,
                                                                 tmp_path, suffix):
    from nmt.system.files import DECOMPRESS

    plain = translate(config(checkpoint=ckpt, input=test_en, output=tmp_path / "plain",
                             ref=tiny_data_dir / "test.clean.de"))
    packed = tmp_path / f"test.en{suffix}"
    ref = tmp_path / f"test.de{suffix}"
    with DECOMPRESS[suffix](packed, "wb") as f:
        f.write(test_en.read_bytes())
    with DECOMPRESS[suffix](ref, "wb") as f:
        f.write((tiny_data_dir / "test.clean.de").read_bytes())
    result = translate(config(checkpoint=ckpt, input=packed, output=tmp_path / "out", ref=ref))
    assert result.hypotheses == plain.hypotheses
    assert lines_of(tmp_path / "out") == lines_of(tmp_path / "plain")
    packed.write_bytes(packed.read_bytes()[:30])  # cut short
    assert error_of(checkpoint=ckpt, input=packed).startswith(f"{packed}: cannot read input (")
