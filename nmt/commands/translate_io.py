"""nmt-translate's text in and out, apart from the command's flow (nmt.commands.translate):
standard input read as its lines arrive, the TSV columns of a prefix or a target, the output lines
(a translation, n-best `i ||| text ||| score` lines, a scored pair, with their columns) written
atomically, the warnings of cut texts, and a run's result (TranslateResult) reported: the speed,
BLEU and chrF with their signatures, COMET."""

from __future__ import annotations

import os
import queue
import stat
import sys
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from nmt.config import TranslateConfig
from nmt.config_checks import candidate_search
from nmt.data.segment import Segmented
from nmt.data.tokenizer import Tokenizer
from nmt.decoding.messages import Hypothesis
from nmt.errors import NmtError
from nmt.metrics.scoring import Scores, score
from nmt.system.files import read_lines, write_atomically
from nmt.wings.comet import Comet, system_score

if TYPE_CHECKING:  # imported where markup= asks for it (startup)
    from nmt.wings.markup.document import Document

PROG = "nmt-translate"
CHUNK_LINES = 1000  # interactive input: lines translated together at most


def log(message: str) -> None:
    """One line on stderr (stdout is for translations)."""
    print(f"{PROG}: {message}", file=sys.stderr, flush=True)


def is_interactive(path: str) -> bool:
    """Is `path` standard input coming from a pipe, a socket or a terminal (not a file)?"""
    if path != "-":
        return False
    try:
        mode = os.fstat(sys.stdin.fileno()).st_mode
    except (OSError, ValueError, AttributeError):  # no real stdin (e.g. captured by pytest)
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) or sys.stdin.isatty()


def arriving_chunks(stream, limit: int = CHUNK_LINES):
    """Yield lists of the lines (bytes) of `stream` as they arrive: wait for one, then take
    those already there, up to `limit` (a reader thread feeds a queue)."""
    lines: queue.Queue = queue.Queue()

    def read() -> None:
        for line in stream:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    while (first := lines.get()) is not None:
        chunk = [first]
        while len(chunk) < limit:
            try:
                line = lines.get_nowait()
            except queue.Empty:
                break
            if line is None:
                yield chunk
                return
            chunk.append(line)
        yield chunk


def encode_lines(tok: Tokenizer, lines: list[str], max_tokens: int, name: str,
                 quiet: bool = False, first: int = 0) -> list[list[int]]:
    """Subword ids of each line, cut to max_tokens with a warning (warn_truncated); first:
    the number of lines before these in the input (for the line numbers)."""
    ids = tok.encode(lines)
    if not quiet:
        warn_truncated([len(seq) for seq in ids], max_tokens, name,
                       [f"line {first + i + 1}" for i in range(len(ids))], "lines")
    return [seq[:max_tokens] for seq in ids]


def warn_truncated(lengths: list[int], limit: int, name: str, places: list[str],
                   what: str) -> None:
    """Warn of the texts longer than `limit` tokens (`lengths`), cut to it: the first few
    named by their places in the input, then how many `what` (lines, pieces) in all."""
    long = [i for i, n in enumerate(lengths) if n > limit]
    for i in long[:5]:
        log(f"warning: {name}: {places[i]} has {lengths[i]} tokens; truncated to {limit}")
    if len(long) > 5:
        log(f"warning: {name}: {len(long)} {what} truncated in all")


def piece_places(docs: list[Segmented | Document], first: int) -> list[str]:
    """Each piece's place in the input, "line 3" (a line of one piece) or "line 3 (piece 2)";
    first: the number of lines before these."""
    return [f"line {first + i + 1}" + (f" (piece {k + 1})" if len(doc.pieces) > 1 else "")
            for i, doc in enumerate(docs) for k in range(len(doc.pieces))]


def split_tsv(lines: list[str], first: int, name: str, second: str) -> tuple[list[str], list[str]]:
    """`source<TAB>second` lines -> the sources and the second column; anything else is an
    error naming the line."""
    pairs = [line.split("\t") for line in lines]
    for number, pair in enumerate(pairs, start=first + 1):
        if len(pair) != 2:
            raise NmtError(f"{name}: line {number} is not source<TAB>{second} "
                           f"({len(pair) - 1} TABs)")
    return [p[0] for p in pairs], [p[1] for p in pairs]


def format_output(index: int, hyps: list[Hypothesis], texts: list[str], nbest: int,
                  links: list[str] | None = None, scores: list[str] | None = None) -> list[str]:
    """The output lines of one input: its best translation, or nbest `i ||| text ||| score`;
    with links (alignment=true), then word scores (word_scores=true), each hypothesis's after
    a TAB, or as further ` ||| ` fields."""
    extras = columns(len(hyps), links, scores)
    if nbest == 1:
        return ["\t".join([texts[0], *extras[0]])]
    return [" ||| ".join([str(index), text, f"{h.score:.4f}", *extra])
            for h, text, extra in zip(hyps, texts, extras, strict=True)]


def format_score(h: Hypothesis, links: list[str] | None = None,
                 scores: list[str] | None = None) -> str:
    """The output line of a scored pair: log P(Y|X), log P / lp(|Y|), |Y| (EOS counted), and
    the pair's links (alignment=true) and word scores (word_scores=true)."""
    return "\t".join([f"{h.logprob:.4f}", f"{h.score:.4f}", str(len(h.tokens) + 1),
                      *columns(1, links, scores)[0]])


def columns(n: int, *per_hyp: list[str] | None) -> list[list[str]]:
    """The extra columns of n hypotheses: of each list given (not None), the hypothesis' item."""
    given = [c for c in per_hyp if c is not None]
    return [[c[i] for c in given] for i in range(n)]


def write_lines(path: str, lines: list[str]) -> None:
    """Write lines to a file atomically (temporary file, then rename; a pipe or device is
    written into), or to stdout for "-"."""
    text = "".join(line + "\n" for line in lines)
    if path == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    try:
        write_atomically(path, text)
    except OSError as e:
        raise NmtError(f"{path}: cannot write output ({e.strerror})") from None


def read_constraints(path: str) -> list[list[str]]:
    """constraints=FILE: per line, its TAB-separated phrases (blank ones dropped)."""
    return [[p for p in line.split("\t") if p.strip()]
            for line in read_lines(path, "constraints")]


@dataclass
class TranslateResult:
    """What translate(cfg) returns: the results of all the lines of a run."""

    seconds: float  # translating (or scoring) the lines, reading and writing aside
    hypotheses: list[str] = field(default_factory=list)  # each line's translation
    nbest: list[list[Hypothesis]] = field(default_factory=list)  # each line's, best first
    pairs: list[Hypothesis] = field(default_factory=list)  # score_reference=true: each pair's
    segments: int = 0  # the pieces decoded (split=sentence|paragraph: a line's sentences)
    sources: list[str] = field(default_factory=list)  # the lines' source texts
    split: str = "none"  # the split mode the lines were translated in
    scores: Scores | None = None  # with references: BLEU and chrF (and COMET-22 with comet=)
    comet_qe: list[float] | None = None  # comet= a CometKiwi model: each line's score
    comet_qe_mean: float | None = None  # and their mean


def report(result: TranslateResult, refs: list[list[str]] | None, cfg: TranslateConfig,
           comet: Comet | None = None) -> None:
    """The speed summary, and BLEU and chrF with their signatures when there are references;
    COMET-22 against the first references, or CometKiwi's mean, with comet=."""
    seconds = max(result.seconds, 1e-9)
    if cfg.score_reference:
        if not cfg.quiet:
            n = len(result.pairs)
            log(f"scored {n} pairs in {seconds:.1f} s ({n / seconds:.1f} pairs/s)")
        return
    n = len(result.nbest)
    if not cfg.quiet:
        n_tok = sum(len(hyps[0].tokens) for hyps in result.nbest)
        pieces = result.segments  # split: the rate counts what was decoded, not lines
        split = result.split
        done, rate = ((f"{n} lines", f"{n / seconds:.1f} sentences/s") if split == "none"
                      else (f"{n} lines ({pieces} pieces, split={split})",
                            f"{pieces / seconds:.1f} pieces/s"))
        log(f"translated {done} in {seconds:.1f} s ({rate}, {n_tok / seconds:.0f} tokens/s; "
            f"{search_summary(cfg)}, {cfg.search.dtype})")
    if refs is not None and not n:
        log("no lines, nothing to score")
    elif refs is not None:
        result.scores = scores = score(result.hypotheses, refs, cfg.bleu_tokenize)
        log(scores.bleu_line)
        log(f"BLEU signature: {scores.bleu_signature}")
        log(scores.chrf_line)
        log(f"chrF signature: {scores.chrf_signature}")
    if comet is not None and n and (refs is not None or result.comet_qe is not None):
        report_comet(result, refs, cfg, comet)


def report_comet(result: TranslateResult, refs: list[list[str]] | None, cfg: TranslateConfig,
                 comet: Comet) -> None:
    """COMET-22 of the hypotheses against the first references (result.scores.comet), or
    the mean of CometKiwi's scores (result.comet_qe_mean), logged with the model."""
    if comet.spec.needs_reference:
        segments = comet.score(result.sources, result.hypotheses, refs[0],
                               progress=not cfg.quiet)
        value = result.scores.comet = system_score(segments)
        log(f"COMET = {value:.4f} ({comet.spec.form}, {cfg.comet}, {len(segments)} lines)")
    else:
        value = result.comet_qe_mean = system_score(result.comet_qe)
        log(f"COMET-QE = {value:.4f} (reference-free, {cfg.comet}, "
            f"{len(result.comet_qe)} lines)")


def search_summary(cfg: TranslateConfig) -> str:
    """How the translations were found, in a few words: "beam 4", "MBR chrf of 8 by sampling"."""
    search = candidate_search(cfg.search, cfg.mbr)
    how = "sampling" if search.sampling else f"beam {search.beam_size}"
    if cfg.mbr.candidates:
        aggregated = " aggregated" if cfg.mbr.aggregate else ""
        return f"MBR {cfg.mbr.utility}{aggregated} of {cfg.mbr.candidates} by {how}"
    if cfg.rerank.model:
        return f"{search.nbest}-best of {how} reranked"
    return how
