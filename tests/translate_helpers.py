"""Builders for the search and translate tests: tiny random Transformers and checkpoints.

Random weights are enough to test search (every property checked holds for any model); the
checkpoint follows the contract of nmt/training/checkpoint.py with the toy SentencePiece model of
conftest.py's `tiny_data_dir`.
"""

from __future__ import annotations

import itertools
from dataclasses import asdict
from functools import cache
from pathlib import Path

import torch

from nmt.config import ModelConfig, SearchConfig, TrainConfig, TranslateConfig, compose, to_object
from nmt.data.tokenizer import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    SPECIALS,
    UNK_ID,
    Specials,
    Tokenizer,
    vocab_sha256,
)
from nmt.decoding.batches import length_penalty, translate_nbest
from nmt.engines.translator import Translator
from nmt.model import Transformer, make_model
from nmt.training.checkpoint import save_checkpoint


@cache
def tiny_model_cfg(N: int = 1, d_model: int = 32, d_ff: int = 64, h: int = 4,
                   max_positions: int = 1024) -> ModelConfig:
    """The small model's config with tiny sizes, composed as the CLI would."""
    cfg = compose("train", ["+model=small", "data_dir=x", "run_dir=y", f"model.N={N}",
                            f"model.d_model={d_model}", f"model.d_ff={d_ff}", f"model.h={h}",
                            f"model.max_positions={max_positions}"])
    return to_object(cfg, TrainConfig).model


def tiny_model(vocab_size: int, seed: int = 0, stops: bool = False, **sizes) -> Transformer:
    """A random tiny Transformer with a joint vocabulary, in eval mode.

    stops: move EOS's output row along the mean decoder state so that EOS wins at about 20%
    of the positions of random inputs (a random model otherwise almost never stops, or always
    stops at once), so that searches end some outputs early and others at the maximum length.
    """
    torch.manual_seed(seed)
    model = make_model(tiny_model_cfg(**sizes), vocab_size, vocab_size, PAD_ID, True).eval()
    if stops:
        g = torch.Generator().manual_seed(seed)
        states = []
        hook = model.generator.register_forward_hook(lambda m, args, out: states.append(args[0]))
        with torch.no_grad():
            src, tgt = (torch.randint(4, vocab_size, (16, 8), generator=g) for _ in range(2))
            logits = model(src, tgt).flatten(0, 1)  # (16 * 8, V)
            hook.remove()
            x = states[0].flatten(0, 1).mean(0)  # (d_model,): the mean decoder state
            margin = logits[:, EOS_ID] - logits[:, 4:].max(-1).values  # EOS over the best token
            model.generator.weight[EOS_ID] -= margin.quantile(0.8) * x / x.dot(x)
    return model


def random_sources(n: int, vocab_size: int, max_len: int = 9, seed: int = 0) -> list[list[int]]:
    """n id lists of 1..max_len ordinary tokens (no specials)."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, max_len + 1, (n,), generator=g).tolist()
    return [torch.randint(4, vocab_size, (L,), generator=g).tolist() for L in lengths]


def search(**kw) -> SearchConfig:
    """A SearchConfig (beam 4 unless kw says otherwise) with short outputs so that tests stay
    fast, nothing compiled (search.compile=auto's int8 packages take ~10 s to build a model:
    tests/unit/test_aot_step.py's, and nmt-translate's in tests/integration)."""
    base = dict(beam_size=4, alpha=0.6, max_len_a=1.0, max_len_b=6, min_len=1, compile="false")
    base.update(kw)
    return SearchConfig(**base)


def run(model, sources, cfg, workers: int = 1, **kw):
    """translate_nbest with the tokenizer's special ids; workers > 1: on a Translator's
    worker processes."""
    if workers == 1:
        return translate_nbest(model, sources, cfg, SPECIALS, **kw)
    with Translator([model], SPECIALS, dtype=cfg.dtype, workers=workers) as translator:
        return translator.translate_ids(sources, cfg, **kw)


def tokens(results):
    """The token lists of every hypothesis."""
    return [[h.tokens for h in hyps] for hyps in results]


def exhaustive(model, source, max_len, min_len, alpha):
    """Every output of at most max_len tokens, scored with full (uncached) forward passes:
    (score, ids) pairs, best first."""
    specials = (PAD_ID, BOS_ID, EOS_ID)
    allowed = [t for t in range(model.generator.out_features) if t not in specials]
    scored = []
    for n in range(min_len, max_len + 1):
        bodies = torch.tensor(list(itertools.product(allowed, repeat=n)),
                              dtype=torch.long).view(-1, n)  # (M, n)
        M = bodies.size(0)
        y = bodies if n == max_len else torch.cat(  # at max_len the output stops without EOS
            [bodies, torch.full((M, 1), EOS_ID)], dim=1)  # (M, |Y|)
        tgt_in = torch.cat([torch.full((M, 1), BOS_ID), y[:, :-1]], dim=1)
        with torch.no_grad():
            lprobs = model(torch.tensor([source + [EOS_ID]]).expand(M, -1), tgt_in)
        lprobs = lprobs.float().log_softmax(-1)  # (M, |Y|, V)
        lprobs[:, :, [PAD_ID, BOS_ID]] = -torch.inf
        lprobs[:, :min_len, EOS_ID] = -torch.inf
        logp = lprobs.gather(2, y.unsqueeze(2)).squeeze(2).sum(1)  # (M,)
        lp = length_penalty(y.size(1), alpha)
        scored += [(s / lp, b) for s, b in zip(logp.tolist(), bodies.tolist(), strict=True)]
    return sorted(scored, key=lambda x: -x[0])


def plain_beam(model, source: list[int], cfg: SearchConfig,
               specials: Specials = SPECIALS) -> list[tuple[float, list[int]]]:
    """fairseq's beam search written plainly for one sentence on the reference model (full
    forward passes: no cache, no batch, no Decoding), the rules the decoding core keeps: of
    the 2k best continuations, EOS ones among the first k finish and the first k others go
    on; k finished end the search; at the maximum length the active ones finish as they are.
    Beam 1 is greedy search. Outputs start from specials.bos; PAD and the start token are
    never generated, unless the start token is EOS (M2M100, NLLB-200), which still ends them.
    cfg.nbest (score, ids) pairs, best first."""
    k, bos, eos = cfg.beam_size, specials.bos, specials.eos
    banned = [t for t in (specials.pad, bos) if t != eos]
    max_len = min(max(int(cfg.max_len_a * len(source) + cfg.max_len_b), 1),
                  model.cfg.max_positions)
    src = torch.tensor([source + [eos]])
    beams, finished = [(0.0, [])], []  # (log P, ids) each
    for t in range(max_len):
        tgt_in = torch.tensor([[bos] + ids for _, ids in beams])
        with torch.no_grad():
            lprobs = model(src.expand(len(beams), -1), tgt_in)[:, -1].float().log_softmax(-1)
        lprobs[:, banned] = -torch.inf
        if t < cfg.min_len:
            lprobs[:, eos] = -torch.inf
        cand = sorted(((logp + lp, ids + [tok])
                       for (logp, ids), row in zip(beams, lprobs.tolist(), strict=True)
                       for tok, lp in enumerate(row)), key=lambda c: -c[0])[:2 * k]
        going = [c for c in cand if c[1][-1] != eos][:k]
        finished += [(logp / length_penalty(t + 1, cfg.alpha), ids[:-1])
                     for logp, ids in cand[:k] if ids[-1] == eos and logp > -torch.inf]
        beams = going
        if t + 1 == max_len:
            finished += [(logp / length_penalty(max_len, cfg.alpha), ids) for logp, ids in beams
                         if logp > -torch.inf]
        if len(finished) >= k:
            break
    return sorted(finished, key=lambda f: -f[0])[:cfg.nbest]


def translate_config(**kw) -> TranslateConfig:
    """A TranslateConfig composed like the CLI from key=value pairs, with short outputs for
    speed (max_len_b=8) and no speed report."""
    args = [f"{k}={v}" for k, v in kw.items()] + ["search.max_len_b=8", "quiet=true"]
    return to_object(compose("translate", args), TranslateConfig)


def lines_of(path: Path) -> list[str]:
    """The lines of a UTF-8 file that ends each line with a newline."""
    return path.read_text(encoding="utf-8").split("\n")[:-1]


def save_tiny_checkpoint(path: Path, spm_proto: bytes, seed: int = 0, **sizes) -> Path:
    """A checkpoint per the contract: random tiny model, joint vocabulary `spm_proto`."""
    tok = Tokenizer(spm_proto)
    model = tiny_model(tok.vocab_size, seed, **sizes)
    vocab = {"src_size": tok.vocab_size, "tgt_size": tok.vocab_size, "joint": True,
             "pad_id": PAD_ID, "unk_id": UNK_ID, "bos_id": BOS_ID, "eos_id": EOS_ID,
             "sha256": vocab_sha256(spm_proto, spm_proto),
             "src_spm": spm_proto, "tgt_spm": spm_proto}
    save_checkpoint({"model": model.state_dict(), "model_cfg": asdict(model.cfg),
                     "vocab": vocab, "update": 0, "epoch": 0}, path)
    return path


class TableModel(torch.nn.Module):
    """A stand-in for the Transformer in search tests: next-token logits from a fixed random
    table indexed by (position, previous token); the source is ignored.

    Peaked random tables make EOS likely at some steps and not others, so that the order in
    which hypotheses finish, and the length penalty, really matter.
    """

    def __init__(self, vocab_size: int, positions: int = 16, seed: int = 0, scale: float = 3.0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.table = scale * torch.randn(positions, vocab_size, vocab_size, generator=g)
        self.cfg = ModelConfig(N=1, d_model=2, d_ff=1, h=1, dropout=0.0, max_positions=positions)
        self.generator = torch.nn.Linear(1, vocab_size, bias=False)  # only its size is used

    def encode(self, src: torch.Tensor):
        """The 'memory' is the source itself."""
        return src, (src != PAD_ID)[:, None, None, :]

    def start_decoding(self, memory, src_mask, beam: int = 1):
        """A state that only counts steps (reorder has nothing to move)."""
        return _TableState()

    def decode_step(self, tgt_new: torch.Tensor, state) -> torch.Tensor:
        """(R, 1) previous tokens -> (R, 1, V) logits."""
        logits = self.table[state.step, tgt_new[:, -1]]  # (R, V)
        state.step += 1
        return logits.unsqueeze(1)

    def decode(self, tgt_in: torch.Tensor, memory, src_mask) -> torch.Tensor:
        """(R, T) shifted targets -> (R, T, V) logits."""
        T = tgt_in.size(1)
        return self.table[torch.arange(T), tgt_in]  # (R, T, V)

    def forward(self, src, tgt_in):
        return self.decode(tgt_in, None, None)


class _TableState:
    """DecoderState of TableModel."""

    def __init__(self):
        self.step = 0

    def reorder(self, index, beam=None) -> None:
        """Nothing depends on the rows' history but the previous token, which search feeds."""


def fine_tune_imported(imported: Path, pairs: list[tuple[str, str]], out: Path, updates: int,
                       tag: str = "") -> tuple[Path, Path]:
    """The README's fine-tuning of an imported checkpoint: the (English, German) pairs, the last
    20 as the valid split, preprocessed with its vocabulary (bpe.model=; tag: a corpus tag put
    first on every source, e.g. M2M100's language code), then nmt-train +model=small with the
    import's model overrides and train.init_from for `updates` updates. (data directory, the
    fine-tuned checkpoint)."""
    from nmt.commands.import_ import model_overrides
    from nmt.commands.preprocess import preprocess
    from nmt.commands.train import train
    from nmt.config import PreprocessConfig
    from nmt.training.checkpoint import load_checkpoint

    for split, part in (("train", pairs[:-20]), ("valid", pairs[-20:])):
        for lang, side in (("en", 0), ("de", 1)):
            (out / f"{split}.{lang}").write_text("\n".join(p[side] for p in part) + "\n",
                                                 encoding="utf-8")
    train_corpus = f"{{path:{out}/train,tag:{tag}}}" if tag else f"{out}/train"
    data = out / "domain"
    preprocess(to_object(compose("preprocess", [
        "src_lang=en", "tgt_lang=de", f"train=[{train_corpus}]", f"valid={out}/valid",
        f"out_dir={data}", f"bpe.model={imported}", "workers=1"]), PreprocessConfig))
    overrides = model_overrides(ModelConfig(**load_checkpoint(imported)["model_cfg"]))
    result = train(to_object(compose("train", [
        "+model=small", f"data_dir={data}", f"run_dir={out / 'run'}", *overrides,
        f"train.init_from={imported}", f"train.max_updates={updates}", "train.max_tokens=400",
        "train.threads=1", "optim.warmup=1", "optim.lr_factor=0.02", "model.dropout=0.0"]),
        TrainConfig))
    assert result["update"] == updates
    return data, out / "run" / "checkpoint_last.pt"


def mean_nll(checkpoint: Path, src: list[str], tgt: list[str], first: tuple[int, ...] = ()
             ) -> float:
    """The checkpoint's mean negative log-likelihood per target piece (EOS counted) of the
    pairs; first: ids put before every source's (a language code)."""
    tr = Translator.load(checkpoint, dtype=None)
    tgt_ids = tr.tgt_tok.encode(tgt)
    hyps = tr.score_ids([[*first, *ids] for ids in tr.src_tok.encode(src)], tgt_ids,
                        SearchConfig(beam_size=1, alpha=0.0), parallel=False)
    return -sum(h.logprob for h in hyps) / sum(len(t) + 1 for t in tgt_ids)


def widen(model, seed: int) -> None:
    """Draw a transformers model's weights (MarianMT, M2M100) wide enough that greedy outputs
    depend on the source; the static sinusoids and the layer norms stay."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "embed_positions" in name:  # the static sinusoids
                continue
            if "shared" in name or "embed_tokens" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 2.0 / p.size(1) ** 0.5)
            elif p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=g) * 2.5 / p.size(1) ** 0.5)
            elif "layer_norm" not in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.2)
        if hasattr(model, "final_logits_bias"):  # MarianMT's
            model.final_logits_bias.copy_(torch.randn(model.final_logits_bias.shape,
                                                      generator=g))
