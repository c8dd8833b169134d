"""The engine interface (nmt.engines.engine, nmt.capabilities) and nmt's one worker pool
(nmt.engines.workers): open_translator, the refusals stated once, and the same workers
decoding nmt-translate's batches and running nmt-serve's loops."""

import multiprocessing as mp
import os
import signal
import typing
from concurrent.futures import FIRST_COMPLETED, wait

import pytest
import torch
from translate_helpers import save_tiny_checkpoint

from nmt.capabilities import ENGINES
from nmt.config import SearchConfig
from nmt.decoding import tight_loops
from nmt.decoding.fast_model import FastModel
from nmt.decoding.messages import Batch, Done, Sentence
from nmt.engines.engine import Engine, Workers, check_vocab
from nmt.engines.translator import Translator
from nmt.errors import ConfigError, NmtError
from nmt.inference.engines import open_translator

pytestmark = pytest.mark.usefixtures("one_thread")
SEARCH = SearchConfig(beam_size=2, max_len_b=4)


@pytest.fixture(scope="module")
def ckpt(tiny_data_dir, tmp_path_factory):
    path = tmp_path_factory.mktemp("run") / "checkpoint_last.pt"
    return save_tiny_checkpoint(path, (tiny_data_dir / "spm.model").read_bytes(), N=1)


def loop_answers(pool, workers: int, whole: bool = False) -> list:
    """One sentence sent to each worker's loop; the messages that come back."""
    for w in range(workers):
        pool.send(w, Batch(SEARCH, [Sentence((w,), [4, 5, 6])], whole))
    return [pool.read(timeout=60) for _ in range(workers)]


def test_open_translator_gives_nmts_engine_and_checks_the_vocabulary(ckpt, tiny_data_dir):
    with open_translator("nmt", [str(ckpt)], torch.device("cpu"), dtype="fp32") as tr:
        assert isinstance(tr, Translator) and tr.capabilities == ENGINES["nmt"]
        check_vocab(tr, str(tiny_data_dir), str(ckpt))  # the data it was made from
        with pytest.raises(NmtError, match="manifest"):
            check_vocab(tr, str(ckpt.parent), str(ckpt))  # no data directory there


def test_refusals_name_the_key_once_for_every_caller():
    ct2 = ENGINES["ctranslate2"]
    for key in ("checkpoint", "constraints", "alignment", "attention_plot", "attention",
                "continuous", "sampling", "search.sampling"):
        ENGINES["nmt"].check(key)
        ct2.check(key, used=False)
        with pytest.raises(ConfigError, match=f"^{key}: engine=ctranslate2 .*; use engine=nmt$"):
            ct2.check(key)
    ENGINES["nmt"].check_search(SearchConfig(beam_size=4, alpha=0.6))
    ct2.check_search(SearchConfig(beam_size=1, alpha=0.6))  # greedy: the scores only
    with pytest.raises(ConfigError, match="^search.alpha: engine=ctranslate2 has no GNMT"):
        ct2.check_search(SearchConfig(beam_size=4, alpha=0.6))
    ENGINES["nmt"].check_search(SearchConfig(compile=True))
    with pytest.raises(ConfigError, match="^search.compile: engine=ctranslate2 decodes with"):
        ct2.check_search(SearchConfig(beam_size=1, compile=True))


def test_one_pool_decodes_batches_then_runs_the_serving_loops(ckpt):
    """workers=2: the same two processes decode nmt-translate's batches and then each runs
    nmt-serve's loop on its own inbox, which answers newcomers and whole batches alike; none is
    forked besides them."""
    with Translator.load(ckpt, dtype="fp32", workers=2) as tr:
        children = {p.pid for p in mp.active_children()}
        assert len(children) == 2 and tr.pool.processes
        batch = tr.translate_ids([[4, 5, 6]] * 2, SEARCH)  # one batch per worker
        pool = tr.stepper()
        assert pool is tr.pool and tr.stepper() is pool  # started once
        assert isinstance(pool, Workers)  # the engine protocol's type, not a concrete class
        for whole in (False, True):
            answers = loop_answers(pool, 2, whole)
            assert {p.pid for p in mp.active_children()} == children
            assert sorted(a.worker for a in answers) == [0, 1]  # each answered its inbox
            for done in answers:
                assert isinstance(done, Done) and [
                    (r.tag, [h.tokens for h in r.hypotheses]) for r in done.results] \
                    == [((done.worker,), [h.tokens for h in batch[0]])]
        assert pool.dead() == ""
    assert mp.active_children() == []


def test_the_stepper_is_typed_by_a_protocol_not_the_pool_class():
    """Engine.stepper gives Workers (what nmt-serve uses of a pool: both engines' pools
    satisfy it, the tests below), not a concrete class."""
    assert typing.get_type_hints(Engine.stepper)["return"] is Workers
    assert not isinstance(object(), Workers)


def test_one_worker_is_one_thread_for_batches_and_loops(ckpt):
    with Translator.load(ckpt, dtype="fp32", workers=1) as tr:
        assert not tr.pool.processes and tr.workers == 1 and mp.active_children() == []
        batch = tr.translate_ids([[4, 5, 6]], SEARCH)
        done, = loop_answers(tr.stepper(), 1)
        assert isinstance(tr.stepper(), Workers)
        assert isinstance(done, Done) and done.worker == 0
        assert [h.tokens for h in done.results[0].hypotheses] == [h.tokens for h in batch[0]]


def test_a_dead_worker_is_reported_and_the_pool_still_closes(ckpt):
    with Translator.load(ckpt, dtype="fp32", workers=2) as tr:
        pool = tr.stepper()
        loop_answers(pool, 2)  # both loops run
        os.kill(mp.active_children()[0].pid, signal.SIGKILL)
        wait(pool.loops, timeout=60, return_when=FIRST_COMPLETED)
        assert pool.dead() == "a decoding worker died; restart the server"


def test_a_beam_searchs_whole_batches_hold_what_the_tight_loop_takes(ckpt, monkeypatch):
    """batch_sentences (nmt-serve's dynamic batches) is the most sentences tight_loops.beam
    takes for a beam search it runs, no more than int8's beam package takes (its rows, k a
    sentence); any number (0) for greedy, sampling, the n-gram rule, a shortlist, an
    ensemble, or where the fused operator does not build (the core runs them)."""
    beam = SearchConfig(beam_size=4)
    with Translator.load(ckpt, workers=1) as tr:
        models = tr.prepared(beam.dtype, beam.compile)
        n = tr.batch_sentences(beam)
        assert n == (tight_loops.BEAM_SENTENCES if models[0].fused else 0)
        if n:  # one sentence more, and the loop would not take the batch
            for size, takes in ((n, True), (n + 1, False)):
                sentences = [Sentence(i, [4, 5, 6]) for i in range(size)]
                assert tight_loops.takes(models, sentences, beam, True, None, True) is takes
            monkeypatch.setattr(FastModel, "beam_rows", lambda fast: 20)  # a package of 20 rows
            assert tr.batch_sentences(beam) == 5  # 5 sentences of 4 rows
            monkeypatch.undo()
        for other in (SearchConfig(beam_size=1), SearchConfig(beam_size=4, sampling=True),
                      SearchConfig(beam_size=4, no_repeat_ngram_size=2),
                      SearchConfig(beam_size=4, shortlist="shortlist.bin")):
            assert tr.batch_sentences(other) == 0
    with Translator.load([ckpt, ckpt], workers=1) as ensemble:
        assert ensemble.batch_sentences(beam) == 0
