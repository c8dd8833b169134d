"""Word alignments from cross-attention, as fairseq's `--print-alignment`: teacher-force each
translation on its source, average one decoder layer's encoder-decoder attention over its
heads, and link each target piece to the source piece it attends to most.

Links are between SentencePiece pieces (0-based positions in the source's and the output's
piece sequences, EOS excluded on both sides), written in Pharaoh format: `source-target`
pairs separated by spaces, one per target piece, in target order (`0-0 1-2 2-1`).
"""

from __future__ import annotations

from nmt.config import SearchConfig
from nmt.decoding.batches import plan_batches
from nmt.decoding.messages import Sentence
from nmt.engines.engine import Engine
from nmt.errors import NmtError
from nmt.wings.markup.restore import Aligned


def check_layer(engine: Engine, layer: int) -> int:
    """alignment_layer as a 0-based index of the engine's decoder layers (negative: from the
    end); a one-line error if the model has no such layer."""
    n = engine.decoder_layers
    if not -n <= layer < n:
        raise NmtError(f"alignment_layer={layer}: the model has {n} decoder layers "
                       f"(0..{n - 1}, or -{n}..-1 from the last)")
    return layer % n


def align(engine: Engine, src_ids: list[list[int]], out_ids: list[list[int]],
          layer: int = -1, max_tokens: int = 4096) -> list[list[tuple[int, int]]]:
    """The (source piece, target piece) links of each pair of id lists (no BOS/EOS), in input
    order, teacher-forced by the engine (its first model: one with attention, nmt's
    Translator) in length-sorted batches of at most max_tokens tokens (padding included).
    layer: which decoder layer's attention (-1: the last, fairseq's choice)."""
    engine.capabilities.check("alignment")
    layer = check_layer(engine, layer)
    items = [Sentence(i, s, target=y)
             for i, (s, y) in enumerate(zip(src_ids, out_ids, strict=True))
             if s and y]  # nothing to link without a source or an output piece (y: the output)
    links: list[list[tuple[int, int]]] = [[] for _ in src_ids]
    search = SearchConfig(max_tokens=max_tokens)
    for batch in plan_batches(items, search, score=True):
        pairs = [items[b] for b in batch]
        weights = engine.attention([p.src for p in pairs],
                                   [p.target for p in pairs])["encoder_decoder"]
        heads = weights[:, layer].mean(1)  # (B, T_q, T_k): the layer's heads averaged
        for row, p in zip(heads, pairs, strict=True):
            best = row[:len(p.target), :len(p.src)].argmax(-1)  # (|y|,): neither EOS nor PAD
            links[p.tag] = [(j, t) for t, j in enumerate(best.tolist())]
    return links


def pharaoh(links: list[tuple[int, int]]) -> str:
    """Links in Pharaoh format: `i-j` (source piece i, target piece j) separated by spaces."""
    return " ".join(f"{i}-{j}" for i, j in links)


def sentence_alignments(engine: Engine, texts: list[str], src_ids: list[list[int]],
                        out_ids: list[list[int]], source_tokens: int = 0,
                        prefix: tuple[int, ...] = (), layer: int = -1, max_tokens: int = 4096
                        ) -> list[Aligned]:
    """markup=: each translated sentence's text, piece links and pieces' characters
    (nmt.wings.markup.restore.restore's inputs). src_ids: as decoded (the language tokens first,
    `source_tokens` of them, truncated); out_ids: the outputs without the forced `prefix`,
    which is put back to align and its links dropped, as the source's language tokens'."""
    links = align(engine, src_ids, [[*prefix, *o] for o in out_ids], layer, max_tokens)
    out = []
    for text, src, ids, found in zip(texts, src_ids, out_ids, links, strict=True):
        target, tgt_spans = engine.tgt_tok.decode_spans(ids)
        kept = [(j - source_tokens, t - len(prefix)) for j, t in found
                if j >= source_tokens and t >= len(prefix)]  # language tokens: no words
        out.append(Aligned(target, kept, engine.src_tok.spans(text)[:len(src) - source_tokens],
                           tgt_spans))
    return out
