"""engine=ctranslate2: CTranslate2 decodes the checkpoint's cached export as nmt does.

The model and sentences are tests/wings/test_export.py's (a random 2+2 model whose greedy outputs
vary with the source and often end early, a real BPE vocabulary, the bundled test.en).
"""

import multiprocessing as mp
import os
import signal
import sys
import threading
from pathlib import Path

import pytest
from test_export import MAX_LEN, bundled_sentences, sample_spm, varied_checkpoint
from test_serve import Server

import nmt
import nmt.wings.interop.ct2_export as ct2_export
from nmt.commands.translate import translate
from nmt.config import SearchConfig, TranslateConfig, compose, to_object
from nmt.decoding.messages import Batch, Hypothesis, Sentence
from nmt.engines.engine import Workers
from nmt.engines.translator import Translator
from nmt.errors import ConfigError, NmtError
from nmt.wings.ctranslate2 import CT2Translator
from nmt.wings.interop.ct2_export import cached_export, read_info

pytest.importorskip("ctranslate2")
pytestmark = pytest.mark.usefixtures("one_thread")
GONE = 9_999_999  # a process id no system gives (Linux's pid_max is at most 2**22)


@pytest.fixture(scope="module")
def joint() -> bytes:
    """test_export's joint SentencePiece BPE model (500 pieces) of the bundled sample."""
    return sample_spm("joint")


@pytest.fixture(scope="module")
def ckpt(joint, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("run") / "checkpoint_last.pt"
    return varied_checkpoint(path, joint, joint, "post")


@pytest.fixture(scope="module")
def engines(ckpt):
    """nmt's Translator and the CT2Translator of the same checkpoint, and the source ids."""
    tr = Translator.load(ckpt, dtype="fp32")
    with CT2Translator.load(ckpt, threads=1) as ct:
        yield tr, ct, tr.src_tok.encode(list(bundled_sentences()))


def tokens(results) -> list[list[list[int]]]:
    return [[h.tokens for h in hyps] for hyps in results]


@pytest.mark.parametrize("max_len_a,max_len_b", [(0.0, MAX_LEN), (1.0, 4)])
def test_greedy_is_nmt_greedy_with_its_scores(engines, max_len_a, max_len_b):
    """Token for token, also with a maximum length per sentence (max_len_a=1: sentences are
    grouped by it); scores are log P / lp(|Y|) with log P renormalized over allowed tokens."""
    tr, ct, src = engines
    search = SearchConfig(beam_size=1, alpha=0.6, max_len_a=max_len_a, max_len_b=max_len_b)
    ours, theirs = tr.translate_ids(src, search), ct.translate_ids(src, search)
    assert tokens(theirs) == tokens(ours)
    assert any(len(h[0].tokens) < max_len_b for h in ours)  # some end early
    for a, b in zip(ours, theirs, strict=True):
        h, g = a[0], b[0]
        assert g.logprob >= h.logprob - 1e-4  # CTranslate2 leaves out the forbidden tokens
        assert g.score / g.logprob == pytest.approx(h.score / h.logprob)  # 1 / lp(|Y|)


def test_empty_sources_are_answered_as_nmt_does_in_place(engines):
    tr, ct, src = engines
    search = SearchConfig(beam_size=2, nbest=2, alpha=0.0, max_len_a=0.0, max_len_b=4)
    mixed = [[], src[0], [], src[1]]
    assert tokens(ct.translate_ids(mixed, search)) == tokens(tr.translate_ids(mixed, search))
    assert ct.translate_ids([[]], search) == [[Hypothesis([], 0.0, 0.0)]]


def test_beam_search_and_nbest_are_nmts_but_for_near_ties(engines):
    tr, ct, src = engines
    search = SearchConfig(beam_size=4, nbest=4, alpha=0.0, max_len_a=0.0, max_len_b=MAX_LEN)
    ours, theirs = tokens(tr.translate_ids(src, search)), tokens(ct.translate_ids(src, search))
    differ = [i for i, (a, b) in enumerate(zip(ours, theirs, strict=True)) if a[0] != b[0]]
    # The best one: all but a few, where this random model puts much probability on the
    # tokens a step forbids, which CTranslate2 leaves out of log P (4 of 64 sentences).
    assert len(differ) <= 0.1 * len(src)
    assert all(len(h) == 4 for h in theirs)
    same = sum(a == b for a, b in zip(ours, theirs, strict=True))
    assert same >= 0.9 * len(src)  # 62/64: scores renormalized over allowed tokens


def test_unsupported_settings_are_one_line_config_errors(ckpt, engines, tmp_path, monkeypatch):
    _, ct, src = engines
    with pytest.raises(ConfigError, match="^search.alpha: engine=ctranslate2 has no GNMT"):
        ct.translate_ids(src[:2], SearchConfig(beam_size=4, alpha=0.6))
    base = [f"checkpoint={ckpt}", "engine=ctranslate2", "search.alpha=0"]
    for args, key in ((["checkpoint=[a.pt,b.pt]"], "checkpoint"),
                      (["search.alpha=1", "search.beam_size=2"], "search.alpha"),
                      (["attention_plot=att"], "attention_plot"),
                      (["constraints=c.tsv"], "constraints"),
                      (["alignment=true"], "alignment"),
                      (["search.sampling=true", "search.epsilon=0.1"], "search.epsilon"),
                      (["engine=onnx"], "engine"),
                      (["engine=nmt", "ct2_model=d"], "ct2_model"),
                      (["device=cpu", "search.dtype=int8_float16"], "search.dtype"),
                      (["engine=nmt", "search.dtype=int8_bfloat16"], "search.dtype")):
        with pytest.raises(ConfigError, match=f"^{key}: "):
            to_object(compose("translate", base + args), TranslateConfig)
    monkeypatch.setitem(sys.modules, "ctranslate2", None)  # import fails
    with pytest.raises(NmtError, match=r"^engine=ctranslate2 needs the ctranslate2 package: "
                                       r"pip install 'nmt\[ctranslate2\]'$"):
        CT2Translator.load(ckpt, ct2_model=str(tmp_path / "m"))
    assert not (tmp_path / "m").exists()


def test_what_ctranslate2_cannot_do_is_refused_by_its_capabilities(ckpt, engines):
    _, ct, src = engines
    assert ct.capabilities.shortlist == "" and not ct.capabilities.attention
    with pytest.raises(ConfigError, match="^constraints: engine=ctranslate2 has no lexical"):
        ct.translate_ids(src[:1], SearchConfig(), constraints=[[[5]]])
    with pytest.raises(ConfigError, match="^attention: engine=ctranslate2 does not return"):
        ct.attention(src[:1], [[5]])
    with pytest.raises(ConfigError, match="^search.shortlist: engine=ctranslate2 loaded no "):
        ct.translate_ids(src[:1], SearchConfig(beam_size=1, shortlist="s.tsv"))
    with pytest.raises(ConfigError, match="^checkpoint: engine=ctranslate2 translates with one"):
        CT2Translator.load([ckpt, ckpt])


def test_nmt_serves_batches_go_to_ctranslate2s_own_threads(ckpt, engines):
    """The engine's stepper: a thread per worker (CTranslate2's inter_threads) runs
    batch_loop, which translates each Batch whole (no step loop: continuous batching is not
    among its capabilities)."""
    _, one, src = engines
    search = SearchConfig(beam_size=1, max_len_a=0.0, max_len_b=MAX_LEN)
    with CT2Translator.load(ckpt, workers=2, threads=1) as ct:
        pool = ct.stepper()
        assert isinstance(pool, Workers)  # the engine protocol's type
        assert ct.ct2.num_translators == 2 and pool.workers == 2 and not pool.processes
        halves = [src[i::2] for i in range(2)]
        for w, half in enumerate(halves):
            pool.send(w, Batch(search, [Sentence((w, i), s) for i, s in enumerate(half)], True))
        got = {r.tag: r.hypotheses for _ in range(2) for r in pool.read(timeout=60).results}
    assert tokens([got[(w, i)] for w, half in enumerate(halves) for i in range(len(half))]) \
        == tokens(one.translate_ids(halves[0] + halves[1], search))


def export_dir(*args) -> Path:
    """cached_export's directory (its lock released)."""
    with cached_export(*args) as out:
        return out


@pytest.fixture
def exports(monkeypatch) -> list:
    """The calls of ct2_export._export (each one export made), in this process."""
    calls, real = [], ct2_export._export
    monkeypatch.setattr(ct2_export, "_export", lambda *a: calls.append(a) or real(*a))
    return calls


def test_the_export_is_cached_by_checksum_and_compute_type(joint, tmp_path, exports):
    ckpt = varied_checkpoint(tmp_path / "checkpoint_last.pt", joint, joint, "post")
    first = export_dir(ckpt, "auto", "float32")
    assert first.parent == tmp_path / "checkpoint_last.pt.ct2" and len(exports) == 1
    assert export_dir(ckpt, "auto", "float32") == first and len(exports) == 1  # reused
    int8 = export_dir(ckpt, "auto", "int8")
    assert int8 != first and len(exports) == 2
    varied_checkpoint(ckpt, joint, joint, "post", seed=1)  # a new checkpoint_last
    second = export_dir(ckpt, "auto", "float32")
    assert second != first and len(exports) == 3
    assert not first.exists() and int8.exists()  # the stale float32 export is gone
    assert read_info(second)["checkpoint_sha256"] != read_info(int8)["checkpoint_sha256"]
    assert {p.name for p in first.parent.iterdir() if p.name.startswith(".")} == {
        f".{second.name}.lock", f".{int8.name}.lock"}  # no temporaries, no stale locks
    # ct2_model=DIR: exported there, and exported again once the checkpoint changes
    assert export_dir(ckpt, "auto", "float32", str(tmp_path / "m")) == tmp_path / "m"
    assert export_dir(ckpt, "auto", "float32", str(tmp_path / "m")) == tmp_path / "m"
    assert len(exports) == 4


def test_ct2_model_dot_is_the_export_in_the_working_directory(joint, tmp_path, exports,
                                                               monkeypatch):
    ckpt = varied_checkpoint(tmp_path / "checkpoint_last.pt", joint, joint, "post")
    out = export_dir(ckpt, "auto", "float32", str(tmp_path / "m"))
    monkeypatch.chdir(out)
    assert export_dir(ckpt, "auto", "float32", ".") == out and len(exports) == 1


def test_ct2_model_never_replaces_a_folder_nmt_did_not_write(ckpt, tmp_path, exports):
    """A Hugging Face model folder (config.json, model.safetensors) or any other folder without
    nmt.json is refused in one line and left as it was, every file kept."""
    hf = tmp_path / "hfmodel"
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    (hf / "model.safetensors").write_bytes(b"weights")
    with pytest.raises(NmtError, match=r"^ct2_model=.*hfmodel: has no nmt.json.*not a "
                                       r"CTranslate2 model") as e:
        export_dir(ckpt, "auto", "float32", str(hf))
    assert "\n" not in str(e.value) and not exports
    assert sorted(p.name for p in hf.iterdir()) == ["config.json", "model.safetensors"]
    assert [p.name for p in tmp_path.iterdir()] == ["hfmodel"]  # no .hfmodel.lock left
    assert (hf / "model.safetensors").read_bytes() == b"weights"


def test_a_ctranslate2_model_converted_elsewhere_is_used_as_it_is(ckpt, tmp_path, exports,
                                                                  engines):
    """A CTranslate2 model without nmt.json (converted outside nmt) is translated with as it
    is where its vocabularies are the checkpoint's, and refused, untouched, where not."""
    theirs = tmp_path / "theirs"
    export_dir(ckpt, "auto", "float32", str(theirs))
    for name in ("nmt.json", "source.spm", "target.spm"):
        (theirs / name).unlink()
    (tmp_path / ".theirs.lock").unlink()  # as a model converted elsewhere has none
    before = {p.name: p.read_bytes() for p in theirs.iterdir()}
    _, ct, ids = engines
    cfg = SearchConfig(beam_size=2, alpha=0.0, max_len_a=0, max_len_b=MAX_LEN)
    with CT2Translator.load(ckpt, ct2_model=str(theirs), threads=1) as used:
        assert tokens(used.translate_ids(ids[:8], cfg)) == tokens(ct.translate_ids(ids[:8], cfg))
    assert {p.name: p.read_bytes() for p in theirs.iterdir()} == before and len(exports) == 1
    assert not (tmp_path / ".theirs.lock").exists()
    vocab = theirs / "shared_vocabulary.json"
    vocab.write_text(vocab.read_text().replace('"<unk>"', '"<UNK>"'))
    with pytest.raises(NmtError, match=r"its source vocabulary \(500 entries\) is not the "
                                       r"checkpoint's"):
        export_dir(ckpt, "auto", "float32", str(theirs))
    assert len(exports) == 1 and not (theirs / "nmt.json").exists()
    assert not (tmp_path / ".theirs.lock").exists()


def test_an_upgrade_of_nmt_or_ctranslate2_exports_again(joint, tmp_path, exports,
                                                        monkeypatch):
    import ctranslate2

    ckpt = varied_checkpoint(tmp_path / "checkpoint_last.pt", joint, joint, "post")
    out = export_dir(ckpt, "auto", "float32")
    monkeypatch.setattr(nmt, "__version__", "99.0")
    assert export_dir(ckpt, "auto", "float32") == out and len(exports) == 2
    monkeypatch.setattr(ctranslate2, "__version__", "99.1")
    assert export_dir(ckpt, "auto", "float32") == out and len(exports) == 3
    assert export_dir(ckpt, "auto", "float32") == out and len(exports) == 3
    info = read_info(out)
    assert (info["nmt_version"], info["ctranslate2_version"]) == ("99.0", "99.1")


def _load_in_child(ckpt: Path, first: bool, log: Path, exporting, waiting, results) -> None:
    """In a forked process: CT2Translator.load and one translation. The first process, once
    exporting, lets the second start and waits until it is blocked on the lock (or, without
    one, exporting too) before it goes on; each export is logged."""
    real_export, real_lock = ct2_export._export, ct2_export._lock

    def export(*args):
        with open(log, "a") as f:
            f.write("export\n")
        if first:
            exporting.set()
            waiting.wait(30)
        else:
            waiting.set()
        real_export(*args)

    def lock(out, wait=True):
        if wait and not first:
            waiting.set()  # about to block: the first holds the lock
        return real_lock(out, wait)

    ct2_export._export, ct2_export._lock = export, lock
    if not first:
        exporting.wait(30)
    with CT2Translator.load(ckpt, threads=1) as ct:
        out = ct.translate_ids([[5, 6, 7]], SearchConfig(beam_size=1, max_len_a=0, max_len_b=4))
    results.put(out[0][0].tokens)


def test_two_processes_loading_one_key_export_it_once(joint, tmp_path):
    ckpt = varied_checkpoint(tmp_path / "checkpoint_last.pt", joint, joint, "post")
    ctx = mp.get_context("fork")
    exporting, waiting, results, log = ctx.Event(), ctx.Event(), ctx.Queue(), tmp_path / "log"
    children = [ctx.Process(target=_load_in_child,
                            args=(ckpt, first, log, exporting, waiting, results))
                for first in (True, False)]
    for child in children:
        child.start()
    for child in children:
        child.join(60)
    assert [child.exitcode for child in children] == [0, 0]
    assert log.read_text().splitlines() == ["export"]
    assert results.get(timeout=5) == results.get(timeout=5)


def _killed_midway(ckpt: Path, writing) -> None:
    """In a forked process: an export that stops, half-written, until it is killed."""
    def write(translator, out, *args):
        (out / "model.bin").write_bytes(b"half")
        writing.set()
        threading.Event().wait()

    ct2_export.write_ctranslate2 = write
    export_dir(ckpt, "auto", "float32")


def test_an_export_killed_midway_leaves_a_temporary_the_next_export_removes(joint, tmp_path):
    ckpt = varied_checkpoint(tmp_path / "checkpoint_last.pt", joint, joint, "post")
    ctx = mp.get_context("fork")
    writing = ctx.Event()
    child = ctx.Process(target=_killed_midway, args=(ckpt, writing))
    child.start()
    assert writing.wait(60)
    os.kill(child.pid, signal.SIGKILL)
    child.join()
    cache = tmp_path / "checkpoint_last.pt.ct2"
    assert [p.name for p in cache.iterdir() if ".tmp-" in p.name] != []  # left behind
    out = export_dir(ckpt, "auto", "float32")
    assert sorted(p.name for p in cache.iterdir()) == sorted([out.name, f".{out.name}.lock"])
    assert read_info(out) is not None


def test_only_the_temporaries_of_killed_nmt_writes_are_removed(joint, tmp_path):
    """Folders beside an export named like its temporaries but not nmt's (.NAME.old-backup),
    or nmt's of a process still running, are someone's: they stay, in the cache folder and
    beside ct2_model=DIR; those of a killed nmt write go."""
    ckpt = varied_checkpoint(tmp_path / "checkpoint_last.pt", joint, joint, "post")
    cache, mine = tmp_path / "checkpoint_last.pt.ct2", tmp_path / "m"
    cache.mkdir()
    kept, gone = [], []
    for folder, name in ((cache, "float32-auto-0123456789abcdef"), (tmp_path, "m")):
        kept += [folder / f".{name}.old-backup", folder / f".{name}.tmp-mine",
                 folder / f".{name}.tmp-nmt{os.getpid()}-abcd_123"]  # this process runs
        gone += [folder / f".{name}.tmp-nmt{GONE}-abcd_123",
                 folder / f".{name}.old-nmt{GONE}-x1y2z3w4"]
    for path in kept + gone:
        path.mkdir()
        (path / "model.bin").write_bytes(b"theirs")
    export_dir(ckpt, "auto", "float32")
    export_dir(ckpt, "auto", "float32", str(mine))
    assert [p for p in kept if (p / "model.bin").read_bytes() == b"theirs"] == kept
    assert [p for p in gone if p.exists()] == []


def test_what_another_process_holds_locked_is_left_alone(joint, tmp_path):
    """An export being loaded is not removed as stale, nor the temporary of one being
    written; both go once their locks are free."""
    ckpt = varied_checkpoint(tmp_path / "checkpoint_last.pt", joint, joint, "post")
    first = export_dir(ckpt, "auto", "float32")
    writing = first.with_name("float32-auto-0123456789abcdef")
    temporary = first.with_name(f".{writing.name}.tmp-nmt{GONE}-x1y2z3w4")  # a killed one's
    temporary.mkdir()
    held = [ct2_export._lock(first)[0], ct2_export._lock(writing)[0]]  # as another process would
    varied_checkpoint(ckpt, joint, joint, "post", seed=1)
    second = export_dir(ckpt, "auto", "float32")
    assert first.exists() and temporary.exists()
    for fd in held:
        os.close(fd)
    assert export_dir(ckpt, "auto", "float32") == second
    assert sorted(p.name for p in first.parent.iterdir()) == sorted(
        [second.name, f".{second.name}.lock"])


@pytest.mark.isa  # CTranslate2's int8 under CT2_FORCE_CPU_ISA too
def test_an_nmt_export_directory_is_used_as_it_is(ckpt, tmp_path, monkeypatch):
    from nmt.commands.export import export
    from nmt.config import ExportConfig

    export(ExportConfig(checkpoint=str(ckpt), output=str(tmp_path / "m"), quantization="int8"))
    monkeypatch.setattr(ct2_export, "_export", lambda *a: pytest.fail("exported again"))
    with CT2Translator.load(ckpt, dtype="int8", ct2_model=str(tmp_path / "m"), threads=1) as ct:
        out = ct.translate_ids([[5, 6, 7]], SearchConfig(beam_size=1, max_len_a=0, max_len_b=4))
    assert len(out[0][0].tokens) <= 4


@pytest.mark.slow
def test_nmt_translate_with_a_prefix_and_scoring(ckpt, tmp_path):
    """prefix=true and score_reference=true through nmt-translate: greedy outputs start with
    their prefix and are nmt's; scores of given pairs are nmt's (the full distribution)."""
    lines = list(bundled_sentences())[:16]
    prefixes = ["", "ang", "Datei", "ang ang"] * 4  # an empty one too
    pairs = zip(lines, prefixes, strict=True)
    (tmp_path / "in.tsv").write_text("".join(f"{s}\t{p}\n" for s, p in pairs))

    def run(engine_name: str, *args: str) -> dict:
        return translate(to_object(compose("translate", [
            f"checkpoint={ckpt}", f"input={tmp_path / 'in.tsv'}", f"engine={engine_name}",
            "workers=1", "quiet=true", "search.beam_size=1", "search.max_len_a=0",
            f"search.max_len_b={MAX_LEN}", f"output={tmp_path / engine_name}", *args]),
            TranslateConfig))

    ct2, ours = run("ctranslate2", "prefix=true"), run("nmt", "prefix=true")
    assert all(h.startswith(p) for h, p in zip(ct2.hypotheses, prefixes, strict=True))
    assert ct2.hypotheses == ours.hypotheses
    ct2, ours = run("ctranslate2", "score_reference=true"), run("nmt", "score_reference=true")
    assert [p.logprob for p in ct2.pairs] == pytest.approx(
        [p.logprob for p in ours.pairs], abs=1e-3)
    assert [p.score for p in ct2.pairs] == pytest.approx(
        [p.score for p in ours.pairs], abs=1e-3)


@pytest.mark.slow
def test_nmt_serve_with_ctranslate2_answers(ckpt):
    lines = list(bundled_sentences())[:6]
    srv = Server(ckpt, "engine=ctranslate2", "search.alpha=0", "workers=1", "threads=1")
    try:
        status, _, health = srv.call("GET", "/health")
        assert status == 200 and health["status"] == "ok"
        got = srv.translate(lines, beam_size=1)
        status, _, body = srv.call("POST", "/translate", {"text": lines, "alpha": 0.6})
        assert status == 422 and body["field"] == "alpha"
        status, _, body = srv.call("POST", "/translate", {"text": lines, "attention": True})
        assert status == 422 and body["field"] == "attention"
    finally:
        assert srv.stop() == 0
    tr = Translator.load(ckpt, dtype=None)
    want = tr.translate_ids(tr.src_tok.encode(lines), SearchConfig(beam_size=1, max_len_b=8))
    assert [t["text"] for t in got] == tr.tgt_tok.decode([h[0].tokens for h in want])
