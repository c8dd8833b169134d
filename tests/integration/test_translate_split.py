"""nmt-translate split=sentence|paragraph: a line's pieces translated alone, in the batches of
all the others, and put back in the line; what is per segment refused in one line."""

import dataclasses
import io
import math
import sys
from pathlib import Path

import pytest
from translate_helpers import lines_of, save_tiny_checkpoint
from translate_helpers import translate_config as config

import nmt.commands.translate
from nmt.commands.translate import translate
from nmt.config import SearchConfig, TranslateConfig
from nmt.data import segment
from nmt.data.tokenizer import Tokenizer
from nmt.errors import ConfigError
from nmt.training.checkpoint import load_checkpoint, save_checkpoint

pytestmark = pytest.mark.usefixtures("one_thread")

LINES = ["Open the file. Save all!", "", "   ", "close window", "Find. Replace? Undo.",
         "  Print menu.  Help tool. "]


@pytest.fixture(scope="module")
def ckpt(tiny_data_dir, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("run") / "checkpoint.pt"
    return save_tiny_checkpoint(path, (tiny_data_dir / "spm.model").read_bytes(), seed=0)


def write(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def run(ckpt: Path, path: Path, lines: list[str], **kw) -> dict:
    """nmt-translate's results for `lines` written to `path` (one process, its output to
    path.out); quiet=False: its warnings on stderr."""
    quiet = kw.pop("quiet", True)
    cfg = config(checkpoint=ckpt, input=write(path, lines), output=f"{path}.out", workers=1,
                 **kw)
    return translate(dataclasses.replace(cfg, quiet=quiet))


def alone(ckpt: Path, pieces: list[str], tmp_path: Path) -> list[str]:
    """split=none translations of each piece as a line of its own."""
    return run(ckpt, tmp_path / "alone", pieces, split="none").hypotheses


def test_a_line_of_two_sentences_is_their_translations_alone_joined(ckpt, tmp_path):
    pytest.importorskip(segment.SPLITTER)
    got = run(ckpt, tmp_path / "in", LINES, split="sentence", split_lang="en")
    want = alone(ckpt, ["Open the file.", "Save all!", "close window", "Find.", "Replace?",
                        "Undo.", "Print menu.", "Help tool."], tmp_path)
    assert got.hypotheses == [f"{want[0]} {want[1]}", "", "   ", want[2],
                                 f"{want[3]} {want[4]} {want[5]}", f"  {want[6]}  {want[7]} "]
    assert lines_of(tmp_path / "in.out") == got.hypotheses  # one output line per input line
    assert len(got.nbest) == len(LINES)


def test_paragraph_mode_translates_each_line_whole_with_its_spaces_kept(ckpt, tmp_path):
    got = run(ckpt, tmp_path / "in", LINES, split="paragraph")
    want = alone(ckpt, [LINES[0], LINES[3], LINES[4], LINES[5].strip()], tmp_path)
    assert got.hypotheses == [want[0], "", "   ", want[1], want[2], f"  {want[3]} "]


def test_a_line_over_the_models_positions_is_cut_into_pieces_that_fit_not_truncated(
        ckpt, tiny_data_dir, tmp_path, capfd):
    state = load_checkpoint(ckpt)
    state["model_cfg"]["max_positions"] = 10  # sources of at most 9 tokens (EOS apart)
    short = tmp_path / "short.pt"
    save_checkpoint(state, short)
    line = " ".join(["open file, save all"] * 6) + " close window"
    tok = Tokenizer.from_file(tiny_data_dir / "spm.model")
    assert len(tok.encode([line])[0]) > 3 * 9
    pieces = segment.split_text(line, "paragraph", None, lambda t: len(tok.encode([t])[0]),
                                9).pieces
    assert all(len(ids) <= 9 for ids in tok.encode(pieces)) and len(pieces) >= 4
    got = run(short, tmp_path / "in", [line], split="paragraph", quiet=False)
    assert "truncated" not in capfd.readouterr().err
    assert got.hypotheses == [" ".join(alone(short, pieces, tmp_path))]
    cut = run(short, tmp_path / "in", [line], split="none", quiet=False)  # truncated
    assert "truncated to 9" in capfd.readouterr().err
    assert cut.hypotheses != got.hypotheses


@pytest.mark.parametrize("kw, key", [
    ({"split": "words"}, "split"),
    ({"split": "sentence", "split_lang": "English"}, "split_lang"),
    ({"split": "paragraph", "search": SearchConfig(nbest=2)}, "search.nbest"),
    ({"split": "paragraph", "alignment": True}, "alignment"),
    ({"split": "paragraph", "prefix": True}, "prefix"),
    ({"split": "paragraph", "score_reference": True}, "score_reference"),
    ({"split": "paragraph", "constraints": "terms.tsv"}, "constraints"),
    ({"split": "paragraph", "attention_plot": "att"}, "attention_plot"),
])
def test_bad_or_per_segment_options_are_one_line_config_errors(kw, key):
    with pytest.raises(ConfigError) as e:
        TranslateConfig(checkpoint="x.pt", **kw)
    assert str(e.value).startswith(f"{key}: ") and "\n" not in str(e.value)


def test_split_sentence_takes_the_source_language_the_checkpoint_records(ckpt, tmp_path):
    """A checkpoint that records its pair (nmt-train does) needs no split_lang; one that
    records none (older ones) is a one-line error naming split_lang, and nothing is written."""
    pytest.importorskip(segment.SPLITTER)
    state = load_checkpoint(ckpt)
    state["vocab"]["pair"] = {"src_lang": "en", "tgt_lang": "de"}
    paired = tmp_path / "paired.pt"
    save_checkpoint(state, paired)
    got = run(paired, tmp_path / "in", LINES, split="sentence")
    assert got.hypotheses == run(ckpt, tmp_path / "in", LINES, split="sentence",
                                    split_lang="en").hypotheses
    with pytest.raises(ConfigError, match=r"^split_lang: split=sentence needs the source "
                                          r"language's ISO 639 code.*records no language pair"):
        run(ckpt, tmp_path / "old", LINES, split="sentence")
    assert not (tmp_path / "old.out").exists()


def test_split_auto_the_default_is_sentences_where_the_language_is_known(ckpt, tmp_path):
    """split=auto (the default, nmt-serve's rule too): sentences for a checkpoint that records
    its pair, whole lines where an option is a segment's (n-best lists), paragraphs (each line
    whole) where no language is known."""
    pytest.importorskip(segment.SPLITTER)
    state = load_checkpoint(ckpt)
    state["vocab"]["pair"] = {"src_lang": "en", "tgt_lang": "de"}
    paired = tmp_path / "paired.pt"
    save_checkpoint(state, paired)
    auto = run(paired, tmp_path / "in", LINES)
    assert auto.segments == 8 and auto.split == "sentence"
    assert auto.hypotheses == run(paired, tmp_path / "in", LINES, split="sentence").hypotheses
    nbest = run(paired, tmp_path / "in", LINES, **{"search.nbest": 2})
    assert nbest.split == "none" and nbest.segments == len(LINES)
    assert run(ckpt, tmp_path / "in", LINES).split == "paragraph"  # records no pair


def test_auto_mode_is_one_rule(monkeypatch):
    assert segment.auto_mode("en", whole=True) == "none"
    assert segment.auto_mode("", whole=False) == "paragraph"
    monkeypatch.setattr(segment.importlib.util, "find_spec", lambda name: object())
    assert segment.auto_mode("en", whole=False) == "sentence"
    monkeypatch.setattr(segment.importlib.util, "find_spec", lambda name: None)
    assert segment.auto_mode("en", whole=False) == "paragraph"  # no splitter installed


def test_split_sentence_without_the_extra_is_a_one_line_error(monkeypatch):
    monkeypatch.setattr(segment.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ConfigError, match=r"^split=sentence needs sentencex: pip install "
                                          r"'nmt\[split\]'$"):
        config(checkpoint="x.pt", split="sentence", split_lang="de")
    config(checkpoint="x.pt", split="paragraph")  # needs no splitter



def test_the_summary_counts_the_pieces_decoded_not_the_lines(ckpt, tmp_path, monkeypatch,
                                                             capsys):
    pytest.importorskip(segment.SPLITTER)
    capsys.readouterr()
    got = run(ckpt, tmp_path / "in", LINES, split="sentence", split_lang="en", quiet=False)
    summary = [x for x in capsys.readouterr().err.splitlines() if "translated" in x]
    assert summary and "translated 6 lines (8 pieces, split=sentence) in " in summary[0]
    assert " pieces/s, " in summary[0] and "sentences/s" not in summary[0]
    assert got.segments == 8  # 2 + 1 + 3 + 2 sentences; the blank lines are none
    piped = io.TextIOWrapper(io.BytesIO("".join(f"{x}\n" for x in LINES).encode()))
    monkeypatch.setattr(sys, "stdin", piped)
    # chunk by chunk
    monkeypatch.setattr(nmt.commands.translate, "is_interactive", lambda path: True)
    assert translate(dataclasses.replace(config(checkpoint=ckpt, split="sentence",
                                                split_lang="en", workers=1),
                                         quiet=True)).segments == 8


def test_lines_from_a_pipe_give_what_the_whole_file_gives(ckpt, tmp_path, monkeypatch, capsys):
    pytest.importorskip(segment.SPLITTER)
    whole = run(ckpt, tmp_path / "in", LINES, split="sentence", split_lang="en")
    piped = io.TextIOWrapper(io.BytesIO("".join(f"{x}\n" for x in LINES).encode()))
    monkeypatch.setattr(sys, "stdin", piped)
    # chunk by chunk
    monkeypatch.setattr(nmt.commands.translate, "is_interactive", lambda path: True)
    capsys.readouterr()
    translate(dataclasses.replace(
        config(checkpoint=ckpt, split="sentence", split_lang="en", workers=1), quiet=True))
    assert capsys.readouterr().out.split("\n")[:-1] == whole.hypotheses


def test_pieces_of_one_line_draw_their_own_samples(ckpt, tmp_path):
    """Two equal sentences of a line are two samples, not one sample twice: each piece has its
    own sampling stream, the first piece the line's own (as the line unsplit)."""
    pytest.importorskip(segment.SPLITTER)
    line = "Open the file. Open the file. Open the file."
    kw = {"search.sampling": "true", "search.temperature": 5.0, "search.seed": 3}
    got = run(ckpt, tmp_path / "in", [line], split="sentence", split_lang="en", **kw)
    pieces = run(ckpt, tmp_path / "one", ["Open the file."], **kw).hypotheses[0]
    assert got.hypotheses[0].startswith(pieces + " ")
    assert got.hypotheses[0] != " ".join([pieces] * 3)


def test_a_warning_names_the_input_line_of_a_piece_without_translation(ckpt, tmp_path, capfd,
                                                                       monkeypatch):
    pytest.importorskip(segment.SPLITTER)
    search = nmt.commands.translate.run_search

    def third_piece_unfinished(*args, **kw):  # pieces: line 1's two, then line 2's one
        found = search(*args, **kw)
        found[2] = [dataclasses.replace(found[2][0], logprob=-math.inf)]
        return found
    monkeypatch.setattr(nmt.commands.translate, "run_search", third_piece_unfinished)
    run(ckpt, tmp_path / "in", ["Open the file. Save all!", "close window"], split="sentence",
        split_lang="en")
    err = capfd.readouterr().err
    assert "line 2: no translation" in err and "line 3" not in err
