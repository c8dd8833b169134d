"""MBR selection (nmt.wings.mbr): sacreBLEU's sentence utilities, the expected utility
against the other candidates, the consensus choice, and reference aggregation; the candidate
closest to a reference (the distillation recipe's pick)."""

import pytest
from sacrebleu.metrics import BLEU, CHRF

from nmt.wings.mbr import ChrF, SentenceBleu, closest, expected_utilities, mbr_select

TEXTS = ["The cat sat on the mat.", "The cat sat on a mat.", "A cat sat on the mat!",
         "the cat is on the mat", "Dogs run in the park.", "", "a", "(hi) Über Straße,",
         "The cat sat on the mat.", "mat mat mat mat"]


@pytest.mark.parametrize("ours,theirs", [(ChrF(fast=False), CHRF()),
                                         (SentenceBleu(), BLEU(effective_order=True))])
def test_utilities_are_sacrebleus_sentence_scores(ours, theirs):
    matrix = ours.pairwise(TEXTS)
    for hyp, row in zip(TEXTS, matrix, strict=True):
        for ref, value in zip(TEXTS, row, strict=True):
            if ref:  # sacreBLEU refuses an empty reference
                assert value == theirs.sentence_score(hyp, [ref]).score, (hyp, ref)


@pytest.mark.parametrize("utility", ["chrf", "bleu"])
def test_the_expected_utility_is_the_mean_over_the_others(utility):
    metric = CHRF() if utility == "chrf" else BLEU(effective_order=True)
    cands = TEXTS[:5] + TEXTS[7:]  # a duplicate (0 and 8) counts as another reference
    expected = [sum(metric.sentence_score(h, [r]).score for j, r in enumerate(cands) if j != i)
                / (len(cands) - 1) for i, h in enumerate(cands)]
    assert expected_utilities(cands, utility) == pytest.approx(expected, abs=1e-9)


def test_a_hand_computed_expected_utility():
    # chrF("ab", "ac"): unigrams match 1 of 2 (P = R = 1/2), bigrams 0 of 1, no longer n-grams:
    # effective order 2, mean P = R = 1/4, F2 = 5 P R / (4 P + R) = 1/4. chrF(x, x) = 100.
    # "ab": (100 + 25) / 2; "ac": (25 + 25) / 2. Aggregated, "ab" meets a:1 b:.5 c:.5 | ab:.5
    # ac:.5, matching 1.5 of 2 unigrams and .5 of 1 bigram: P = R = (3/4 + 1/2) / 2 = 62.5 %.
    assert expected_utilities(["ab", "ab", "ac"]) == [62.5, 62.5, 25.0]
    assert expected_utilities(["ab", "ab", "ac"], aggregate=True) == [62.5, 62.5, 25.0]
    assert expected_utilities(["ab"]) == [0.0] and mbr_select(["ab"]) == 0


def test_mbr_picks_the_consensus_not_the_model_best():
    variants = ["The cat sat on a mat.", "A cat sat on the mat.", "The cat sat on the mat.",
                "The cat is on the mat.", "The cat sat on the hat.", "Dogs run in the park."]
    scores = [-1.0, -2.0, -9.0, -3.0, -4.0, -0.5]  # the consensus (2) scores worst but one
    for utility, aggregate in (("chrf", False), ("chrf", True), ("bleu", False)):
        assert mbr_select(variants, scores, utility, aggregate) == 2


def test_aggregated_and_pairwise_agree_on_a_noisy_list():
    base = "Save the document as a new file before closing the window."
    edits = [base, base.replace("Save", "Store"), base.replace("new ", ""),
             base.replace("window", "dialog"), base.replace("before", "after"),
             base.replace("the document", "it"), "Close the window.", base.upper(),
             base.replace("file", "file first")]
    pairwise, aggregated = (expected_utilities(edits, aggregate=a) for a in (False, True))
    best = max(range(len(edits)), key=pairwise.__getitem__)
    assert best == max(range(len(edits)), key=aggregated.__getitem__) == 0
    # the approximation ranks the list alike: the worst two are the same too
    assert sorted(range(len(edits)), key=pairwise.__getitem__)[:2] == \
        sorted(range(len(edits)), key=aggregated.__getitem__)[:2]


def test_equal_candidates_go_to_the_higher_model_score():
    assert mbr_select(["x y", "x y", "z"], [-2.0, -1.0, 0.0]) == 1
    assert mbr_select(["x y", "x y", "z"]) == 0


def test_bad_utilities_are_refused():
    with pytest.raises(ValueError, match="unknown MBR utility 'ter'"):
        expected_utilities(["a", "b"], "ter")
    with pytest.raises(ValueError, match="reference aggregation is for chrf, not bleu"):
        expected_utilities(["a", "b"], "bleu", aggregate=True)


def test_fastchrf_gives_the_same_numbers():
    pytest.importorskip("fastchrf")
    fast = ChrF(fast=True)
    assert fast.fastchrf is not None
    assert fast.pairwise(TEXTS) == ChrF(fast=False).pairwise(TEXTS)


def test_closest_is_the_candidate_of_highest_sentence_chrf_against_the_reference():
    ref = "The cat sat on the mat."
    cands = TEXTS[1:8]
    scores = [CHRF().sentence_score(c, [ref]).score for c in cands]
    assert closest(cands, ref) == scores.index(max(scores)) == 1
    assert closest(["a", "Dogs run.", "a"], "Dogs run in the park.") == 1
    assert closest(["x", "y", "x"], "z") == 0  # the first of equals
