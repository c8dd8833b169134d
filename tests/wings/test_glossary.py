"""Glossaries and keep lists (nmt/wings/glossary.py): the files and their one-line errors,
matching, the exact terms written back; nmt-translate glossary=FILE keep=FILE on a tiny random
model; nmt-serve's setting and request fields, in nmt's API and LibreTranslate's."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from translate_helpers import save_tiny_checkpoint
from translate_helpers import translate_config as config

from nmt.commands.translate import translate
from nmt.config import ConfigError
from nmt.data.tokenizer import Tokenizer
from nmt.errors import NmtError
from nmt.wings.glossary import Glossary, read_glossary, read_keep, request_entries

pytestmark = pytest.mark.usefixtures("one_thread")

GLOSSARY = ["# the toy language: words reversed, capitalised, -en", "open\tNepoen",
            "save file\tEvasen Elifen", "", "file\tElifen", "  # an indented comment"]
KEEP = ["NT AUTHORITY\\SYSTEM", "sudo rm -rf", "\ufb01le.txt"]  # unknown pieces; NFKC's "fi"
LINES = ["open save file", "file edit", "OPEN window", "show hidden files",
         "run NT AUTHORITY\\SYSTEM now", "copy \ufb01le.txt to folder", "open sudo rm -rf file"]
WANT = [["Nepoen", "Evasen Elifen"], ["Elifen"], ["Nepoen"], [], [], [], ["Nepoen", "Elifen"]]


@pytest.fixture(scope="module")
def tok(tiny_data_dir) -> Tokenizer:
    return Tokenizer.from_file(tiny_data_dir / "spm.model")


@pytest.fixture(scope="module")
def ckpt(tiny_data_dir, tmp_path_factory) -> Path:
    spm = (tiny_data_dir / "spm.model").read_bytes()
    return save_tiny_checkpoint(tmp_path_factory.mktemp("run") / "a.pt", spm, seed=0)


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    """glossary, keep and input files."""
    out = tmp_path_factory.mktemp("terms")
    return {name: write(out / name, lines)
            for name, lines in (("g.tsv", GLOSSARY), ("keep.txt", KEEP), ("in.en", LINES))}


def write(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def glossary(tok: Tokenizer, lines: list[str], keep: list[str] = (), limit: int = 50):
    return Glossary(read_glossary(lines, "g.tsv") + read_keep(list(keep), "keep.txt"), tok,
                    limit)


# ----------------------------------------------------------------------------- the files
@pytest.mark.parametrize("lines, keep, message", [
    (["open\tNepoen", "file Elifen"], [],
     "g.tsv: line 2: needs source<TAB>target, found 0 TABs"),
    (["open\tNepoen\tx"], [], "g.tsv: line 1: needs source<TAB>target, found 2 TABs"),
    (["# c", "open\t  "], [], "g.tsv: line 2: the target term is empty"),
    (["\tNepoen"], [], "g.tsv: line 1: the source term is empty"),
    (["open\tNepoen", "", "Open\tTideen"], [],
     "g.tsv: line 3: 'Open' -> 'Tideen' contradicts g.tsv: line 1 ('open' -> 'Nepoen')"),
    (["open\tNepoen"], ["x", "OPEN"],
     "keep.txt: line 2: 'OPEN' kept contradicts g.tsv: line 1 ('open' -> 'Nepoen')"),
    (["open\t" + "Nepoen " * 20], [],
     "g.tsv: line 1: the target term 'Nepoen Nepoen Nepoen Nepoen Nepoen Nepoen Nepoen Nepoen "
     "Nepoen Nepoen Nepoen Nepoen Nepoen Nepoen Nepoen Nepoen Nepoen Nepoen Nepoen Nepoen' has "
     "60 pieces; no translation can hold more than 50 (the model's positions)"),
])
def test_a_bad_glossary_or_keep_line_is_an_error_naming_it(tok, lines, keep, message):
    with pytest.raises(NmtError) as e:
        glossary(tok, lines, keep)
    assert str(e.value) == message


def test_comments_blank_lines_and_agreeing_repeats_are_fine(tok):
    g = glossary(tok, GLOSSARY + ["Open\tNepoen", "sudo\tsudo"], ["sudo", "# x", "sudo"])
    assert sorted(g.entries) == ["file", "open", "save file", "sudo"]


def test_terms_match_case_insensitively_on_word_boundaries_longest_first(tok):
    g = glossary(tok, GLOSSARY + ["file edit\tx", "edit view\ty"], KEEP)
    found = [[t.text for t in g.matches(line)] for line in [
        *LINES, "reopen files, FILE. opened", "file edit view", "edit view file edit"]]
    assert found == [["Nepoen", "Evasen Elifen"], ["x"], ["Nepoen"], [], ["NT AUTHORITY\\SYSTEM"],
                     ["\ufb01le.txt"], ["Nepoen", "sudo rm -rf", "Elifen"], ["Elifen"],
                     ["x"], ["y", "x"]]  # of two as long, the first
    # a kept term is what the source writes, whatever the keep list's case
    assert [t.text for t in g.matches("nt authority\\system")] == ["nt authority\\system"]


def test_terms_are_written_back_byte_for_byte_and_a_lost_kept_term_is_appended(tok):
    g = glossary(tok, GLOSSARY, KEEP)
    terms = g.matches("open NT AUTHORITY\\SYSTEM and \ufb01le.txt")
    shown = {t.text: t.shown for t in terms}
    assert shown["NT AUTHORITY\\SYSTEM"] != "NT AUTHORITY\\SYSTEM"  # the vocabulary lacks it
    assert shown["\ufb01le.txt"].startswith("file ")  # NFKC, and a vocabulary without "."
    decoded = tok.decode(tok.encode(["Nepoen NT AUTHORITY\\SYSTEM und \ufb01le.txt"]))[0]
    assert Glossary.restore(decoded, terms) == "Nepoen NT AUTHORITY\\SYSTEM und \ufb01le.txt"
    assert Glossary.restore("Nepoen", terms) == "Nepoen NT AUTHORITY\\SYSTEM \ufb01le.txt"


def test_a_requests_entries_override_the_servers_and_are_checked(tok):
    g = glossary(tok, GLOSSARY).with_entries(request_entries({"OPEN": "Tideen"}, ["file"]))
    assert [t.text for t in g.matches("open file")] == ["Tideen", "file"]
    with pytest.raises(NmtError, match="^glossary: an empty term"):
        request_entries({"open": " "}, [])
    with pytest.raises(NmtError, match="^keep: 'file' kept contradicts glossary") as e:
        glossary(tok, []).with_entries(request_entries({"file": "Elifen"}, ["file"]))
    assert (e.value.key, e.value.why) == ("keep", "'file' kept contradicts glossary "
                                              "('file' -> 'Elifen')")


# ----------------------------------------------------------------------------- nmt-translate
def test_every_translation_holds_its_glossary_terms_and_kept_terms_exactly(ckpt, files,
                                                                           monkeypatch):
    encoded = []
    encode = Tokenizer.encode
    monkeypatch.setattr(Tokenizer, "encode", lambda self, lines, *a: encoded.append(
        list(lines)) or encode(self, lines, *a))
    out = translate(config(checkpoint=ckpt, input=files["in.en"], glossary=files["g.tsv"],
                           keep=files["keep.txt"], **{"search.beam_size": 2})).hypotheses
    free = translate(config(checkpoint=ckpt, input=files["in.en"],
                            **{"search.beam_size": 2})).hypotheses
    for line, hyp, want, plain in zip(LINES, out, WANT, free, strict=True):
        for term in want:
            assert re.search(rf"(?<!\w){term}(?!\w)", hyp), (line, hyp)
        for term in KEEP:  # byte for byte, as often as the source has it
            assert hyp.count(term) >= line.count(term), (line, hyp)
        if not want and not any(term in line for term in KEEP):
            assert hyp == plain  # no term: as without the glossary
    assert not any("Evasen" in h for h in free)  # the random model would not write them
    assert sum("Evasen Elifen" in lines for lines in encoded) == 1  # encoded once, not per line


@pytest.mark.slow
def test_a_bad_glossary_is_one_line_on_the_command_line(ckpt, files, tmp_path):
    bad = write(tmp_path / "bad.tsv", ["open\tNepoen", "file Elifen"])
    done = subprocess.run([str(Path(sys.executable).parent / "nmt-translate"),
                           f"checkpoint={ckpt}", f"input={files['in.en']}", f"glossary={bad}"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.splitlines() == [
        f"nmt-translate: error: {bad}: line 2: needs source<TAB>target, found 0 TABs"]


@pytest.mark.parametrize("key", ["glossary", "keep"])
def test_an_engine_without_constraints_and_sampling_refuse_a_glossary(ckpt, files, key):
    with pytest.raises(ConfigError, match=f"^{key}: engine=ctranslate2 has no lexical "
                                          f"constraints; use engine=nmt$"):
        config(checkpoint=ckpt, engine="ctranslate2", **{key: files["g.tsv"]})
    with pytest.raises(ConfigError, match=f"^{key}: need beam search"):
        config(checkpoint=ckpt, **{key: files["g.tsv"], "search.sampling": "true"})
    with pytest.raises(ConfigError, match=f"^{key}: {key}=... and score_reference=true"):
        config(checkpoint=ckpt, score_reference="true", **{key: files["g.tsv"]})


# ----------------------------------------------------------------------------- nmt-serve
@pytest.fixture(scope="module")
def server(ckpt, files):
    pytest.importorskip("fastapi")
    from test_serve import InProcess

    srv = InProcess(ckpt, f"glossary={files['g.tsv']}", f"keep={files['keep.txt']}",
                    "src_lang=en", "tgt_lang=de", "max_glossary=3")
    yield srv
    srv.stop()


def test_the_servers_glossary_gives_nmt_translates_translations(server, ckpt, files):
    want = translate(config(checkpoint=ckpt, input=files["in.en"], glossary=files["g.tsv"],
                            keep=files["keep.txt"])).hypotheses
    assert [t["text"] for t in server.translate(LINES)] == want


def test_a_requests_glossary_and_keep_list_in_nmts_api(server):
    assert server.call("GET", "/health")[2]["limits"]["max_glossary"] == 3
    texts = ["open edit file", "view the Help"]
    got = server.translate(texts, glossary={"edit": "Tideen", "OPEN": "Nepo"}, keep=["help"])
    assert re.search(r"(?<!\w)Nepo(?!\w)", got[0]["text"]) and "Tideen" in got[0]["text"]
    assert "Elifen" in got[0]["text"] and "Help" in got[1]["text"]  # the server's, the source's
    for body, field, why in [
            ({"glossary": {"file": "Elifen", "File": "Akte"}}, "glossary",
             "glossary: 'File' -> 'Akte' contradicts glossary ('file' -> 'Elifen')"),
            ({"glossary": {"file": ""}}, "glossary", "glossary: an empty term ('file' -> '')"),
            ({"keep": ["a", "b", "c", "d"]}, "keep",
             "keep: 4 entries with keep; this server takes at most 3 per request "
             "(max_glossary)"),
            ({"glossary": {"open": "x"}, "sampling": True}, "glossary",
             "glossary: glossary and keep terms need beam search, not sampling")]:
        status, _, answer = server.call("POST", "/translate", {"text": texts, **body})
        assert (status, answer) == (422, {"error": why, "field": field})


def test_a_glossary_in_libretranslates_api(server):
    from test_libretranslate import form

    status, body = form(server, "/translate", q="open edit", source="en", target="de",
                        glossary="# mine\nedit\tTideen\n", keep="open")
    assert status == 200 and "Tideen" in body["translatedText"]
    assert "open" in body["translatedText"] and "Nepoen" not in body["translatedText"]
    status, _, body = server.call("POST", "/translate", {
        "q": ["save file", "edit"], "source": "en", "target": "de",
        "glossary": {"edit": "Tideen"}})
    assert status == 200 and "Evasen Elifen" in body["translatedText"][0]  # the server's
    assert "Tideen" in body["translatedText"][1]
    status, body = form(server, "/translate", q="open", source="en", target="de",
                        glossary="edit Tideen")
    assert (status, body) == (400, {"error": "Invalid request: glossary: line 1: needs "
                                             "source<TAB>target, found 0 TABs"})


def test_a_bad_glossary_file_stops_the_server_in_one_line(ckpt, tmp_path):
    pytest.importorskip("fastapi")
    from test_serve import InProcess

    bad = write(tmp_path / "g.tsv", ["open\tNepoen", "open\tTideen"])
    with pytest.raises(NmtError, match=rf"^{re.escape(str(bad))}: line 2: 'open' -> 'Tideen' "
                                       rf"contradicts {re.escape(str(bad))}: line 1"):
        InProcess(ckpt, f"glossary={bad}")
