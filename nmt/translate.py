"""nmt-translate: a checkpoint and raw text in, detokenized translations out.

Reads raw lines (a file or standard input), encodes them with the SentencePiece model stored in
the checkpoint, translates them in length-sorted token-budget batches (nmt.search), and writes
one detokenized line per input line, in input order (or `i ||| hypothesis ||| score` lines when
search.nbest > 1). With ref=..., prints sacreBLEU BLEU and chrF with their signatures (the
scorer of validation, nmt.scoring) to stderr; stdout carries only translations.
"""

from __future__ import annotations

import hashlib
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from nmt.checkpoint import load_checkpoint, temporary_beside
from nmt.config import ModelConfig, TranslateConfig
from nmt.errors import ConfigError, NmtError
from nmt.model import Transformer, build_model
from nmt.scoring import score
from nmt.search import Hypothesis, translate_nbest
from nmt.tokenizer import Tokenizer

PROG = "nmt-translate"
VOCAB_KEYS = ("src_size", "tgt_size", "joint", "pad_id", "bos_id", "eos_id", "sha256",
              "src_spm", "tgt_spm")


def log(message: str) -> None:
    """One line on stderr (stdout is for translations)."""
    print(f"{PROG}: {message}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- the model
@dataclass
class Translator:
    """A model ready to translate, with its vocabularies."""

    model: Transformer
    src_tok: Tokenizer
    tgt_tok: Tokenizer
    vocab: dict  # the checkpoint's vocab entry
    device: torch.device


def resolve_device(name: str) -> torch.device:
    """"auto" is CUDA when available, else the CPU; asking for a missing CUDA is an error."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise NmtError("device=cuda: no CUDA device is available")
    return torch.device(name)


def load_translator(path: str | Path, device: torch.device | str = "cpu",
                    weights: str = "auto") -> Translator:
    """Build the model of a checkpoint and check that its vocabularies fit it. weights: "model",
    "ema" (the moving average that train.ema_decay keeps) or "auto" (ema when saved)."""
    state = load_checkpoint(path)
    if weights == "ema" and "ema" not in state:
        raise NmtError(f"{path}: weights=ema but the checkpoint has no EMA weights (train with "
                       f"train.ema_decay > 0, or use weights=model)")
    use_ema = weights == "ema" or (weights == "auto" and "ema" in state)
    vocab = state["vocab"]
    missing = [key for key in VOCAB_KEYS if key not in vocab]
    if missing:
        raise NmtError(f"{path}: checkpoint vocab lacks {', '.join(missing)}")
    src_tok = Tokenizer(vocab["src_spm"], f"{path}: source vocabulary")
    tgt_tok = Tokenizer(vocab["tgt_spm"], f"{path}: target vocabulary")
    _check_vocab_consistency(path, vocab, src_tok, tgt_tok)
    try:
        cfg = ModelConfig(**state["model_cfg"])
    except (TypeError, ConfigError) as e:
        raise NmtError(f"{path}: bad model_cfg ({e})") from None
    weights = {k.removeprefix("_orig_mod.").removeprefix("module."): v
               for k, v in state["ema" if use_ema else "model"].items()}
    for key, size in (("src_embed.lut.weight", vocab["src_size"]),
                      ("generator.weight", vocab["tgt_size"])):
        if key in weights and weights[key].size(0) != size:
            raise NmtError(f"{path}: {key} has {weights[key].size(0)} rows but the vocabulary "
                           f"has {size} entries")
    model = build_model(cfg, vocab["src_size"], vocab["tgt_size"], vocab["pad_id"],
                        vocab["joint"])
    try:
        model.load_state_dict(weights)
    except RuntimeError as e:
        last = str(e).strip().splitlines()[-1].strip()[:150]
        raise NmtError(f"{path}: weights do not fit model_cfg ({last})") from None
    device = torch.device(device)
    return Translator(model.to(device).eval(), src_tok, tgt_tok, vocab, device)


def _check_vocab_consistency(path, vocab: dict, src_tok: Tokenizer, tgt_tok: Tokenizer) -> None:
    """The stored SentencePiece models must have the stored sizes and checksum."""
    for side, tok in (("src", src_tok), ("tgt", tgt_tok)):
        if tok.vocab_size != vocab[f"{side}_size"]:
            raise NmtError(f"{path}: {side} SentencePiece model has {tok.vocab_size} pieces but "
                           f"{side}_size is {vocab[f'{side}_size']} (vocabulary does not match)")
    sums = {hashlib.sha256(src_tok.proto + tgt_tok.proto).hexdigest(), src_tok.sha256}
    if vocab["sha256"] not in sums:
        raise NmtError(f"{path}: SentencePiece models do not match the stored vocabulary sha256")


def check_vocab(translator: Translator, against: str, checkpoint: str) -> None:
    """vocab_check=...: a data directory, its manifest.json or a .model file must match."""
    path = Path(against)
    if path.suffix == ".model":
        theirs = Tokenizer.from_file(path).sha256
        ours = translator.src_tok.sha256
    else:
        from nmt.data import MANIFEST, read_manifest

        manifest = read_manifest(path.parent if path.name == MANIFEST else path)
        if "vocab_sha256" not in manifest:
            raise NmtError(f"{path}: manifest has no vocab_sha256")
        theirs, ours = manifest["vocab_sha256"], translator.vocab["sha256"]
    if theirs != ours:
        raise NmtError(f"{checkpoint}: vocabulary (sha256 {ours[:12]}) does not match "
                       f"{path} (sha256 {theirs[:12]})")


# ----------------------------------------------------------------------------- text in and out
def read_lines(path: str, what: str = "input") -> list[str]:
    """Lines of a UTF-8 file ("-": standard input), without their line ends."""
    name = "<stdin>" if path == "-" else path
    try:
        data = sys.stdin.buffer.read() if path == "-" else Path(path).read_bytes()
    except OSError as e:
        raise NmtError(f"{name}: cannot read {what} ({e.strerror})") from None
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()  # the final line end
    out = []
    for number, line in enumerate(lines, start=1):
        try:
            out.append(line.decode("utf-8").removesuffix("\r"))
        except UnicodeDecodeError as e:
            raise NmtError(f"{name}: line {number} is not valid UTF-8 "
                           f"(byte 0x{line[e.start]:02x} at offset {e.start})") from None
    return out


def encode_lines(tok: Tokenizer, lines: list[str], max_tokens: int, name: str,
                 quiet: bool = False) -> list[list[int]]:
    """Subword ids of each line, cut to max_tokens with a warning (the first few named)."""
    ids = tok.encode(lines)
    long = [i for i, seq in enumerate(ids) if len(seq) > max_tokens]
    for shown, i in enumerate(long):
        if not quiet and shown < 5:
            log(f"warning: {name}: line {i + 1} has {len(ids[i])} tokens; truncated to "
                f"{max_tokens}")
        ids[i] = ids[i][:max_tokens]
    if len(long) > 5 and not quiet:
        log(f"warning: {name}: {len(long)} lines truncated in all")
    return ids


def format_output(index: int, hyps: list[Hypothesis], texts: list[str], nbest: int) -> list[str]:
    """The output lines of one input: its best translation, or nbest `i ||| text ||| score`."""
    if nbest == 1:
        return [texts[0]]
    return [f"{index} ||| {text} ||| {h.score:.4f}" for h, text in zip(hyps, texts, strict=True)]


def write_lines(path: str, lines: list[str]) -> None:
    """Write lines to a file atomically (temporary file, then rename), or to stdout for "-"."""
    text = "".join(line + "\n" for line in lines)
    if path == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    target = Path(path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = temporary_beside(target)
        try:
            Path(tmp).write_text(text, encoding="utf-8")
            os.replace(tmp, target)
        finally:
            Path(tmp).unlink(missing_ok=True)
    except OSError as e:
        raise NmtError(f"{path}: cannot write output ({e.strerror})") from None


# ----------------------------------------------------------------------------- the command
def translate(cfg: TranslateConfig) -> dict:
    """nmt-translate: translate cfg.input into cfg.output; returns hypotheses and scores."""
    device = resolve_device(cfg.device)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    workers = (cfg.workers or cores) if device.type == "cpu" else 1
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    if device.type == "cpu":
        from nmt.train import keep_freed_memory

        keep_freed_memory()  # reuse freed memory: large per-step tensors cost no page faults
    translator = load_translator(cfg.checkpoint, device, cfg.weights)
    if cfg.vocab_check:
        check_vocab(translator, cfg.vocab_check, cfg.checkpoint)
    name = "<stdin>" if cfg.input == "-" else cfg.input
    lines = read_lines(cfg.input)
    refs = read_lines(cfg.ref, "references") if cfg.ref else None
    if refs is not None and len(refs) != len(lines):
        raise NmtError(f"{cfg.ref}: {len(refs)} reference lines but {len(lines)} input lines")
    if cfg.attention_plot and cfg.attention_line > len(lines):
        raise NmtError(f"attention_line={cfg.attention_line}: {name} has {len(lines)} lines")
    limit = min(cfg.max_input_tokens, translator.model.cfg.max_positions - 1)
    src_ids = encode_lines(translator.src_tok, lines, limit, name, cfg.quiet)

    start = time.perf_counter()
    nbest = run_search(translator, src_ids, cfg, workers)
    seconds = time.perf_counter() - start
    texts = [translator.tgt_tok.decode([h.tokens for h in hyps]) for hyps in nbest]
    write_lines(cfg.output, [line for i, (hyps, t) in enumerate(zip(nbest, texts, strict=True))
                             for line in format_output(i, hyps, t, cfg.search.nbest)])
    result = {"hypotheses": [t[0] for t in texts], "nbest": nbest, "seconds": seconds}
    report(result, refs, cfg)
    if cfg.attention_plot:
        from nmt.plot import plot_attention

        i = cfg.attention_line - 1
        paths = plot_attention(translator, src_ids[i], nbest[i][0].tokens, cfg.attention_plot)
        log(f"attention of line {cfg.attention_line} drawn in {', '.join(map(str, paths))}")
    return result


def report(result: dict, refs: list[str] | None, cfg: TranslateConfig) -> None:
    """The speed summary, and BLEU and chrF with their signatures when there are references."""
    n, seconds = len(result["nbest"]), max(result["seconds"], 1e-9)
    if not cfg.quiet:
        n_tok = sum(len(hyps[0].tokens) for hyps in result["nbest"])
        log(f"translated {n} lines in {seconds:.1f} s ({n / seconds:.1f} sentences/s, "
            f"{n_tok / seconds:.0f} tokens/s; beam {cfg.search.beam_size})")
    if refs is not None and not refs:
        log(f"{cfg.ref}: no lines, nothing to score")
    elif refs is not None:
        result["scores"] = scores = score(result["hypotheses"], refs)
        log(scores["bleu_line"])
        log(f"BLEU signature: {scores['bleu_signature']}")
        log(scores["chrf_line"])
        log(f"chrF signature: {scores['chrf_signature']}")


def run_search(translator: Translator, src_ids: list[list[int]], cfg: TranslateConfig,
               workers: int):
    """translate_nbest with a progress bar on an interactive stderr."""
    v = translator.vocab
    bar = None
    if not cfg.quiet and sys.stderr.isatty():
        from tqdm import tqdm

        bar = tqdm(total=len(src_ids), unit="sent", desc=PROG, leave=False)
    try:
        return translate_nbest(translator.model, src_ids, cfg.search, v["bos_id"], v["eos_id"],
                               v["pad_id"], translator.device,
                               progress=bar.update if bar else None, workers=workers)
    finally:
        if bar is not None:
            bar.close()
