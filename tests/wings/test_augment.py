"""train.augment: the modifiers on examples (tags untouched, both sides consistent), their
draws (a function of the seed and the sentence), the batches they make, and the robustness
benchmark's copies."""

import importlib.util
import random
from pathlib import Path

import numpy as np
import pytest

from nmt.config import AugmentConfig
from nmt.data.arrays import ParallelData
from nmt.data.batches import EpochBatchIterator
from nmt.data.manifest import read_manifest
from nmt.data.sampling import SubwordSampler
from nmt.data.tokenizer import Tokenizer
from nmt.errors import ConfigError, NmtError
from nmt.wings.augment import (
    Augmenter,
    add_typos,
    augment_pair,
    delete_char,
    draw_cases,
    drop_final_punctuation,
    repeat_char,
    swap_chars,
    title_case,
    uniform,
    upper_case,
)

ROOT = Path(__file__).resolve().parents[2]
TAGS = "<2de> <BT> >>fr<< __KEEP1__ <ph1>"


def test_upper_case_leaves_tags_whole():
    assert upper_case("<2de> the cat __KEEP1__ sat >>fr<< on ß") == \
        "<2de> THE CAT __KEEP1__ SAT >>fr<< ON SS"


def test_title_case_upper_cases_first_letters_only():
    assert title_case("the iPhone <BT> of  a cat, <b>bold") == "The IPhone <BT> Of  A Cat, <b>Bold"
    assert title_case("<ph1>x") == "<ph1>X"  # a word right after a tag counts as one


@pytest.mark.parametrize("text, dropped", [
    ("Hello world.", "Hello world"), ("Really?! ", "Really"), ('He said "no."', "He said \"no"),
    ("x ...", "x"), ("no punctuation", "no punctuation"), ("a tag <BT>", "a tag <BT>"),
    ("as >>de<<", "as >>de<<"), ("?!", "?!")])
def test_drop_final_punctuation(text, dropped):
    assert drop_final_punctuation(text) == dropped


def test_each_typo_kind_edits_one_letter_outside_tags():
    text = f"{TAGS} abcde fghij"
    for seed in range(30):
        rng = random.Random(seed)
        swapped, deleted, repeated = (f(text, rng) for f in (swap_chars, delete_char,
                                                             repeat_char))
        for out in (swapped, deleted, repeated):
            assert out.startswith(TAGS + " ")  # tags untouched
        diff = [i for i, (a, b) in enumerate(zip(text, swapped, strict=True)) if a != b]
        assert len(diff) == 2 and diff[1] == diff[0] + 1  # two neighbours, swapped
        assert swapped[diff[0]] == text[diff[1]] and swapped[diff[1]] == text[diff[0]]
        assert len(deleted) == len(text) - 1 and any(
            deleted == text[:i] + text[i + 1:] for i in range(len(TAGS), len(text)))
        assert len(repeated) == len(text) + 1 and any(
            repeated == text[:i + 1] + text[i:] and text[i].isalnum() for i in range(len(text)))
    assert swap_chars("aa b", random.Random(0)) == "aa b"  # nothing to swap: as it is
    assert delete_char("a b <ph1>", random.Random(0)) == "a b <ph1>"  # never empties a word
    assert repeat_char("<BT> ...", random.Random(0)) == "<BT> ..."


def test_typos_are_seeded_and_counted():
    text = "the quick brown fox jumps"
    assert add_typos(text, 3, random.Random(5)) == add_typos(text, 3, random.Random(5))
    outs = {add_typos(text, 2, random.Random(s)) for s in range(50)}
    assert len(outs) > 30 and all(abs(len(o) - len(text)) <= 2 for o in outs)


def test_a_pair_is_rewritten_consistently_on_both_sides():
    cfg = AugmentConfig(drop_punctuation=1.0, typo_edits=2)
    src, tgt = "<2de> the cat sat.", "die Katze saß."
    rng = random.Random(0)
    assert augment_pair(src, tgt, True, False, False, cfg, rng) == ("<2de> THE CAT SAT",
                                                                    "DIE KATZE SASS")
    assert augment_pair(src, tgt, False, True, False, cfg, rng) == ("<2de> The Cat Sat",
                                                                    "Die Katze Saß")
    s, t = augment_pair(src, tgt, False, False, True, AugmentConfig(typo_edits=2), rng)
    assert t == tgt and s != src and s.startswith("<2de> ")  # typos: the source alone
    assert augment_pair(src, "die Katze saß", False, False, False, cfg, rng) == (
        src, "die Katze saß")  # only one side ends in punctuation: both kept
    assert augment_pair(src, tgt, False, False, False, AugmentConfig(), rng) == (src, tgt)


def test_draws_depend_on_the_seed_epoch_and_sentence_alone():
    ids = np.arange(20_000)
    u = uniform([1, 1, 0], ids)
    assert ((0 <= u) & (u < 1)).all() and abs(u.mean() - 0.5) < 0.01
    assert np.array_equal(uniform([1, 1, 0], ids[[7, 3]]), u[[7, 3]])  # whichever batch asks
    assert not np.array_equal(uniform([1, 2, 0], ids), u)  # another epoch, other draws
    cases = draw_cases(AugmentConfig(uppercase=0.1, titlecase=0.2, typos=1.0), 1, 1, ids)
    assert abs(cases.upper.mean() - 0.1) < 0.01 and abs(cases.title.mean() - 0.2) < 0.01
    assert cases.typos.all() and not (cases.upper & ~cases.upper).any()
    assert (cases.growth(1, True)[cases.upper] >= 2).all() and (cases.growth(1, True) > 1).all()
    typos_only = cases.typos & ~cases.upper & ~cases.title
    assert typos_only.any() and (cases.growth(1, False)[typos_only] == 1).all()  # source only


def test_rates_are_checked_once():
    assert AugmentConfig(uppercase=1.0).active and not AugmentConfig().active
    for bad in ({"uppercase": 1.5}, {"typos": -0.1}, {"typo_edits": 0}):
        with pytest.raises(ConfigError, match=r"train\.augment\.\w+: must be"):
            AugmentConfig(**bad)


def augment_iterator(data_dir, cfg: AugmentConfig, alpha=0.0, **kwargs):
    """The training iterator of a data directory with train.augment."""
    manifest = read_manifest(data_dir)
    return EpochBatchIterator(ParallelData(data_dir, "train", manifest), kwargs.pop(
        "max_tokens", 200), 1, 0, corpora=manifest.training_corpora(),
        sampler=SubwordSampler(data_dir, manifest, alpha, Augmenter(cfg)), **kwargs)


def test_augmented_batches_are_drawn_by_their_place_within_max_tokens(corpora_dir):
    cfg = AugmentConfig(uppercase=0.3, titlecase=0.3, typos=0.3, drop_punctuation=0.3)
    itr = augment_iterator(corpora_dir, cfg)
    tok = Tokenizer.from_file(corpora_dir / "spm.model")
    tag = read_manifest(corpora_dir).training_corpora()[1].tag_id
    upper = rows = 0
    for i, ids in enumerate(itr.local_batches(1)):
        batch = itr.collate(ids, 1, i)
        assert batch.src.tolist() == itr.collate(ids, 1, i).src.tolist()  # seeded by place
        assert max(batch.src.numel(), batch.tgt_in.numel()) <= 200
        for row, j in zip(batch.src.tolist(), ids, strict=True):
            assert (row[0] == tag) == (j >= 100)  # the corpus tag stays first, one piece
            text = tok.decode([row])[0]
            upper += text.isupper()
            rows += 1
    assert 0.1 * rows < upper < 0.6 * rows
    single = augment_iterator(corpora_dir, cfg)
    rank = augment_iterator(corpora_dir, cfg, rank=1, world_size=2)
    ids = rank.local_batches(1)[0]  # rank 1's first batch: the single process's second
    assert rank.collate(ids, 1, 0).src.tolist() == single.collate(ids, 1, 1).src.tolist()


def test_augment_needs_the_training_text(tiny_data_dir):
    with pytest.raises(NmtError, match=r"^train.augment: .* has no training text"):
        SubwordSampler(tiny_data_dir, read_manifest(tiny_data_dir), 0.0,
                       Augmenter(AugmentConfig(uppercase=0.1)))


def test_the_robustness_benchmark_makes_its_copies_with_the_modifiers():
    spec = importlib.util.spec_from_file_location("bench_robustness",
                                                  ROOT / "scripts/bench_robustness.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    src, ref = ["the cat sat.", "a dog"], ["die Katze saß.", "ein Hund"]
    copies = script.noisy_copies(src, ref, seed=1)
    assert copies["clean"] == (src, ref)
    assert copies["upper"] == (["THE CAT SAT.", "A DOG"], ["DIE KATZE SASS.", "EIN HUND"])
    assert copies["title"] == (["The Cat Sat.", "A Dog"], ["Die Katze Saß.", "Ein Hund"])
    typos, refs = copies["typos"]
    assert refs == ref and all(a != b for a, b in zip(typos, src, strict=True))
    assert copies == script.noisy_copies(src, ref, seed=1)  # seeded
