"""Token arrays and token-bucket batching: budgets, coverage, shuffling, lockstep sharding."""

import numpy as np
import pytest
from conftest import write_token_array

from nmt.data import (
    EpochBatchIterator,
    ParallelData,
    TokenArray,
    batch_by_tokens,
    clean_text_path,
    collate,
    read_manifest,
    token_dtype,
)
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


def test_clean_text_is_found_under_its_old_name_too(tmp_path):
    assert clean_text_path(tmp_path, "valid", "de") == tmp_path / "valid.clean.de"
    (tmp_path / "valid.raw.de").write_text("from before the rename\n")
    assert clean_text_path(tmp_path, "valid", "de") == tmp_path / "valid.raw.de"
    (tmp_path / "valid.clean.de").write_text("new\n")
    assert clean_text_path(tmp_path, "valid", "de") == tmp_path / "valid.clean.de"


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


def test_iterator_state_resumes_at_the_same_batch(tiny_data_dir):
    data = ParallelData(tiny_data_dir, "train")
    itr = EpochBatchIterator(data, 300, 7, PAD)
    n = len(itr)
    full = [b.ids.tolist() for _, b in itr] + [b.ids.tolist() for _, b in itr]  # 2 epochs
    itr = EpochBatchIterator(data, 300, 7, PAD)
    part = []
    for _, b in itr:
        part.append(b.ids.tolist())
        if len(part) == n - 2:
            break
    state = itr.state_dict()
    resumed = EpochBatchIterator(data, 300, 7, PAD)
    assert resumed.load_state_dict(state)
    part += [b.ids.tolist() for _, b in resumed]
    assert resumed.epoch == 2
    part += [b.ids.tolist() for _, b in resumed]
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
    from nmt.data import Prefetcher

    data = ParallelData(tiny_data_dir, "train")
    reference = EpochBatchIterator(data, 256, seed=1, pad_id=0, rank=1, world_size=2)
    expected = [(e, reference.global_index(i), b.ids.tolist())
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
            got += [(epoch, index, batch.ids.tolist()) for index, batch in group]
    finally:
        loader.close()
    assert got == expected


def test_prefetcher_starts_at_a_saved_position(tiny_data_dir):
    from nmt.data import Prefetcher

    data = ParallelData(tiny_data_dir, "train")
    itr = EpochBatchIterator(data, 256, seed=1, pad_id=0)
    n = len(itr)
    itr.load_state_dict({**itr.state_dict(), "consumed": n})  # after an epoch's last batch
    loader = Prefetcher(itr)
    assert (itr.epoch, itr.consumed) == (2, 0)
    epoch, group = loader.take(1)
    loader.close()
    assert epoch == 2 and group[0][1].ids.tolist() == itr.global_batches(2)[0].tolist()
