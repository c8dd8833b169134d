"""The lexical shortlist (nmt.data.shortlist, search.shortlist): built from co-occurrence
counts, decoding restricted to a batch's candidates, refused for another vocabulary, and exported as
CTranslate2's vocabulary map."""

import tracemalloc
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import write_token_array
from translate_helpers import random_sources, save_tiny_checkpoint, search, tiny_model, tokens

import nmt.data.shortlist
import nmt.decoding.admission
from nmt.commands.preprocess import preprocess
from nmt.config import BpeConfig, PreprocessConfig, ShortlistConfig
from nmt.data.arrays import ParallelData, TokenArray
from nmt.data.manifest import read_manifest
from nmt.data.shortlist import (
    Shortlist,
    build_shortlist,
    load_shortlist,
    vmap_text,
    write_shortlist,
)
from nmt.data.tokenizer import EOS_ID, SPECIALS
from nmt.decoding.batches import translate_nbest
from nmt.engines.translator import Translator
from nmt.errors import NmtError
from nmt.inference.engines import open_translator

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.isa]  # int8 columns
V = 40  # the random models' vocabulary


def counts(data: ParallelData) -> tuple[Counter, Counter]:
    """c(s, t) and c(s) by brute force: pairs holding both pieces, pairs holding s."""
    pairs, single = Counter(), Counter()
    for i in range(len(data)):
        src, tgt = set(data.src[i].tolist()), set(data.tgt[i].tolist())
        single.update(src)
        pairs.update((s, t) for s in src for t in tgt)
    return pairs, single


def test_each_source_piece_keeps_its_most_frequent_cooccurring_target(tiny_data_dir):
    manifest = read_manifest(tiny_data_dir)
    data = ParallelData(tiny_data_dir, "train", manifest)
    pairs, single = counts(data)
    built = build_shortlist(data.src, data.tgt, manifest, ShortlistConfig(k=1, score="prob"))
    for s in single:
        best = max(c for (a, _), c in pairs.items() if a == s)
        assert pairs[s, int(built.table[s, 0])] == best
    unseen = sorted(set(range(manifest.src_vocab_size)) - set(single))
    assert (built.table[unseen] == -1).all()  # never seen: no candidates of its own
    dice = build_shortlist(data.src, data.tgt, manifest, ShortlistConfig(k=3, frequent=5))
    assert EOS_ID in dice.always.tolist() and len(dice.always) <= 6
    for s in list(single)[:20]:  # Dice's best 3, as scores (ties may pick other pieces)
        c_t = Counter(t for i in range(len(data)) for t in set(data.tgt[i].tolist()))
        score = {t: 2 * c / (single[s] + c_t[t]) for (a, t), c in pairs.items() if a == s}
        want = sorted(score.values(), reverse=True)[:3]
        got = sorted((score[t] for t in dice.table[s].tolist() if t >= 0), reverse=True)
        assert got == pytest.approx(want)


def token_arrays(folder: Path, pairs: list[tuple[list[int], list[int]]]):
    """Source and target TokenArrays of id pairs (int32, as over 65,536 pieces)."""
    for side in (0, 1):
        write_token_array(folder / f"{side}", [p[side] for p in pairs], np.int32)
    return TokenArray(folder / "0", np.int32), TokenArray(folder / "1", np.int32)


def test_counts_in_chunks_are_a_plain_count(tmp_path, monkeypatch):
    rng = np.random.default_rng(0)
    pairs = [(rng.integers(0, 30, rng.integers(0, 25)).tolist(),  # repeats, empty sentences
              rng.integers(0, 20, rng.integers(0, 25)).tolist()) for _ in range(80)]
    pairs.append((list(range(30)), list(range(20))))  # longer than a chunk: a chunk alone
    monkeypatch.setattr(nmt.data.shortlist, "CHUNK", 7)  # lengths read 7 pairs at a time
    monkeypatch.setattr(nmt.data.shortlist, "PRODUCTS", 60)  # some pairs a chunk, some alone
    counts, c_src, c_tgt = nmt.data.shortlist.cooccurrence(*token_arrays(tmp_path, pairs),
                                                                30, 20)
    want, want_s, want_t = Counter(), Counter(), Counter()
    for src, tgt in pairs:
        want.update((s, t) for s in set(src) for t in set(tgt))
        want_s.update(set(src))
        want_t.update(set(tgt))
    assert {(s, t): int(c) for (s, t), c in np.ndenumerate(counts) if c} == dict(want)
    assert c_src.tolist() == [want_s[s] for s in range(30)]
    assert c_tgt.tolist() == [want_t[t] for t in range(20)]


def test_the_peak_memory_of_the_build_is_bounded_on_long_pairs(tmp_path):
    rng = np.random.default_rng(0)
    V, n, pieces = 512, 1000, 64  # 4M (source, target) products: 4 x PRODUCTS
    pairs = [(rng.permutation(V)[:pieces].tolist(), rng.permutation(V)[:pieces].tolist())
             for _ in range(n)]
    src, tgt = token_arrays(tmp_path, pairs)
    tracemalloc.start()
    try:
        counts, _, _ = nmt.data.shortlist.cooccurrence(src, tgt, V, V)
        peak = tracemalloc.get_traced_memory()[1] - counts.nbytes
    finally:
        tracemalloc.stop()
    assert int(counts.sum()) == n * pieces * pieces
    assert peak < 48 * nmt.data.shortlist.PRODUCTS  # bytes (all 4M products at once: 128 MiB)


def shortlist_file(path: Path, table: torch.Tensor, always: list[int], vocab: int = V,
                   sha: str = "x" * 64) -> str:
    Shortlist(table, torch.tensor(always), table.size(0), vocab, sha).save(path)
    return str(path)


@pytest.fixture(scope="module")
def model():
    return tiny_model(V, stops=True)


@pytest.fixture(scope="module")
def sources():
    return random_sources(12, V, seed=3)


@pytest.mark.parametrize("beam", [1, 4])
def test_a_shortlist_of_the_whole_vocabulary_changes_nothing(model, sources, tmp_path, beam):
    full = shortlist_file(tmp_path / "all.pt", torch.arange(V).repeat(V, 1), [EOS_ID])
    plain = translate_nbest(model, sources, search(beam_size=beam), SPECIALS)
    cut = translate_nbest(model, sources, search(beam_size=beam, shortlist=full), SPECIALS)
    assert tokens(cut) == tokens(plain)
    assert [h[0].score for h in cut] == [h[0].score for h in plain]


def small_shortlist(path: Path) -> str:
    """Each source piece's 2 candidates among pieces 4..19, pieces 4..8 always."""
    g = torch.Generator().manual_seed(1)
    return shortlist_file(path, torch.randint(4, 20, (V, 2), generator=g), [EOS_ID, *range(4, 9)])


@pytest.mark.parametrize("beam", [1, 4])
@pytest.mark.parametrize("dtype", ["fp32", "int8"])
def test_every_output_piece_is_a_candidate_of_its_batch(model, sources, tmp_path, beam, dtype):
    path = small_shortlist(tmp_path / "small.pt")
    cfg = search(beam_size=beam, shortlist=path, dtype=dtype, nbest=beam)
    union = set(load_shortlist(path).candidates(sources, []).ids.tolist())
    assert len(union) <= 17
    out = translate_nbest(model, sources, cfg, SPECIALS)  # one batch
    assert all(set(h.tokens) <= union and h.score > -np.inf for hyps in out for h in hyps)
    if dtype == "fp32":  # FastModel's cut projection = the reference model's logits, cut
        assert tokens(translate_nbest(model, sources, cfg, SPECIALS, fast=False)) == tokens(out)


@pytest.mark.parametrize("dtype", ["fp32", "int8"])
@pytest.mark.parametrize("kw", [
    dict(beam_size=1), dict(beam_size=4, nbest=2, min_len=3, no_repeat_ngram_size=2),
    dict(beam_size=1, sampling=True, nbest=3, top_k=5, seed=7), dict(beam_size=4, alpha=0.0)],
    ids=["greedy", "beam-rules", "sampling", "beam-alpha0"])
def test_searching_the_shortlists_columns_is_searching_full_rows(model, sources, tmp_path,
                                                                  monkeypatch, kw, dtype):
    path = small_shortlist(tmp_path / "small.pt")
    cfg = search(shortlist=path, dtype=dtype, **kw)
    prefixes = [[4 + i % 5] if i % 3 == 0 else [] for i in range(len(sources))]
    compact = translate_nbest(model, sources, cfg, SPECIALS, prefixes=prefixes)
    monkeypatch.setattr(nmt.decoding.admission, "in_columns", lambda *a: False)
    full = translate_nbest(model, sources, cfg, SPECIALS, prefixes=prefixes)
    assert tokens(compact) == tokens(full)
    scores = [[[h.score for h in hyps] for hyps in out] for out in (compact, full)]
    if dtype == "fp32":  # int8 rounds each call's activations by the batch's range, and the
        # dead beams of a forced prefix (log P -inf ties) take other tokens in the two forms
        assert scores[0] == scores[1]
    else:
        assert np.allclose(sum(scores[0], []), sum(scores[1], []), atol=0.05)
    assert all(h.tokens[:len(p)] == p for hyps, p in zip(compact, prefixes, strict=True)
               for h in hyps)


def test_forced_prefix_and_constraint_pieces_outside_the_shortlist_still_decode(
        model, sources, tmp_path):
    path = small_shortlist(tmp_path / "small.pt")
    outside = sorted(set(range(4, V)) - set(load_shortlist(path).candidates(sources, []).ids
                                            .tolist()))
    prefixes = [outside[:2]] * len(sources)
    phrases = [[[outside[2]]]] * len(sources)
    out = translate_nbest(model, sources, search(shortlist=path, max_len_b=8), SPECIALS,
                          prefixes=prefixes, constraints=phrases)
    for hyps in out:
        assert hyps[0].tokens[:2] == outside[:2] and outside[2] in hyps[0].tokens[2:]
        assert hyps[0].score > -np.inf


def test_a_shortlist_of_another_vocabulary_is_one_line_error(tmp_path, tiny_data_dir):
    """Checked once, when the translator opens (nmt-translate, nmt-serve: both engines)."""
    ckpt = save_tiny_checkpoint(tmp_path / "ckpt.pt", (tiny_data_dir / "spm.model").read_bytes())
    with Translator.load(ckpt) as translator:
        vocab = translator.vocab.tgt_size
    other = shortlist_file(tmp_path / "other.pt", torch.arange(V).repeat(vocab + 1, 1), [3],
                           vocab=vocab + 1)
    with pytest.raises(NmtError, match=rf"search.shortlist=.*other.pt: built for another "
                                       rf"vocabulary \({vocab + 1} target pieces.*\({vocab} "):
        open_translator("nmt", [str(ckpt)], torch.device("cpu"), shortlist=str(other))
    same_size = shortlist_file(tmp_path / "sha.pt", torch.arange(vocab).repeat(vocab, 1), [3],
                               vocab=vocab)
    with pytest.raises(NmtError, match=r"sha256 xxxxxxxxxxxx\) than the checkpoint's") as e:
        open_translator("nmt", [str(ckpt)], torch.device("cpu"), shortlist=str(same_size))
    assert "\n" not in str(e.value)
    (tmp_path / "junk.pt").write_bytes(b"not a shortlist")
    with pytest.raises(NmtError, match="not a shortlist file"):
        load_shortlist(tmp_path / "junk.pt")


def test_what_cannot_take_a_shortlist_is_refused_by_its_key():
    from nmt.config import ExportConfig, ServeConfig, compose, to_object
    from nmt.errors import ConfigError

    serve = to_object(compose("serve", ["checkpoint=c.pt", "continuous=true",
                                        "search.shortlist=s.pt"]), ServeConfig)
    assert serve.search.shortlist == "s.pt"  # continuous batching takes it (test_stepping)
    with pytest.raises(ConfigError, match="^shortlist: applies to format=ctranslate2 only"):
        ExportConfig(checkpoint="c.pt", output="o", format="transformers", shortlist="s.pt")
    with pytest.raises(ConfigError, match="^shortlist.score: must be dice or prob"):
        ShortlistConfig(k=3, score="ibm1")


def test_preprocess_writes_the_shortlist_of_its_training_pairs(tmp_path, tiny_data_dir):
    raw = tmp_path / "raw"
    raw.mkdir()
    for lang in ("en", "de"):
        lines = (tiny_data_dir / f"valid.clean.{lang}").read_text(encoding="utf-8")
        (raw / f"train.{lang}").write_text(lines * 3, encoding="utf-8")
    out = tmp_path / "data"
    manifest = preprocess(PreprocessConfig(src_lang="en", tgt_lang="de", train=str(raw / "train"),
                                           out_dir=str(out), workers=1,
                                           bpe=BpeConfig(model=str(tiny_data_dir / "spm.model")),
                                           shortlist=ShortlistConfig(k=4, frequent=10)))
    assert manifest.shortlist == "shortlist.pt" and "shortlist.pt" in manifest.checksums
    written = load_shortlist(out / "shortlist.pt")
    again = load_shortlist(write_shortlist(out, ShortlistConfig(k=4, frequent=10),
                                           tmp_path / "again.pt"))
    assert torch.equal(written.table, again.table) and torch.equal(written.always, again.always)
    assert written.vocab_sha256 == manifest.vocab_sha256 and written.table.size(1) == 4


def test_the_vocabulary_map_holds_the_shortlist_and_ctranslate2_uses_it(tmp_path, tiny_data_dir):
    pytest.importorskip("ctranslate2")
    from nmt.commands.export import export
    from nmt.config import ExportConfig
    from nmt.wings.ctranslate2 import CT2Translator

    ckpt = save_tiny_checkpoint(tmp_path / "ckpt.pt", (tiny_data_dir / "spm.model").read_bytes())
    path = write_shortlist(tiny_data_dir, ShortlistConfig(k=3, frequent=5), tmp_path / "sl.pt")
    shortlist = load_shortlist(path)
    export(ExportConfig(checkpoint=str(ckpt), output=str(tmp_path / "ct2"), shortlist=str(path)))
    translator = Translator.load(ckpt)
    pieces = [translator.tgt_tok.sp.id_to_piece(i) for i in range(translator.tgt_tok.vocab_size)]
    ids = {p: i for i, p in enumerate(pieces)}
    text = (tmp_path / "ct2" / "vmap.txt").read_text(encoding="utf-8")
    assert text == vmap_text(shortlist, pieces, pieces)
    rows = dict(line.split("\t") for line in text.splitlines())
    assert sorted(ids[p] for p in rows.pop("").split()) == shortlist.always.tolist()
    for piece, targets in rows.items():
        assert [ids[t] for t in targets.split()] == [
            t for t in shortlist.table[ids[piece]].tolist() if t >= 0]
    sources = translator.src_tok.encode(["open file", "save all window"])
    cfg = search(beam_size=1, shortlist=str(path), max_len_b=5)
    with CT2Translator.load(ckpt, threads=1, shortlist=str(path)) as ct:
        out = ct.translate_ids(sources, cfg)
    union = set(shortlist.candidates(sources, []).ids.tolist()) | {1}  # + <unk>: CTranslate2's
    assert all(set(h[0].tokens) <= union for h in out)
