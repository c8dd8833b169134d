"""Token arrays and token-bucket batching: budgets, coverage, shuffling, lockstep sharding;
damaged data directories; weighted corpora; subword sampling."""

from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import write_token_array

from nmt.data.arrays import (
    VERIFIED,
    ParallelData,
    TokenArray,
    check_ids,
    token_dtype,
    verify_data_dir,
)
from nmt.data.batches import EpochBatchIterator, batch_by_tokens, collate, padded_length
from nmt.data.manifest import Corpus, read_manifest
from nmt.data.sampling import SubwordSampler
from nmt.errors import NmtError

PAD, BOS, EOS = 0, 2, 3


def padded_size(data: ParallelData, ids) -> int:
    """The budget a batch uses: max(B * S_max, B * T_max), EOS/BOS included."""
    return len(ids) * max(data.src_lengths()[ids].max(), data.tgt_lengths()[ids].max())


def test_token_array_round_trip(tmp_path):
    sents = [[5, 6, 7], [], [9], list(range(4, 300))]
    assert write_token_array(tmp_path / "x", sents, np.uint16) == 3 + 0 + 1 + 296
    arr = TokenArray(tmp_path / "x", np.uint16)
    assert len(arr) == 4 and [arr[i].tolist() for i in range(4)] == sents


def test_token_dtype_is_uint16_while_every_id_fits_then_int32(tmp_path):
    assert token_dtype(2 ** 16) == np.uint16 and token_dtype(2 ** 16 + 1) == np.int32
    for vocab in (2 ** 16, 2 ** 20):
        write_token_array(tmp_path / "x", [[4, vocab - 1]], token_dtype(vocab))
        assert TokenArray(tmp_path / "x", token_dtype(vocab))[0].tolist() == [4, vocab - 1]


@pytest.mark.parametrize("bad", [-5, 2 ** 20])
def test_an_id_outside_the_vocabulary_is_an_error_negative_ones_too(tmp_path, bad):
    write_token_array(tmp_path / "x", [[4, 7], [bad, 9]], np.int32)  # int32: over 65,536 pieces
    array = TokenArray(tmp_path / "x", np.int32)
    with pytest.raises(NmtError, match=rf"x.bin: token 2 is id {bad}, not in \[0, 65,537\)"):
        check_ids(array, 2 ** 16 + 1, tmp_path / "x.bin")
    write_token_array(tmp_path / "ok", [[0, 7], [2 ** 16, 9]], np.int32)
    check_ids(TokenArray(tmp_path / "ok", np.int32), 2 ** 16 + 1, tmp_path / "ok.bin")  # passes


def test_corrupt_index_is_an_error(tmp_path):
    write_token_array(tmp_path / "x", [[5, 6]], np.uint16)
    np.asarray([0, 7], dtype=np.int64).tofile(tmp_path / "x.idx")
    with pytest.raises(NmtError, match="do not match"):
        TokenArray(tmp_path / "x", np.uint16)


def test_batch_by_tokens_respects_budget_and_order():
    rng = np.random.default_rng(0)
    src, tgt = rng.integers(1, 40, 500), rng.integers(1, 40, 500)
    order = np.lexsort((src, tgt))
    batches = batch_by_tokens(order, src, tgt, 200)
    assert np.array_equal(np.concatenate(batches), order)  # consecutive, nothing lost
    for b in batches:
        assert len(b) * max(src[b].max(), tgt[b].max()) <= 200
    # greedy: adding the next sentence would have broken the budget
    for b, nxt in zip(batches, batches[1:], strict=False):
        c = np.append(b, nxt[0])
        assert len(c) * max(src[c].max(), tgt[c].max()) > 200


def test_batch_by_tokens_as_translation_uses_it_longest_first():
    lengths = np.array([3, 9, 1, 7, 7, 2, 12, 5, 5, 25])
    order = np.argsort(-lengths, kind="stable")
    batches = batch_by_tokens(order, lengths, lengths, 20)
    assert np.array_equal(np.concatenate(batches), order)
    assert [b.tolist() for b in batches[:2]] == [[9], [6]]  # over the budget: alone
    for b in batches:
        assert len(b) == 1 or len(b) * lengths[b[0]] <= 20  # the first sets the width
    limited = batch_by_tokens(order, lengths, lengths, 10 ** 6, max_sentences=3)
    assert [len(b) for b in limited] == [3, 3, 3, 1]


def test_collate_adds_specials_and_counts_tokens(tiny_data_dir):
    data = ParallelData(tiny_data_dir, "valid")
    ids = np.array([0, 3, 5])
    batch = collate(data, ids, PAD)
    for b, i in enumerate(ids):
        s, t = data.src[i].tolist(), data.tgt[i].tolist()
        assert batch.src[b, :len(s) + 1].tolist() == s + [EOS]
        assert (batch.src[b, len(s) + 1:] == PAD).all()
        assert batch.tgt_in[b, :len(t) + 1].tolist() == [BOS] + t
        assert batch.tgt_out[b, :len(t) + 1].tolist() == t + [EOS]
        assert (batch.tgt_out[b, len(t) + 1:] == PAD).all()
    assert batch.tgt_tokens == int((batch.tgt_out != PAD).sum())
    assert batch.src_tokens == int((batch.src != PAD).sum())
    assert batch.padded_tokens == batch.src.numel() + batch.tgt_in.numel()


def test_lengths_padded_to_a_multiple_for_compiled_models(tiny_data_dir):
    """train.compile: both lengths a multiple of 8 (within the model's positions), the same
    tokens and targets otherwise."""
    data = ParallelData(tiny_data_dir, "valid")
    ids = np.array([0, 3, 5])
    plain, padded = collate(data, ids, PAD), collate(data, ids, PAD, pad_to=8)
    assert padded.src.size(1) % 8 == 0 and padded.tgt_in.size(1) % 8 == 0
    S, T = plain.src.size(1), plain.tgt_in.size(1)
    assert torch.equal(padded.src[:, :S], plain.src) and (padded.src[:, S:] == PAD).all()
    assert torch.equal(padded.tgt_out[:, :T], plain.tgt_out)
    assert (padded.tgt_in[:, T:] == PAD).all() and (padded.tgt_out[:, T:] == PAD).all()
    assert (padded.tgt_tokens, padded.src_tokens) == (plain.tgt_tokens, plain.src_tokens)
    assert all(torch.equal(a, b) for a, b in zip(padded.targets, plain.targets, strict=True))
    assert collate(data, ids, PAD, pad_to=8, limit=S).src.size(1) == S  # no position past it
    assert padded_length(9, 8) == 16 and padded_length(9, 8, limit=12) == 12
    assert padded_length(13, 8, limit=12) == 13  # longer than the limit: left as it is


def test_epoch_covers_every_sentence_once_within_budget(tiny_data_dir):
    data = ParallelData(tiny_data_dir, "train")
    itr = EpochBatchIterator(data, max_tokens=300, seed=1, pad_id=PAD)
    batches = itr.global_batches(1)
    assert sorted(np.concatenate(batches).tolist()) == list(range(len(data)))
    assert all(padded_size(data, b) <= 300 for b in batches)
    # length-sorted buckets: far less padding than random batches of the same sizes
    perm = np.random.default_rng(0).permutation(len(data))
    sizes = np.cumsum([len(b) for b in batches])[:-1]
    rand = np.split(perm, sizes)
    used = sum(len(b) * data.tgt_lengths()[b].max() for b in batches)
    used_random = sum(len(b) * data.tgt_lengths()[b].max() for b in rand)
    assert used < 0.8 * used_random


def test_batch_order_is_reshuffled_each_epoch_and_reproducible(tiny_data_dir):
    data = ParallelData(tiny_data_dir, "train")
    itr = EpochBatchIterator(data, max_tokens=300, seed=1, pad_id=PAD)
    e1, e2 = itr.global_batches(1), itr.global_batches(2)
    assert [b.tolist() for b in e1] != [b.tolist() for b in e2]
    again = EpochBatchIterator(data, max_tokens=300, seed=1, pad_id=PAD).global_batches(2)
    assert [b.tolist() for b in e2] == [b.tolist() for b in again]
    other = EpochBatchIterator(data, max_tokens=300, seed=2, pad_id=PAD).global_batches(2)
    assert [b.tolist() for b in e2] != [b.tolist() for b in other]


@pytest.mark.parametrize("world_size", [2, 3, 8])
def test_ranks_take_the_same_number_of_steps(tiny_data_dir, world_size):
    data = ParallelData(tiny_data_dir, "train")
    for epoch in (1, 2):
        ranks = [EpochBatchIterator(data, 300, 1, PAD, rank=r, world_size=world_size)
                 for r in range(world_size)]
        single = EpochBatchIterator(data, 300, 1, PAD).global_batches(epoch)
        local = [itr.local_batches(epoch) for itr in ranks]
        assert len({len(x) for x in local}) == 1  # lockstep: no rank waits at the epoch's end
        assert len(single) - len(local[0]) * world_size < world_size  # at most W-1 dropped
        # rank r's i-th batch is the global batch i * W + r of the same order as one process
        for r, batches in enumerate(local):
            for i, b in enumerate(batches):
                assert np.array_equal(b, single[ranks[r].global_index(i)])
        seen = np.concatenate([np.concatenate(x) for x in local])
        assert len(seen) == len(set(seen.tolist()))  # disjoint shards


def test_too_long_sentences_are_skipped(tiny_data_dir):
    data = ParallelData(tiny_data_dir, "train")
    longest = int(np.maximum(data.src_lengths(), data.tgt_lengths()).max())
    itr = EpochBatchIterator(data, max_tokens=longest - 1, seed=1, pad_id=PAD)
    assert itr.skipped > 0
    kept = np.concatenate(itr.global_batches(1))
    assert np.maximum(data.src_lengths(), data.tgt_lengths())[kept].max() < longest
    by_positions = EpochBatchIterator(data, 10_000, 1, PAD, max_positions=longest - 1)
    assert by_positions.skipped == itr.skipped


def contents(batch) -> list[list[int]]:
    """What a batch holds: its padded source rows, then its target rows."""
    return batch.src.tolist() + batch.tgt_out.tolist()


def test_iterator_state_resumes_at_the_same_batch(tiny_data_dir):
    data = ParallelData(tiny_data_dir, "train")
    itr = EpochBatchIterator(data, 300, 7, PAD)
    n = len(itr)
    full = [contents(b) for _, b in itr] + [contents(b) for _, b in itr]  # 2 epochs
    itr = EpochBatchIterator(data, 300, 7, PAD)
    part = []
    for _, b in itr:
        part.append(contents(b))
        if len(part) == n - 2:
            break
    state = itr.state_dict()
    resumed = EpochBatchIterator(data, 300, 7, PAD)
    assert resumed.load_state_dict(state)
    part += [contents(b) for _, b in resumed]
    assert resumed.epoch == 2
    part += [contents(b) for _, b in resumed]
    assert part == full


def test_changed_batching_restarts_the_epoch(tiny_data_dir):
    data = ParallelData(tiny_data_dir, "train")
    itr = EpochBatchIterator(data, 300, 7, PAD)
    state = {**itr.state_dict(), "consumed": 3, "epoch": 2}
    other = EpochBatchIterator(data, 400, 7, PAD)
    assert not other.load_state_dict(state)
    assert (other.epoch, other.consumed) == (2, 0)


def test_missing_manifest_is_an_error(tmp_path):
    with pytest.raises(NmtError, match="nmt-preprocess"):
        read_manifest(tmp_path)


def test_prefetcher_gives_the_iterators_batches_and_moves_only_when_taken(tiny_data_dir):
    from nmt.data.batches import Prefetcher

    data = ParallelData(tiny_data_dir, "train")
    reference = EpochBatchIterator(data, 256, seed=1, pad_id=0, rank=1, world_size=2)
    expected = [(e, reference.global_index(i), contents(b))
                for e in (1, 2) for i, b in reference]  # two epochs, rank 1 of 2
    itr = EpochBatchIterator(data, 256, seed=1, pad_id=0, rank=1, world_size=2)
    loader = Prefetcher(itr, depth=3)
    got = []
    try:
        while itr.epoch <= 2:
            position = (itr.epoch, itr.consumed)
            epoch, group = loader.take(3)
            assert epoch == position[0] and 1 <= len(group) <= 3
            assert (itr.epoch, itr.consumed) in ((epoch, position[1] + len(group)),
                                                 (epoch + 1, 0))  # the epoch's last group
            got += [(epoch, index, contents(batch)) for index, batch in group]
    finally:
        loader.close()
    assert got == expected


def test_prefetcher_starts_at_a_saved_position(tiny_data_dir):
    from nmt.data.batches import Prefetcher

    data = ParallelData(tiny_data_dir, "train")
    itr = EpochBatchIterator(data, 256, seed=1, pad_id=0)
    n = len(itr)
    itr.load_state_dict({**itr.state_dict(), "consumed": n})  # after an epoch's last batch
    loader = Prefetcher(itr)
    assert (itr.epoch, itr.consumed) == (2, 0)
    epoch, group = loader.take(1)
    loader.close()
    first = collate(data, itr.global_batches(2)[0], 0)
    assert epoch == 2 and contents(group[0][1]) == contents(first)


# ----------------------------------------------------------------------------- damaged data
def copy_of(data_dir, tmp_path):
    """A copy of a data directory that a test may damage, never verified (the session's
    directory may have been verified by an earlier test on this worker)."""
    import shutil

    from nmt.data.arrays import VERIFIED

    return Path(shutil.copytree(data_dir, tmp_path / "data",
                                ignore=shutil.ignore_patterns(VERIFIED)))


def open_and_verify(data_dir):
    """What nmt-train does on opening a data directory: sizes, then checksums and ids."""
    manifest = read_manifest(data_dir)
    for split in manifest.splits:
        ParallelData(data_dir, split, manifest)
    return verify_data_dir(data_dir, manifest)


@pytest.mark.parametrize("damage, error", [
    ("odd size", r"train.en.bin: 5,213 bytes where manifest.json's 2,607 tokens x 2 bytes "
                 r"give 5,214: truncated or damaged"),
    ("cut on a token", r"train.en.bin: 5,200 bytes where manifest.json's 2,607 tokens x 2 "
                       r"bytes give 5,214: truncated or damaged"),
    ("short index", r"train.en.idx: 800 bytes where manifest.json's 160 sentences \(\+1\) x 8 "
                    r"bytes give 1,288"),
    ("flipped byte", r"train.en.bin: sha256 differs from manifest.json's: the file changed"),
    ("id out of range", r"train.en.bin: token 7 is id 65535, not in \[0, 120\)"),
    ("missing", r"train.en.bin: cannot read \(No such file or directory\)"),
])
def test_a_damaged_data_directory_is_a_one_line_error_naming_the_file(
        corpora_dir, tmp_path, damage, error):
    import json

    data = copy_of(corpora_dir, tmp_path)
    assert "verified (checksums and ids)" in open_and_verify(data)
    assert "verified before" in open_and_verify(data)  # remembered: not read again
    path = data / "train.en.bin"
    content = bytearray(path.read_bytes())
    if damage == "odd size":
        path.write_bytes(content[:-1])
    elif damage == "cut on a token":
        path.write_bytes(content[:5200])
    elif damage == "short index":
        (data / "train.en.idx").write_bytes((data / "train.en.idx").read_bytes()[:800])
    elif damage == "flipped byte":
        content[100] ^= 0x01  # still an id below the vocabulary size
        path.write_bytes(content)
    elif damage == "id out of range":
        content[14:16] = b"\xff\xff"
        path.write_bytes(content)
        manifest = json.loads((data / "manifest.json").read_text())
        del manifest["checksums"]["train.en.bin"]  # format 1 directories of the tests have none
        (data / "manifest.json").write_text(json.dumps(manifest))
    else:
        path.unlink()
    with pytest.raises(NmtError, match=error) as e:
        open_and_verify(data)
    assert "\n" not in str(e.value) and str(data) in str(e.value)


def test_verification_is_remembered_per_directory_unless_asked(corpora_dir, tmp_path,
                                                               monkeypatch):
    import nmt.data.arrays

    data = copy_of(corpora_dir, tmp_path)
    reads = []
    real = nmt.data.arrays.sha256_file
    monkeypatch.setattr(nmt.data.arrays, "sha256_file", lambda p: reads.append(p) or real(p))
    manifest = read_manifest(data)
    verify_data_dir(data, manifest)
    n = len(reads)
    assert n == len(manifest.checksums)
    verify_data_dir(data, manifest)
    assert len(reads) == n  # a stamp keyed by size and modification time
    verify_data_dir(data, manifest, always=True)  # train.check_data=true
    assert len(reads) == 2 * n
    (data / "valid.clean.de").write_text("changed\n")
    with pytest.raises(NmtError, match="valid.clean.de: sha256 differs"):
        verify_data_dir(data, manifest)


def test_a_read_only_data_directory_is_verified_every_time(corpora_dir, tmp_path, monkeypatch):
    import nmt.data.arrays

    def refuse(path, content, durable=False):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(nmt.data.arrays, "write_atomically", refuse)
    data = copy_of(corpora_dir, tmp_path)
    for _ in range(2):
        assert "read-only: it will be checked again" in verify_data_dir(data, read_manifest(data))
    assert not (data / VERIFIED).exists()


def test_a_newer_manifest_format_is_a_one_line_error(tmp_path):
    import json

    (tmp_path / "manifest.json").write_text(json.dumps({"format": 4}))
    with pytest.raises(NmtError, match="format 4 is newer than this nmt reads"):
        read_manifest(tmp_path)


def test_a_format_1_directory_reads_as_one_corpus(tiny_data_dir):
    manifest = read_manifest(tiny_data_dir)
    assert manifest.format == 1 and manifest.corpora is None
    [corpus] = manifest.training_corpora()
    assert (corpus.first, corpus.pairs, corpus.weight, corpus.tag_id) == (0, 600, 1.0, None)
    assert "verified" in verify_data_dir(tiny_data_dir, manifest)  # no checksums: ids only


# ----------------------------------------------------------------------------- corpora
def two_corpora(data, weights):
    """EpochBatchIterator arguments for a split cut into corpora of 200 and 400 sentences."""
    return {"corpora": [Corpus("a", "", 0, 200, 0, 0),
                        Corpus("b", "", 200, len(data) - 200, 0, 0)],
            "weights": weights}


def drawn(batches) -> np.ndarray:
    """How often each sentence is in these batches, by sentence index."""
    return np.bincount(np.concatenate(batches), minlength=600)


@pytest.mark.parametrize("weights", [[2.0, 0.5], [1.5, 1.0], [0.0, 1.0]])
def test_an_epoch_draws_each_corpus_by_its_weight(tiny_data_dir, weights):
    data = ParallelData(tiny_data_dir, "train")
    itr = EpochBatchIterator(data, 300, 1, PAD, **two_corpora(data, weights))
    seen = [drawn(itr.global_batches(e)) for e in (1, 2)]
    for counts in seen:
        a, b = counts[:200], counts[200:]
        assert a.sum() == round(weights[0] * 200) and b.sum() == round(weights[1] * 400)
        for corpus, w in ((a, weights[0]), (b, weights[1])):
            assert set(corpus.tolist()) <= {int(w), int(w) + 1}  # whole copies, then a part
    if weights[1] == 0.5:  # another half each epoch
        assert not np.array_equal(seen[0][200:], seen[1][200:])
    assert all(padded_size(data, b) <= 300 for b in itr.global_batches(1))


@pytest.mark.parametrize("world_size", [1, 2, 3, 8])
def test_weighted_epochs_are_shared_out_in_proportion(tiny_data_dir, world_size):
    data = ParallelData(tiny_data_dir, "train")
    args = two_corpora(data, [2.0, 0.5])
    single = EpochBatchIterator(data, 300, 1, PAD, **args).global_batches(1)
    ranks = [EpochBatchIterator(data, 300, 1, PAD, rank=r, world_size=world_size, **args)
             for r in range(world_size)]
    local = [itr.local_batches(1) for itr in ranks]
    for r, batches in enumerate(local):
        assert all(np.array_equal(b, single[ranks[r].global_index(i)])
                   for i, b in enumerate(batches))
    counts = drawn([b for batches in local for b in batches])
    share = counts[:200].sum() / counts.sum()
    assert share == pytest.approx(400 / 600, abs=0.03)  # 2 x 200 of 2 x 200 + 0.5 x 400


def test_changed_weights_restart_the_epoch(tiny_data_dir):
    data = ParallelData(tiny_data_dir, "train")
    itr = EpochBatchIterator(data, 300, 7, PAD, **two_corpora(data, [2.0, 0.5]))
    state = {**itr.state_dict(), "consumed": 3}
    assert EpochBatchIterator(data, 300, 7, PAD, **two_corpora(data, [2.0, 0.5])
                              ).load_state_dict(state)
    assert not EpochBatchIterator(data, 300, 7, PAD, **two_corpora(data, [1.0, 0.5])
                                  ).load_state_dict(state)
    old = {k: v for k, v in EpochBatchIterator(data, 300, 7, PAD).state_dict().items()
           if k not in ("weights", "budget")}  # a checkpoint from before they were saved
    assert EpochBatchIterator(data, 300, 7, PAD).load_state_dict(old)


# ----------------------------------------------------------------------------- subword sampling
def sampling_iterator(data_dir, alpha=0.1, **kwargs):
    """The training iterator of a data directory with subword sampling."""
    manifest = read_manifest(data_dir)
    return EpochBatchIterator(ParallelData(data_dir, "train", manifest), kwargs.pop(
        "max_tokens", 200), 1, PAD, corpora=manifest.training_corpora(),
        sampler=SubwordSampler(data_dir, manifest, alpha), **kwargs)


def test_subword_sampling_draws_by_the_batch_within_max_tokens(corpora_dir):
    from nmt.data.tokenizer import Tokenizer

    itr = sampling_iterator(corpora_dir, max_tokens=200)
    plain = EpochBatchIterator(itr.data, 200, 1, PAD)
    assert itr.budget == int(200 / 1.3) and plain.budget == 200  # room for longer rows
    tok = Tokenizer.from_file(corpora_dir / "spm.model")
    tag = read_manifest(corpora_dir).training_corpora()[1].tag_id
    changed = rows = tagged = 0
    for i, ids in enumerate(itr.local_batches(1)):
        batch, again = itr.collate(ids, 1, i), itr.collate(ids, 1, i)
        stored = collate(itr.data, ids, PAD)
        assert contents(batch) == contents(again)  # seeded by the batch's place
        assert max(batch.src.numel(), batch.tgt_in.numel()) <= 200
        for side in ("src", "tgt_out"):
            for row, ref in zip(getattr(batch, side).tolist(), getattr(stored, side).tolist(),
                                strict=True):
                assert tok.decode([row]) == tok.decode([ref])  # the same text
                if side == "src" and ref[0] == tag:
                    assert row[0] == tag  # the tag stays first, one piece
                    tagged += 1
                changed += row != ref
                rows += 1
    assert 0.3 * rows < changed < rows and tagged > 0
    other = itr.collate(itr.local_batches(1)[0], 2, 0)  # another place: another draw
    assert contents(other) != contents(itr.collate(itr.local_batches(1)[0], 1, 0))


def test_subword_sampling_gives_ranks_the_draws_of_one_process(corpora_dir):
    single = sampling_iterator(corpora_dir)
    for r in range(2):
        rank = sampling_iterator(corpora_dir, rank=r, world_size=2)
        for i, ids in enumerate(rank.local_batches(1)):
            j = rank.global_index(i)
            assert contents(rank.collate(ids, 1, i)) == contents(
                single.collate(single.local_batches(1)[j], 1, j))


def test_subword_sampling_needs_the_training_text(tiny_data_dir):
    with pytest.raises(NmtError, match="has no training text .*keep_text=true"):
        SubwordSampler(tiny_data_dir, read_manifest(tiny_data_dir), 0.1)
