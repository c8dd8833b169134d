"""nmt-train's validation (as Sockeye keeps its checkpoint decoder apart): the valid loss of
the weights a checkpoint is translated with, greedy translations of the valid sources scored
with BLEU and chrF (and COMET-22 with train.comet; per direction in a multilingual run), and
the best value and patience they decide."""

from __future__ import annotations

import dataclasses
import logging
import math

import torch
from torch import nn

from nmt.data.batches import EpochBatchIterator
from nmt.data.manifest import Section, clean_text_path, directions
from nmt.data.tokenizer import Tokenizer
from nmt.engines.translator import Translator
from nmt.metrics.scoring import read_references, score
from nmt.system import distributed
from nmt.system.files import read_lines
from nmt.training.run import Run, batch_loss, fatal_out_of_memory
from nmt.training.runlog import RunLog

log = logging.getLogger("nmt.commands.train")


def validate_and_track(run: Run, logs: RunLog | None) -> bool:
    """Validate, log, and update the best value and the patience counter; True if best."""
    tc = run.cfg.train
    valid = validate(run)
    run.last_valid, run.validated_at = valid, run.update
    value = valid[tc.best_metric]
    higher = tc.best_metric in ("bleu", "chrf", "comet")
    improved = run.best is None or (value > run.best if higher else value < run.best)
    if improved:
        run.best, run.bad_validations = value, 0
    else:
        run.bad_validations += 1
    valid["best"] = run.best
    if logs is not None:
        logs.write("valid", run.update, run.data.train.epoch, valid)
        logs.draw()
    extra = "".join(f" {k} {valid[k]:.2f}" for k in ("bleu", "chrf") if k in valid)
    extra += f" comet {valid['comet']:.4f}" if "comet" in valid else ""
    extra += "".join(f" | {k.split('/')[1]} loss {v:.3f}" + (
        f" bleu {valid['bleu/' + k.split('/')[1]]:.2f}" if "bleu/" + k.split("/")[1] in valid
        else "") for k, v in valid.items() if k.startswith("loss/"))
    if "model_loss" in valid:
        extra += f" | trained weights' loss {valid['model_loss']:.3f}"
    log.info("valid%s | update %d | loss %.3f | nll %.3f | ppl %.2f%s | best %s %.3f%s",
             " (ema)" if run.ema is not None else "", run.update, valid["loss"], valid["nll"],
             valid["ppl"], extra, tc.best_metric, run.best, " (new best)" if improved else "")
    return improved


def validate(run: Run) -> dict:
    """Valid loss, NLL and perplexity (and BLEU/chrF when train.valid_bleu) of the weights a
    checkpoint is translated with: the EMA when train.ema_decay keeps one (nmt-translate's
    weights=auto), whose numbers then also choose the best checkpoint and count patience;
    the trained weights' loss, NLL and perplexity are logged beside them as model_*, and
    "weights" names the judged ones ("ema" or "model")."""
    used = run.model if run.ema is None else run.ema
    out = {"weights": "model" if run.ema is None else "ema", **valid_scores(run, used)}
    if run.ema is not None:
        out.update({f"model_{k}": v for k, v in valid_scores(run, run.model, False).items()
                    if k in ("loss", "nll", "ppl")})
    return out


def valid_scores(run: Run, model: nn.Module, bleu: bool = True) -> dict:
    """valid_loss (and with train.valid_bleu and `bleu`, valid_bleu) of `model`; in a
    multilingual run, each direction's as "loss/en-de" and so on, and as loss, nll, bleu and
    chrf their mean over the directions (ppl: exp of the mean nll), which judge the best
    checkpoint."""
    parts = directions(run.data.manifest, "valid")
    if not parts:
        out = valid_loss(run, model)
        return {**out, **(valid_bleu(run, model) if bleu and run.cfg.train.valid_bleu else {})}
    sections = run.data.manifest.sections["valid"]
    out, means = {}, {}
    for part in parts:
        name = part.name
        chosen = [1.0 if (s.src_lang, s.tgt_lang) == (part.src_lang, part.tgt_lang)
                  else 0.0 for s in sections]
        scores = valid_loss(run, model, sections, chosen)
        if bleu and run.cfg.train.valid_bleu:
            scores.update(valid_bleu(run, model, [i for first, n in part.ranges
                                                  for i in range(first, first + n)]))
        for key in ("loss", "nll", "bleu", "chrf", "comet"):
            if key in scores:
                out[f"{key}/{name}"] = scores[key]
                means.setdefault(key, []).append(scores[key])
        out["tokens"] = out.get("tokens", 0) + scores["tokens"]
        out["skipped"] = out.get("skipped", 0) + scores["skipped"]
    out.update({key: sum(values) / len(values) for key, values in means.items()})
    out["ppl"] = math.exp(min(out["nll"], 100.0))
    return out


@torch.no_grad()
def valid_loss(run: Run, model: nn.Module, sections: list[Section] | None = None,
               chosen: list[float] | None = None) -> dict:
    """Per-token loss, NLL and perplexity of `model` on the valid split (or on its `sections`
    of weight 1 in `chosen`), shared out over ranks."""
    tc, env = run.cfg.train, run.env
    itr = EpochBatchIterator(run.data.valid, tc.max_tokens, tc.seed, run.pad_id, env.rank,
                             env.world_size, run.cfg.model.max_positions, shuffle=False,
                             lockstep=False, corpora=sections, weights=chosen)
    training = model.training
    model.eval()
    sums, tokens = torch.zeros(2, dtype=torch.float64, device=env.device), 0
    for _, batch in itr:
        with fatal_out_of_memory(run, [batch], "validation"):
            loss, nll = batch_loss(model, batch.to(env.device), run.cfg.optim.label_smoothing,
                                   run.pad_id, run.precision)
        sums += torch.stack([loss, nll]).double()
        tokens += batch.tgt_tokens
    count = torch.tensor([float(tokens)], dtype=torch.float64).to(env.device)
    loss, nll, n = distributed.all_reduce_sum(torch.cat([sums, count])).tolist()
    model.train(training)
    n = max(n, 1.0)
    return {"loss": loss / n, "nll": nll / n, "ppl": math.exp(min(nll / n, 100.0)),
            "tokens": int(n), "skipped": itr.skipped}


def valid_bleu(run: Run, model: nn.Module, sentences: list[int] | None = None) -> dict:
    """Greedy translations of the valid sources (or of those numbered `sentences`) by
    `model`, detokenized and scored with sacreBLEU (the first valid_bleu_max_sentences), and
    with train.comet's COMET-22 against the first references."""
    tc, env, valid, vocab = run.cfg.train, run.env, run.data.valid, run.vocab
    sentences = sentences if sentences is not None else list(range(len(valid)))
    sentences = sentences[:tc.valid_bleu_max_sentences or len(sentences)]
    n = len(sentences)
    limit = run.cfg.model.max_positions - 1  # room for the EOS
    mine = list(range(env.rank, n, env.world_size))  # each rank translates a share
    src_ids = [valid.src[sentences[i]][:limit].tolist() for i in mine]
    search = dataclasses.replace(run.cfg.search, beam_size=1, nbest=1)
    with fatal_out_of_memory(run, f"greedy search of {len(src_ids)} sentences in batches of "
                                  f"search.max_tokens={search.max_tokens}", "validation"):
        with Translator([model], vocab, env.device, search.dtype) as translator:  # these weights
            out = [h[0].tokens for h in translator.translate_ids(src_ids, search, scores=False)]
    hyps: dict[int, list[int]] = {}
    for part in distributed.all_gather_objects(dict(zip(mine, out, strict=True))):
        hyps.update(part)
    tgt = translator.tgt_tok
    hyp_text = tgt.decode([hyps[i] for i in range(n)])
    refs = valid_references(run, tgt, sentences)
    scores = score(hyp_text, refs, tc.bleu_tokenize)
    out = {"bleu": scores.bleu, "chrf": scores.chrf, "bleu_sentences": n}
    if run.comet is not None:
        sources = valid_texts(run, "src", translator.src_tok, sentences)
        out["comet"] = run.comet(sources, hyp_text, refs[0])
    return out


def valid_texts(run: Run, side: str, tok: Tokenizer, sentences: list[int]) -> list[str]:
    """The lines `sentences` of the cleaned valid text of `side` (src or tgt: the file the
    manifest names, valid.clean.<lang>), or the decoded ids when absent."""
    text = clean_text_path(run.cfg.data_dir, run.data.manifest, "valid", side)
    if text is not None and text.is_file():
        lines = read_lines(str(text), f"valid {side} text")
        return [lines[i] for i in sentences]
    log.warning("%s: no cleaned valid %s text: scoring decoded ids", run.cfg.data_dir, side)
    return tok.decode([getattr(run.data.valid, side)[i].tolist() for i in sentences])


def valid_references(run: Run, tgt: Tokenizer, sentences: list[int]) -> list[list[str]]:
    """The cleaned valid targets (the file the manifest names, valid.clean.<tgt_lang>, or the
    decoded ids when absent), then each file of train.valid_refs: the lines `sentences` of
    each."""
    first = valid_texts(run, "tgt", tgt, sentences)
    extra = read_references(run.cfg.train.valid_refs, len(run.data.valid), "valid pairs")
    return [first, *([stream[i] for i in sentences] for stream in extra)]
