"""Alignments from cross-attention (nmt.wings.align, nmt-translate alignment=true): the diagonal
of a copy model, batching that changes nothing, the Pharaoh column of the command's output."""

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_copy_task import BOS, EOS, LENGTH, PAD, V, random_batch, with_specials
from translate_helpers import lines_of, random_sources, save_tiny_checkpoint, search, tiny_model
from translate_helpers import translate_config as config

from nmt.commands.translate import translate
from nmt.config import ModelConfig, OptimConfig
from nmt.data.tokenizer import SPECIALS, Specials
from nmt.decoding.batches import translate_nbest
from nmt.engines.translator import Translator
from nmt.errors import NmtError
from nmt.model import make_model
from nmt.training.loss import LabelSmoothedLoss
from nmt.training.schedule import build_optimizer
from nmt.wings.align import align, pharaoh

pytestmark = pytest.mark.usefixtures("one_thread")

CLI = str(Path(sys.executable).parent / "nmt-translate")
PHARAOH = re.compile(r"^(\d+-\d+( \d+-\d+)*)?$")


def engine(model, specials: Specials = SPECIALS) -> Translator:
    """nmt's engine over a bare model (no tokenizers: specials' ids)."""
    return Translator([model], specials, dtype=None)


@pytest.fixture(scope="module")
def copy_model():
    """test_copy_task's model, cheaper: one layer, 300 updates (a few seconds on one core)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # module scope: set up before the one_thread fixture
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    cfg = ModelConfig(N=1, d_model=64, d_ff=128, h=2, dropout=0.0)
    model = make_model(cfg, V, V, PAD, True)
    optim = OptimConfig(lr_factor=1.0, warmup=100, beta1=0.9, beta2=0.98, eps=1e-9,
                        label_smoothing=0.1)
    optimizer, scheduler = build_optimizer(model, optim, cfg.d_model)
    for _ in range(300):
        src, tgt_in, tgt_out = with_specials(random_batch(32, g))
        loss, _ = LabelSmoothedLoss.apply(model(src, tgt_in).flatten(0, 1), tgt_out.flatten(),
                                          0.1, PAD)
        optimizer.zero_grad()
        (loss / tgt_out.numel()).backward()
        optimizer.step()
        scheduler.step()
    torch.set_num_threads(threads)
    return model.eval()


@pytest.fixture(scope="module")
def ckpt(tiny_data_dir, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("run") / "checkpoint_last.pt"
    return save_tiny_checkpoint(path, (tiny_data_dir / "spm.model").read_bytes(), seed=0, N=2)


def test_a_copy_model_aligns_on_the_diagonal(copy_model):
    specials = Specials(BOS, EOS, PAD)
    sources = random_batch(20, torch.Generator().manual_seed(12345)).tolist()  # unseen
    nbest = translate_nbest(copy_model, sources, search(beam_size=2, nbest=2, max_len_b=2),
                            specials)
    outputs = [h.tokens for hyps in nbest for h in hyps]
    assert sum(out == src for out, src in zip(outputs[::2], sources, strict=True)) >= 15
    links = align(engine(copy_model, specials), [s for s in sources for _ in range(2)],
                  outputs)
    assert [[j for _, j in pairs] for pairs in links] == [list(range(len(y))) for y in outputs]
    pairs = [p for pairs in links for p in pairs]
    assert sum(i == j for i, j in pairs) >= 0.9 * len(pairs)
    assert len(pairs) >= 2 * 20 * (LENGTH - 2)


def test_batches_change_no_link_and_match_the_attention_of_one_pair():
    model = tiny_model(60, N=2)
    sources = random_sources(12, 60, max_len=9, seed=1)
    outputs = random_sources(12, 60, max_len=11, seed=2)
    tr = engine(model)
    batched = align(tr, sources, outputs, layer=-2)
    one_by_one = [align(tr, [s], [y], layer=0)[0]
                  for s, y in zip(sources, outputs, strict=True)]
    assert batched == one_by_one  # layer -2 of 2 is layer 0
    s, y = sources[3], outputs[3]
    heads = tr.attention([s], [y])["encoder_decoder"][0, 0].mean(0)  # (T, S)
    best = heads[:len(y), :len(s)].argmax(-1).tolist()  # per target piece, EOS excluded
    assert batched[3] == [(i, j) for j, i in enumerate(best)]
    assert pharaoh([(0, 0), (2, 1)]) == "0-0 2-1"


def test_empty_sides_have_no_links_and_a_missing_layer_is_an_error():
    tr = engine(tiny_model(60, N=2))
    assert align(tr, [[], [5, 6]], [[7], []]) == [[], []]
    with pytest.raises(NmtError, match=r"alignment_layer=2: the model has 2 decoder layers"):
        align(tr, [[5]], [[6]], layer=2)


@pytest.mark.long  # over 2 s
def test_the_command_writes_a_pharaoh_column_the_same_in_any_batches(ckpt, test_en, tmp_path):
    out = tmp_path / "hyp"
    done = subprocess.run([CLI, f"checkpoint={ckpt}", f"input={test_en}", f"output={out}",
                           "alignment=true", "search.max_len_b=8", "quiet=true"],
                          capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr.decode()
    rows = [line.split("\t") for line in lines_of(out)]
    assert len(rows) == len(lines_of(test_en)) and all(len(r) == 2 for r in rows)
    one_by_one = tmp_path / "one"
    result = translate(config(checkpoint=ckpt, input=test_en, output=one_by_one,
                              alignment="true", workers=1, **{"search.max_sentences": 1}))
    assert lines_of(one_by_one) == lines_of(out)
    tok = Translator.load(ckpt, dtype=None).src_tok
    for source, hyps, (_, links) in zip(lines_of(test_en), result.nbest, rows, strict=True):
        assert PHARAOH.match(links), links
        pairs = [tuple(map(int, link.split("-"))) for link in links.split()]
        assert [j for _, j in pairs] == list(range(len(hyps[0].tokens)))
        assert all(i < len(tok.encode([source])[0]) for i, _ in pairs)


def test_nbest_and_scored_pairs_carry_links(ckpt, test_en, tiny_data_dir, tmp_path):
    out = tmp_path / "nbest"
    translate(config(checkpoint=ckpt, input=test_en, output=out, alignment="true",
                     **{"search.nbest": 2}))
    rows = [line.split(" ||| ") for line in lines_of(out)]
    assert all(len(r) == 4 and PHARAOH.match(r[3]) for r in rows)
    scored = tmp_path / "scored"
    translate(config(checkpoint=ckpt, input=test_en, output=scored, alignment="true",
                     score_reference="true", ref=tiny_data_dir / "test.clean.de"))
    rows = [line.split("\t") for line in lines_of(scored)]
    assert all(len(r) == 4 and len(r[3].split()) == int(r[2]) - 1 for r in rows)  # EOS: no link
    with pytest.raises(NmtError, match="alignment_layer=-3: the model has 2 decoder layers"):
        translate(config(checkpoint=ckpt, input=test_en, output=out, alignment="true",
                         alignment_layer=-3))
