"""nmt-translate: checkpoints and raw text in, detokenized translations (or scores) out.

Reads raw lines (a file or standard input), encodes them with the SentencePiece model stored in
the checkpoint, translates them in length-sorted token-budget batches (nmt.decoding.batches) with
one model or an ensemble, and writes one detokenized line per input line, in input order (or
`i ||| hypothesis ||| score` lines when search.nbest > 1). With ref=..., prints sacreBLEU BLEU
and chrF with their signatures (the scorer of validation, nmt.metrics.scoring) to stderr; stdout
carries only translations. score_reference=true writes `log P<TAB>score<TAB>|Y|` per given
pair instead. constraints=FILE gives each input line target phrases its translation must
contain (lexically constrained beam search, nmt.decoding.constrained); glossary=FILE and keep=FILE
make the terms each source holds such constraints, and write the exact terms back
(nmt.wings.glossary). From a pipe or a
terminal, lines are translated as they arrive; under torchrun the ranks share the lines and
rank 0 writes them all. alignment=true adds to each output line the source-target links of its
translation (nmt.wings.align): a TAB-separated column after a translation or a scored pair, a
fourth ` ||| ` field of an n-best line. word_scores=true adds, after them, each target word with
its probability (`word|0.9312 ...`, nmt.wings.words). split=sentence|paragraph translates
each line's sentences (or the line, cut to fit the model) apart, in the same batches as all other
pieces, and puts the translations back in the line with the spaces between them
(nmt.data.segment). markup=html|xml reads each line as a document: its inline tags taken out,
its sentences translated whole and each tag put back where the alignment puts its words
(nmt.wings.markup.document). mbr.candidates=N or rerank.model=CKPT write, of each line's (or
piece's) candidates, the one chosen by minimum Bayes risk or by reranking (nmt.wings.rerank).
comet=DIR (nmt.wings.comet): a COMET-22 model prints COMET beside BLEU and chrF (ref=), and
is mbr.utility=comet's; a CometKiwi model adds each line's reference-free score as a TAB column
and prints their mean. Everything between text and tokens (split, markup, language tokens,
glossary terms, the cut, MBR or reranking, tags and terms put back, pieces rejoined, word
scores) is nmt.inference.pipeline's, the one code path nmt-serve shares. Its text in and out
(standard input as it arrives, the output lines and their columns, the report) is
nmt.commands.translate_io's.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from nmt.commands.translate_io import (
    PROG,
    TranslateResult,
    arriving_chunks,
    encode_lines,
    format_output,
    format_score,
    is_interactive,
    log,
    piece_places,
    read_constraints,
    report,
    split_tsv,
    warn_truncated,
    write_lines,
)
from nmt.config import TranslateConfig
from nmt.config_checks import SPLIT_AUTO, check_split_lang, per_segment
from nmt.data.languages import LanguageChoice, choose, recorded_pair
from nmt.data.segment import auto_mode, sentence_splitter
from nmt.data.vocab import Vocab
from nmt.decoding.constrained import missing_phrases
from nmt.decoding.messages import Hypothesis
from nmt.engines.engine import Engine, check_vocab
from nmt.errors import ConfigError, NmtError
from nmt.inference import pipeline
from nmt.inference.engines import open_translator
from nmt.inference.pipeline import Options, Prepared, TextResult
from nmt.metrics.scoring import check_bleu_tokenize
from nmt.system import distributed
from nmt.system.files import check_output, decode_line, read_lines
from nmt.system.runtime import cap_onednn_cache, keep_freed_memory, usable_cores
from nmt.wings.comet import Comet, load_comet
from nmt.wings.glossary import Glossary
from nmt.wings.rerank import Chooser
from nmt.wings.words import format_words

PARALLEL_LINES = 32  # interactive input: fewer lines per worker than this use one process
FEW_LINES = 8  # a file of fewer lines decodes here on one thread (few_lines); a pipe's chunk
# of fewer lines on one thread (decoding_threads)


@dataclass
class Session:
    """What translating or scoring any chunk of the input needs."""

    cfg: TranslateConfig
    translator: Engine  # the model(s), prepared, with its workers
    env: distributed.DistInfo  # this rank under torchrun
    limit: int  # tokens kept of a source, prefix or target
    name: str  # the input's name in messages
    refs: list[list[str]] | None  # ref=, refs=: reference streams (BLEU), or ref= targets
    phrases: list[list[str]] | None  # constraints=: per input line, its phrases
    options: Options = Options()  # split, markup, languages, glossary, MBR or reranking
    comet: Comet | None = None  # comet=: COMET-22 against ref=, or CometKiwi's column
    lines: list[str] | None = None  # input=FILE: its lines, read before the model


@dataclass
class Chunk:
    """The results for a chunk of input lines."""

    lines: list[str]  # output lines
    nbest: list[list[Hypothesis]]  # per input line
    texts: list[list[str]] = field(default_factory=list)  # detokenized hypotheses (translating)
    src_ids: list[list[int]] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)  # the input lines' source texts
    qe: list[float] = field(default_factory=list)  # comet= a CometKiwi: each line's score




def translate(cfg: TranslateConfig) -> TranslateResult:
    """nmt-translate: translate (or score) cfg.input into cfg.output; returns the results."""
    session = open_session(cfg)
    try:
        if (is_interactive(cfg.input) and session.env.world_size == 1
                and not cfg.attention_plot):
            return run_interactive(session)
        return run_all(session)
    finally:
        session.translator.close()
        if session.options.chooser is not None:
            session.options.chooser.close()
        if session.env.world_size > 1:
            distributed.shutdown()


def open_session(cfg: TranslateConfig) -> Session:
    """Devices, ranks and processes; the checkpoints loaded, checked and prepared."""
    check_bleu_tokenize(cfg.bleu_tokenize, "bleu_tokenize")
    if cfg.output != "-":
        check_output(cfg.output, "output")
    if cfg.attention_plot:
        check_output(cfg.attention_plot, "attention_plot", directory=True)
    lines = read_lines(cfg.input) if cfg.input != "-" else None  # its size sets the workers
    env = distributed.init(cfg.device)
    device = env.device
    share = max(1, usable_cores() // env.world_size)  # the cores of this rank
    workers, threads = (cfg.workers or share) if device.type == "cpu" else 1, cfg.threads
    if device.type == "cpu" and few_lines(cfg, lines):
        workers, threads = 1, cfg.threads or 1
    if threads or env.world_size > 1:
        torch.set_num_threads(threads or share)
    if device.type == "cpu":
        keep_freed_memory()  # reuse freed memory: large per-step tensors cost no page faults
        cap_onednn_cache()  # one compiled product per shape, bounded (as nmt-serve)
    ref_files = [cfg.ref] * bool(cfg.ref) + list(cfg.refs)
    refs = [read_lines(path, "references") for path in ref_files] or None
    phrases = read_constraints(cfg.constraints) if cfg.constraints else None
    translator = open_translator(cfg.engine, cfg.checkpoints, device, cfg.weights,
                                 cfg.search.dtype, workers, threads, cfg.ct2_model,
                                 cfg.search.shortlist, cfg.search.compile)
    try:
        if cfg.vocab_check:
            check_vocab(translator, cfg.vocab_check, cfg.checkpoints[0])
        if cfg.alignment or cfg.markup != "none":
            from nmt.wings.align import check_layer

            check_layer(translator, cfg.alignment_layer)
        languages = choose(translator.vocab, cfg.src_lang, cfg.tgt_lang, cfg.checkpoints[0])
        check_languages(cfg, languages)
        limit = min(cfg.max_input_tokens, translator.max_input_tokens) - len(languages.source)
        options = pipeline_options(cfg, translator, languages, limit, workers)
        comet = open_comet(cfg, refs, device)
    except NmtError:
        translator.close()
        raise
    name = "<stdin>" if cfg.input == "-" else cfg.input
    return Session(cfg, translator, env, limit, name, refs, phrases, options, comet, lines)


def few_lines(cfg: TranslateConfig, lines: list[str] | None) -> bool:
    """Whether the input is a file of so few lines (FEW_LINES) that this process decodes them
    itself, on one thread (unless threads= says otherwise): forking the workers, and the
    waits of PyTorch's threads on a batch of a few rows, would cost more than they save.
    Not with comet=, whose model is the larger one."""
    return lines is not None and len(lines) < FEW_LINES and not cfg.comet


def pipeline_options(cfg: TranslateConfig, translator: Engine, languages: LanguageChoice,
                     limit: int, workers: int) -> Options:
    """The pipeline's options (nmt.inference.pipeline) of cfg: split=auto resolved, the
    glossary read and encoded once, the MBR or reranking Chooser opened."""
    split = split_mode(cfg, translator.vocab)
    splitter = sentence_splitter(split_lang(cfg, translator.vocab)) if (
        split == "sentence") else None
    glossary = Glossary.load(cfg.glossary, cfg.keep, translator.tgt_tok,
                             translator.max_input_tokens)
    chooser = Chooser.open(cfg, translator.tgt_tok, translator.device, workers)
    return Options(split, splitter, cfg.markup, cfg.placeholders, languages, limit, glossary,
                   chooser, cfg.word_combine if cfg.word_scores else None,
                   cfg.alignment_layer, cfg.search.max_tokens)


def open_comet(cfg: TranslateConfig, refs: list[list[str]] | None, device: torch.device
               ) -> Comet | None:
    """comet=DIR's model (None without), checked against its use: a reference-based COMET-22
    needs ref= (or mbr.utility=comet), a CometKiwi's column one translation per line."""
    if not cfg.comet:
        return None
    model = load_comet(cfg.comet, str(device))
    mbr = cfg.mbr.candidates and cfg.mbr.utility == "comet"
    if model.spec.needs_reference and refs is None and not mbr:
        raise ConfigError("comet", f"{cfg.comet} is a reference-based COMET-22 "
                                   f"({model.spec.form}): give ref=FILE (or mbr.utility=comet); a "
                                   "CometKiwi model scores without references")
    if not model.spec.needs_reference and cfg.search.nbest > 1:
        raise ConfigError("comet", f"{cfg.comet} is a CometKiwi, a score per output line: "
                                   f"needs search.nbest=1, got {cfg.search.nbest}")
    return model


def split_mode(cfg: TranslateConfig, vocab: Vocab) -> str:
    """cfg.split, with auto resolved by segment.auto_mode's rule (nmt-serve's): none for a
    per-segment option, sentence where the source language is known (split_lang, the
    checkpoint's pair, src_lang) and the splitter installed, else paragraph."""
    if cfg.split != SPLIT_AUTO:
        return cfg.split
    lang = cfg.split_lang or recorded_pair(vocab).src_lang or cfg.src_lang
    return auto_mode(lang, bool(per_segment(cfg)))


def split_lang(cfg: TranslateConfig, vocab: Vocab) -> str:
    """split=sentence's source language: split_lang, else the one the checkpoint records (its
    pair's source, or src_lang= of a multilingual model); a one-line error for none."""
    lang = cfg.split_lang or recorded_pair(vocab).src_lang or cfg.src_lang
    if not lang:
        raise ConfigError("split_lang", "split=sentence needs the source language's ISO 639 "
                          "code, e.g. split_lang=en (the checkpoint records no language pair)")
    check_split_lang(lang)
    return lang


def check_languages(cfg: TranslateConfig, languages: LanguageChoice) -> None:
    """What is not defined yet with a forced language token: alignments and attention plots
    (their rows and columns would hold the language tokens)."""
    for key in ("alignment", "attention_plot"):
        if languages.prefix and getattr(cfg, key):
            raise ConfigError(key, "not with a forced target language token (tgt_lang= of "
                                   "an M2M100 or NLLB-200 model) yet")


def read_input(s: Session) -> list[str]:
    """The input lines; under torchrun, standard input is read by rank 0 and sent to all."""
    if s.cfg.input != "-" or s.env.world_size == 1:
        return read_lines(s.cfg.input)
    return distributed.broadcast_object(read_lines("-") if s.env.is_main else None)


def run_all(s: Session) -> TranslateResult:
    """Read the whole input, translate or score it, write the output, report."""
    cfg = s.cfg
    lines = read_input(s) if s.lines is None else s.lines
    check_references(s, len(lines))
    check_constraint_lines(s, len(lines))
    if cfg.attention_plot and cfg.attention_line > len(lines):
        raise NmtError(f"attention_line={cfg.attention_line}: {s.name} has {len(lines)} lines")
    start = time.perf_counter()
    chunk = process(s, lines, 0)
    seconds = time.perf_counter() - start
    result = finish(s, chunk, seconds)
    if s.env.is_main:
        write_lines(cfg.output, chunk.lines)
        report(result, s.refs, cfg, s.comet)
    if cfg.attention_plot and s.env.is_main:
        from nmt.training.plot import plot_attention

        i = cfg.attention_line - 1
        paths = plot_attention(s.translator, chunk.src_ids[i], chunk.nbest[i][0].tokens,
                               cfg.attention_plot)
        log(f"attention of line {cfg.attention_line} drawn in {', '.join(map(str, paths))}")
    return result


def run_interactive(s: Session) -> TranslateResult:
    """Translate (or score) standard input chunk by chunk as lines arrive, writing each
    chunk's output at once when it goes to standard output."""
    out, first, whole = [], 0, Chunk([], [])
    start = time.perf_counter()
    for raw in arriving_chunks(sys.stdin.buffer):
        lines = [decode_line(line, first + i + 1, s.name) for i, line in enumerate(raw)]
        chunk = process(s, lines, first, interactive=True)
        if s.cfg.output == "-":
            write_lines("-", chunk.lines)
        else:
            out += chunk.lines
        whole = Chunk([], whole.nbest + chunk.nbest, whole.texts + chunk.texts,
                      whole.src_ids + chunk.src_ids, whole.sources + chunk.sources,
                      whole.qe + chunk.qe)
        first += len(lines)
    if s.cfg.output != "-":
        write_lines(s.cfg.output, out)
    result = finish(s, whole, time.perf_counter() - start)
    report(result, s.refs, s.cfg, s.comet)
    return result


def finish(s: Session, chunk: Chunk, seconds: float) -> TranslateResult:
    """The result of a run (all its lines' chunk): hypotheses (or scored pairs), the time
    taken, the number of segments decoded (with split=sentence|paragraph, the lines' pieces),
    the sources, and with a CometKiwi each line's score (comet_qe)."""
    nbest = chunk.nbest
    if s.cfg.score_reference:
        return TranslateResult(seconds, pairs=[hyps[0] for hyps in nbest])
    check_references(s, len(nbest))
    check_constraint_lines(s, len(nbest))
    qe = s.comet is not None and not s.comet.spec.needs_reference
    return TranslateResult(seconds, [t[0] for t in chunk.texts], nbest,
                           segments=len(chunk.src_ids), sources=chunk.sources,
                           split=s.options.split, comet_qe=chunk.qe if qe else None)


def process(s: Session, lines: list[str], first: int, interactive: bool = False) -> Chunk:
    """Translate or score input lines first+1.., this rank's share of them under torchrun."""
    cfg = s.cfg
    sources, second = line_columns(s, lines, first)
    prepared = prepare_lines(s, sources, second, first)
    mine = list(range(s.env.rank, len(prepared.pieces), s.env.world_size))  # this rank's
    # A few arriving lines decode here: the workers' round trip would cost more than it saves.
    parallel = not interactive or len(mine) >= PARALLEL_LINES * s.translator.workers
    with decoding_threads(s, len(mine)):
        found = run_search(s, prepared, mine, first, parallel, interactive)
    found = pipeline.chosen(prepared, found, mine)  # each rank chooses among its own candidates
    results = pipeline.finish(prepared, gather(s, mine, found, len(prepared.pieces)), s.translator)
    hyps = [r.hyps for r in results]
    src_ids = [p.ids for p in prepared.pieces]
    # Only rank 0 writes: the other ranks' output lines go unused and need no links.
    links = (alignments(s, src_ids, hyps) if cfg.alignment and s.env.is_main
             else [None] * len(hyps))
    if cfg.score_reference:
        return Chunk([format_score(r.hyps[0], a, word_column(s, r)) for r, a in zip(
            results, links, strict=True)], hyps, src_ids=src_ids)
    if s.env.is_main:
        warn_unplaced(s, results, first)
        if not cfg.quiet and whole_lines(s) and (phrases := prepared.constraints()):
            warn_missing(s, hyps, phrases, first)
        warn_unfinished(s, hyps, first)  # per input line: a piece without one is its line's
    nbest = 1 if s.options.chooser is not None else cfg.search.nbest
    out = [line for i, (r, a) in enumerate(zip(results, links, strict=True))
           for line in format_output(first + i, r.hyps, r.texts, nbest, a, word_column(s, r))]
    texts = [r.texts for r in results]
    qe = []
    if s.comet is not None and not s.comet.spec.needs_reference and s.env.is_main:
        qe = s.comet.qe(sources, [t[0] for t in texts], progress=not cfg.quiet)
        out = [f"{line}\t{q:.4f}" for line, q in zip(out, qe, strict=True)]
    return Chunk(out, hyps, texts, src_ids, sources, qe)


def line_columns(s: Session, lines: list[str], first: int) -> tuple[list[str], list[str] | None]:
    """Input lines first+1.. -> their sources, and the prefix or target of each (prefix=true,
    score_reference=true: the line's second column, or ref='s line); None without."""
    cfg = s.cfg
    if cfg.prefix or (cfg.score_reference and s.refs is None):
        return split_tsv(lines, first, s.name, "prefix" if cfg.prefix else "target")
    if not cfg.score_reference:
        return lines, None
    second = s.refs[0][first:first + len(lines)]
    if len(second) != len(lines):
        raise NmtError(f"{cfg.ref}: {len(s.refs[0])} target lines but {s.name} has more")
    return lines, second


def prepare_lines(s: Session, sources: list[str], second: list[str] | None, first: int
                  ) -> Prepared:
    """The pipeline's pieces of input lines first+1.. (nmt.inference.pipeline.prepare), with
    their prefixes or targets (second) and constraints, each cut source named in a warning."""
    cfg, tr = s.cfg, s.translator
    given = (encode_lines(tr.tgt_tok, second, s.limit, cfg.ref or s.name, cfg.quiet, first)
             if second is not None else None)
    phrases = constraint_ids(s, first, len(sources))
    prepared = pipeline.prepare(sources, s.options, tr, given, phrases)
    if not cfg.quiet:
        warn_truncated([p.tokens for p in prepared.pieces], s.limit, s.name,
                       piece_places(prepared.docs, first),
                       "lines" if whole_lines(s) else "pieces")
    return prepared


def whole_lines(s: Session) -> bool:
    """Is each input line one piece (split=none, no markup)?"""
    return s.options.split == "none" and s.options.markup == "none"


def word_column(s: Session, result: TextResult) -> list[str] | None:
    """word_scores=true: each hypothesis' words with their probabilities (`word|0.9312 ...`,
    word_combine's); None otherwise."""
    if not s.cfg.word_scores:
        return None
    return [format_words(found) for found in result.words]


def warn_unplaced(s: Session, results: list[TextResult], first: int) -> None:
    """markup=: warn of each tag the alignment could not place, the first few named."""
    unplaced = [u for r in results for u in r.unplaced]
    for u in unplaced[:5]:
        log(f"warning: {s.name}: line {first + u.doc + 1}: {u.why()}")
    if len(unplaced) > 5:
        log(f"warning: {len(unplaced)} tags placed around their whole sentences in all")


def alignments(s: Session, src_ids: list[list[int]],
               nbest: list[list[Hypothesis]]) -> list[list[str]]:
    """Per input line, the Pharaoh links of each of its hypotheses (the first model's
    attention, for an ensemble), aligned in batches of search.max_tokens."""
    from nmt.wings.align import align, pharaoh

    pairs = [(src, h.tokens) for src, hyps in zip(src_ids, nbest, strict=True) for h in hyps]
    links = iter(map(pharaoh, align(s.translator, [p[0] for p in pairs],
                                    [p[1] for p in pairs], s.cfg.alignment_layer,
                                    s.cfg.search.max_tokens)))
    return [[next(links) for _ in hyps] for hyps in nbest]


def gather(s: Session, mine: list[int], hyps: list, n: int) -> list:
    """Every rank's results for lines 0..n-1 of a chunk, in order (torchrun: from all)."""
    if s.env.world_size == 1:
        return hyps
    out = [None] * n
    for part in distributed.all_gather_objects(list(zip(mine, hyps, strict=True))):
        for i, h in part:
            out[i] = h
    return out




def check_constraint_lines(s: Session, lines: int, complete: bool = True) -> None:
    """The constraints file has a line for each of the first `lines` input lines, and
    (complete: the input has ended) no more."""
    if s.phrases is None:
        return
    n = len(s.phrases)
    if n < lines:
        raise NmtError(f"{s.cfg.constraints}: no line {n + 1} for input line {n + 1} (one line "
                       f"of TAB-separated phrases per line of {s.name})")
    if complete and n > lines:
        raise NmtError(f"{s.cfg.constraints}: line {lines + 1} has no input line ({s.name} has "
                       f"{lines} lines)")


def constraint_ids(s: Session, first: int, lines: int) -> list[list[list[int]]] | None:
    """The phrases of input lines first+1..first+lines, encoded with the target tokenizer."""
    if s.phrases is None:
        return None
    check_constraint_lines(s, first + lines, complete=False)
    chunk = s.phrases[first:first + lines]
    ids = iter(s.translator.tgt_tok.encode([p for ps in chunk for p in ps]))
    return [[next(ids) for _ in ps] for ps in chunk]


def warn_unfinished(s: Session, hyps: list[list[Hypothesis]], first: int) -> None:
    """Warn of input lines that ended with no hypothesis at all (every continuation banned:
    its prefix, constraints or no_repeat_ngram_size leave none), the first few named; even
    with quiet=true, as their output lines are empty."""
    empty = [i for i, hs in enumerate(hyps) if hs[0].logprob == -math.inf]
    for i in empty[:5]:
        log(f"warning: {s.name}: line {first + i + 1}: no translation: every continuation "
            f"was banned (by its prefix, constraints or search.no_repeat_ngram_size)")
    if len(empty) > 5:
        log(f"warning: {len(empty)} lines without a translation in all")


def warn_missing(s: Session, hyps: list[list[Hypothesis]], phrases: list[list[list[int]]],
                 first: int) -> None:
    """Warn of translations that lack a constraint (cut at the maximum length), the first
    few named; lines with no translation at all are warn_unfinished's."""
    lacking = [(i, j) for i, (hs, ps) in enumerate(zip(hyps, phrases, strict=True))
               if hs[0].logprob != -math.inf for j in missing_phrases(hs[0].tokens, ps)]
    for i, j in lacking[:5]:
        text = s.translator.tgt_tok.decode([phrases[i][j]])[0]
        log(f"warning: {s.name}: line {first + i + 1}: the translation lacks constraint "
            f"{text!r} (cut at the maximum length)")
    if len(lacking) > 5:
        log(f"warning: {len(lacking)} constraints missing in all")


def check_references(s: Session, lines: int) -> None:
    """Every reference file has one line per input line."""
    paths = [s.cfg.ref] * bool(s.cfg.ref) + list(s.cfg.refs)
    for path, stream in zip(paths, s.refs or [], strict=True):
        if len(stream) != lines:
            raise NmtError(f"{path}: {len(stream)} reference lines but {lines} input lines")








@contextmanager
def decoding_threads(s: Session, rows: int) -> Iterator[None]:
    """Meanwhile, fewer than FEW_LINES rows (a pipe's few arriving lines) decode on one
    PyTorch thread, unless threads= is set: on such small steps a second thread mostly waits,
    and its waits cost CPU time."""
    if rows >= FEW_LINES or s.cfg.threads or s.translator.device.type != "cpu":
        yield
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def run_search(s: Session, prepared: Prepared, mine: list[int], first: int, parallel: bool,
               interactive: bool = False) -> list[list[Hypothesis]]:
    """The translator's search (or scoring) of the pieces `mine` of input lines first+1..,
    with a progress bar on an interactive stderr."""
    cfg = s.cfg
    pieces = [prepared.pieces[i] for i in mine]
    prefixes, phrases = prepared.prefixes(), prepared.constraints()
    bar = None
    if not cfg.quiet and not interactive and s.env.is_main and sys.stderr.isatty():
        from tqdm import tqdm

        bar = tqdm(total=len(pieces), unit="sent", desc=PROG, leave=False)
    progress = bar.update if bar else None
    src_ids, tgt_ids = [p.ids for p in pieces], prefixes and [prefixes[i] for i in mine]
    try:
        if cfg.score_reference:
            return [[h] for h in s.translator.score_ids(src_ids, tgt_ids, cfg.search, progress,
                                                        parallel)]
        chooser = s.options.chooser
        search = chooser.search if chooser is not None else cfg.search
        return s.translator.translate_ids(src_ids, search, tgt_ids,
                                          [first + p.stream for p in pieces], progress,
                                          parallel, phrases and [phrases[i] for i in mine],
                                          scores=search.nbest > 1 or cfg.word_scores)
    finally:
        if bar is not None:
            bar.close()
