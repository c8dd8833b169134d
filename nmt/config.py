"""Typed configuration: one dataclass per concern, registered with Hydra and validated once.

These dataclasses are the schema and the one place for each default: YAML files in configs/
hold only the values that differ from it (tests/unit/test_config.py fails when one restates a
default, which would win over an edit here). A field whose value is MISSING must be given (in
a YAML file or on the command line). `to_object` turns a composed DictConfig into these
dataclasses, which runs every `__post_init__` check exactly once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from nmt.capabilities import ENGINES
from nmt.config_checks import (
    CONSTRAINING,
    CT2_ONLY_DTYPES,
    candidate_search,
    check,
    check_choice,
    check_engine,
    check_markup,
    check_min,
    check_prob,
    check_rate,
    check_search_device,
    check_serve_models,
    check_serve_split,
    check_split,
)
from nmt.config_corpora import TrainCorpus, train_corpora
from nmt.config_errors import explain, extra_keys, unknown_key
from nmt.errors import ConfigError

if TYPE_CHECKING:  # OmegaConf and Hydra are imported where a config is composed through them
    from omegaconf import DictConfig
MISSING: Any = "???"  # omegaconf.MISSING: a value that must be given
WORD_COMBINES = ("product", "min")  # word_combine=: how a word's pieces' log P combine


# ----------------------------------------------------------------------------- model
# model.residual_init: the factor on W^O and W_2 (they write into the residual stream) after
# Xavier, for a stack of N layers
RESIDUAL_INIT = {"gpt2": lambda N: (2 * N) ** -0.5, "depth": lambda N: 1 / (2 * N),
                 "zero": lambda N: 0.0, "xavier": lambda N: 1.0}


@dataclass
class ModelConfig:
    """The Transformer's architecture (Vaswani et al. 2017, Table 3)."""

    N: int = MISSING  # identical layers in the encoder (and in the decoder unless N_dec)
    N_dec: int = 0  # decoder layers (0: N, the paper's); a deep encoder, 1-layer decoder is faster
    d_model: int = MISSING  # width of every sub-layer output and embedding
    d_ff: int = MISSING  # inner width of the position-wise feed-forward network
    h: int = MISSING  # attention heads; d_k = d_v = d_model / h
    dropout: float = MISSING  # P_drop on sub-layer outputs and on embedding + position sums
    attention_dropout: float = 0.0  # dropout on the attention weights
    norm: str = "post"  # "post": LN(x + Sublayer(x)) as in the paper; "pre": x + Sublayer(LN(x))
    share_embeddings: bool = True  # tie target embedding, output projection (+ source if joint)
    max_positions: int = 1024  # longest sequence the sinusoidal table covers
    activation: str = "relu"  # the FFN's: relu (the paper's), gelu, or swish (x sigmoid(x))
    output_bias: bool = False  # a bias on the output projection (MarianMT's final_logits_bias)
    residual_init: str = "gpt2"  # W^O, W_2 times gpt2 1/sqrt(2N), depth 1/(2N), zero 0, xavier 1
    positions: str = "paper"  # sinusoids: the paper's, or fairseq's (M2M100, NLLB; nmt.variants)
    norm_eps: float = 1e-5  # the LayerNorms' epsilon (torch's; OpenNMT-py's 1e-6, imported)

    def __post_init__(self) -> None:
        check_min(self, "model.", 1, "N", "d_model", "d_ff")
        check_min(self, "model.", 0, "N_dec")
        check(self.h >= 1 and self.d_model % self.h == 0, "model.h",
              f"d_model ({self.d_model}) must be divisible by h ({self.h})")
        check(self.d_model % 2 == 0, "model.d_model", "must be even (sinusoidal encoding)")
        check_prob(self.dropout, "model.dropout")
        check_prob(self.attention_dropout, "model.attention_dropout")
        check(self.norm in ("post", "pre"), "model.norm",
              f"must be 'post' or 'pre', got {self.norm!r}")
        check_min(self, "model.", 2, "max_positions")
        check(0 < self.norm_eps < 1, "model.norm_eps", f"must be in (0, 1), got {self.norm_eps}")
        check(self.activation in ("relu", "gelu", "swish"), "model.activation",
              f"must be relu, gelu or swish, got {self.activation!r}")
        check(self.residual_init in RESIDUAL_INIT, "model.residual_init",
              f"must be one of {', '.join(RESIDUAL_INIT)}, got {self.residual_init!r}")
        check(self.positions in ("paper", "fairseq"), "model.positions",
              f"must be paper or fairseq, got {self.positions!r}")
        check(self.positions == "paper" or self.d_model >= 4, "model.d_model",
              "must be >= 4 with model.positions=fairseq")

    @property
    def decoder_layers(self) -> int:
        """N_dec, or N when N_dec is 0."""
        return self.N_dec or self.N


# ----------------------------------------------------------------------------- optimisation
@dataclass
class OptimConfig:
    """Adam with the Noam schedule and label smoothing (the paper's section 5.3 and 5.4)."""

    lr_factor: float = MISSING  # lr = lr_factor * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)
    # The schedule's step counts applied updates: a skipped one (non-finite, fp16 overflow)
    # leaves the rate where it was (counted on the device: nmt.training.schedule.NoamSchedule).
    warmup: int = MISSING  # warmup_steps of the Noam schedule
    beta1: float = MISSING  # Adam beta_1
    beta2: float = MISSING  # Adam beta_2
    eps: float = MISSING  # Adam epsilon
    label_smoothing: float = MISSING  # epsilon_ls
    weight_decay: float = 0.0  # decoupled weight decay (AdamW); 0 is the paper's Adam
    clip_norm: float = 0.0  # clip the gradient's global L2 norm to this; 0 turns clipping off
    # A budget's last share: the rate falls linearly to 0 over the last c x train.max_updates
    # updates, or over the updates that the last c x train.max_minutes are worth at the pace
    # so far (fixed when that time comes, so the decay counts updates); training ends there.
    cooldown: float = 0.0  # share c of the budget spent cooling down to rate 0 (0: off)

    def __post_init__(self) -> None:
        check(self.lr_factor > 0, "optim.lr_factor", f"must be > 0, got {self.lr_factor}")
        check_min(self, "optim.", 1, "warmup")
        check_prob(self.beta1, "optim.beta1")
        check_prob(self.beta2, "optim.beta2")
        check(self.eps > 0, "optim.eps", f"must be > 0, got {self.eps}")
        check_prob(self.label_smoothing, "optim.label_smoothing")
        check_min(self, "optim.", 0, "weight_decay", "clip_norm")
        check_prob(self.cooldown, "optim.cooldown")


# ----------------------------------------------------------------------------- decoding
@dataclass
class SearchConfig:
    """Greedy (beam_size=1) or beam search, or sampling; constraints; the decoding dtype."""

    beam_size: int = 4  # hypotheses kept per sentence; 1 is greedy search
    alpha: float = 0.6  # GNMT length penalty ((5 + |Y|) / 6)^alpha; 0 turns it off
    max_len_a: float = 1.0  # maximum output length = max_len_a * source length + max_len_b
    max_len_b: int = 50  # see max_len_a
    min_len: int = 1  # EOS is forbidden before this many output tokens
    nbest: int = 1  # hypotheses (or samples) written per input line, with scores when > 1
    max_tokens: int = 4096  # source tokens per batch (padding included)
    max_sentences: int = 0  # sentences per batch at most (0: only max_tokens limits)
    sampling: bool = False  # draw nbest random samples per line instead (beam_size unused)
    temperature: float = 1.0  # sampling: softmax(log-probabilities / temperature)
    top_k: int = 0  # sampling: only from the top_k most probable tokens (0: all)
    top_p: float = 1.0  # sampling: only from the fewest best tokens of probability >= top_p
    epsilon: float = 0.0  # sampling: never a token of probability below epsilon (0: off)
    seed: int = 1  # sampling: a line's samples depend on this seed and its line number only
    no_repeat_ngram_size: int = 0  # no n-gram of this many tokens twice in an output (0: off)
    dtype: str = "fp32"  # fp32, bf16, int8 (CPU), fp16 (CUDA); int8_float16/_bfloat16: CTranslate2
    shortlist: str = ""  # FILE (nmt-preprocess shortlist.k=K): outputs cut to a batch's candidates
    # CPU decoding steps compiled: true (int8's steps of a few rows and encoder of one source
    # ahead of time, once per machine and model; fp32's and bf16's steps through torch.compile,
    # once per process; a one-line refusal without a C++ compiler), false, or auto: int8's
    # ahead of time where a C++ compiler builds the fused operator, the rest eager
    compile: str = "auto"

    def __post_init__(self) -> None:
        check_min(self, "search.", 1, "beam_size", "max_tokens", "nbest")
        check_min(self, "search.", 0, "alpha", "max_len_a", "max_len_b", "min_len",
                  "max_sentences", "top_k", "no_repeat_ngram_size")
        check(math.isfinite(self.max_len_a), "search.max_len_a",
              f"must be a finite number, got {self.max_len_a}")
        check(self.sampling or self.nbest <= self.beam_size, "search.nbest",
              f"must be between 1 and beam_size ({self.beam_size}), got {self.nbest}")
        check(self.temperature > 0, "search.temperature", f"must be > 0, got {self.temperature}")
        check(0 < self.top_p <= 1, "search.top_p", f"must be in (0, 1], got {self.top_p}")
        self.compile = str(self.compile).lower()  # search.compile=true comes as a bool
        check(self.compile in ("true", "false", "auto"), "search.compile",
              f"must be true, false or auto, got {self.compile!r}")
        check_prob(self.epsilon, "search.epsilon")
        check(self.dtype in ("fp32", "bf16", "fp16", "int8", *CT2_ONLY_DTYPES), "search.dtype",
              f"must be fp32, bf16, fp16, int8, int8_float16 or int8_bfloat16, "
              f"got {self.dtype!r}")

    @property
    def compiled(self) -> bool | None:
        """search.compile as FastModel takes it: True, False or None (auto)."""
        return {"true": True, "false": False}.get(self.compile)


# ----------------------------------------------------------------------------- preprocess
@dataclass
class BpeConfig:
    """The SentencePiece BPE model, trained on the (cleaned) training split only."""

    vocab_size: int = 8000  # subword vocabulary size, specials included (per language if not joint)
    joint: bool = True  # one vocabulary for both languages (needed for three-way tying)
    character_coverage: float = 1.0  # share of characters covered; the rest map to <unk>
    input_sentence_size: int = 2_000_000  # sentences sampled to train SentencePiece (0: all)
    split_digits: bool = True  # every digit its own piece (version numbers, counts)
    byte_fallback: bool = False  # spell unknown characters as UTF-8 byte pieces instead of <unk>
    normalization: str = "nmt_nfkc"  # SentencePiece rule: nmt_nfkc, nfkc, *_cf, or identity
    seed: int = 1  # seeds the training sample and SentencePiece
    model: str = ""  # reuse a .model file (joint) or a data directory's model(s); no training

    def __post_init__(self) -> None:
        check_min(self, "bpe.", 8, "vocab_size")
        check(0 < self.character_coverage <= 1, "bpe.character_coverage",
              f"must be in (0, 1], got {self.character_coverage}")
        check_min(self, "bpe.", 0, "input_sentence_size")
        rules = ("nmt_nfkc", "nfkc", "nmt_nfkc_cf", "nfkc_cf", "identity")
        check(self.normalization in rules, "bpe.normalization",
              f"must be one of {', '.join(rules)}, got {self.normalization!r}")


@dataclass
class CleanConfig:
    """Cleaning, each step counted and reported. Every split: invalid UTF-8, Unicode
    normalisation, whitespace stripped, empty pairs dropped. Training split only: duplicates,
    length and ratio (valid/test keep every non-empty pair, so scores stay comparable)."""

    max_tokens: int = 250  # drop training pairs with a side longer than this many subword tokens
    max_ratio: float = 9.0  # drop training pairs whose subword length ratio exceeds this (Moses)
    dedup: bool = False  # drop exact duplicate training pairs (memory: ~70 bytes a unique pair)
    normalize: str = ""  # Unicode normalisation applied first: "", "NFC", "NFKC", "NFD", "NFKD"
    invalid_utf8: str = "error"  # "error": stop at the first bad line; "skip": drop and count it
    comet_qe: str = ""  # a CometKiwi model directory: drop training pairs it scores low ("": off)
    comet_qe_min: float = 0.0  # with comet_qe: the lowest CometKiwi score a kept pair may have

    def __post_init__(self) -> None:
        check_min(self, "clean.", 1, "max_tokens", "max_ratio")
        check(not self.comet_qe_min or bool(self.comet_qe), "clean.comet_qe_min",
              "needs clean.comet_qe=DIR (a CometKiwi model directory)")
        check(self.normalize in ("", "NFC", "NFKC", "NFD", "NFKD"), "clean.normalize",
              f"must be '', NFC, NFKC, NFD or NFKD, got {self.normalize!r}")
        check(self.invalid_utf8 in ("error", "skip"), "clean.invalid_utf8",
              f"must be 'error' or 'skip', got {self.invalid_utf8!r}")


@dataclass
class ShortlistConfig:
    """nmt-preprocess's lexical shortlist, DATA/shortlist.pt (search.shortlist;
    nmt.data.shortlist): per source piece its k best target pieces by sentence-level
    co-occurrence, plus the most frequent target pieces."""

    k: int = 0  # target pieces kept per source piece; 0 writes no shortlist
    frequent: int = 100  # the target pieces in the most training pairs, candidates always
    score: str = "dice"  # rank by dice, 2 c(s,t) / (c(s) + c(t)), or prob, c(s,t) / c(s)

    def __post_init__(self) -> None:
        check_min(self, "shortlist.", 0, "k", "frequent")
        check(self.score in ("dice", "prob"), "shortlist.score",
              f"must be dice or prob, got {self.score!r}")


@dataclass
class PreprocessConfig:
    """nmt-preprocess: raw parallel text in, a binarized data directory out."""

    src_lang: str = MISSING  # source language suffix, e.g. en
    tgt_lang: str = MISSING  # target language suffix, e.g. de
    # Inputs: PFX (files PFX.{src_lang} and PFX.{tgt_lang}, aligned by line), FILE.tsv
    # (source<TAB>target lines), hf:PATH (Dataset/DatasetDict.save_to_disk; a DatasetDict gives
    # the split train/validation/test after the role), hf:PATH:SPLIT, or with hf_name set
    # hf:SPLIT (datasets.load_dataset(hf_name, hf_config, split=SPLIT); "hf:" = role's split).
    # Text files may be compressed: PFX.{lang}.gz (or .bz2, .xz), FILE.tsv.gz.
    # train may also list several corpora, each an input or {path: INPUT, weight: W, tag: T,
    # name: N} (TrainCorpus): train=[PFX/real,{path:PFX/bt,tag:'<BT>',weight:0.5}]
    # Several language pairs (nmt.data.languages): every corpus of train, valid and test names its
    # own, {path: PFX, src_lang: en, tgt_lang: de}; src_lang and tgt_lang above then name the
    # data directory's two sides (its files train.{src_lang}.bin, ...), e.g. src and tgt.
    train: Any = MISSING  # the training split (SentencePiece is trained on it alone)
    valid: Any = ""  # the validation split, same forms as train (a list: each pair's); "": none
    test: Any = ""  # the test split, same forms as train (a list: each pair's); "": none
    out_dir: str = MISSING  # the data directory to write (atomically: temp dir, then rename)
    force: bool = False  # replace an existing out_dir (only a data directory, or an empty one)
    workers: int = 0  # encoding processes; 0 uses every core
    keep_text: bool = False  # keep the cleaned training text (train.subword_sampling, augment)
    hf_name: str = ""  # a hub dataset name for datasets.load_dataset (needs internet), e.g. wmt14
    hf_config: str = ""  # the hub dataset's configuration, e.g. de-en for wmt14
    bpe: BpeConfig = field(default_factory=BpeConfig)
    clean: CleanConfig = field(default_factory=CleanConfig)
    shortlist: ShortlistConfig = field(default_factory=ShortlistConfig)

    def __post_init__(self) -> None:
        check(self.src_lang != self.tgt_lang, "tgt_lang", "must differ from src_lang")
        check_min(self, "", 0, "workers")
        named = {role: corpora[0].src_lang != "" for role, corpora in self.corpora.items()}
        check(len(set(named.values())) <= 1, "valid" if "valid" in named else "test",
              "a multilingual train split needs each pair's valid and test corpora with "
              "src_lang and tgt_lang, and a bilingual one none")

    @property
    def train_corpora(self) -> list[TrainCorpus]:
        """The training corpora, checked (train_corpora)."""
        return train_corpora(self.train)

    @property
    def corpora(self) -> dict[str, list[TrainCorpus]]:
        """Each given split's corpora, checked: {"train": [...], "valid": [...], ...}."""
        return {role: train_corpora(value, role) for role, value in
                (("train", self.train), ("valid", self.valid), ("test", self.test)) if value}

    @property
    def multilingual(self) -> bool:
        """Whether the corpora name their language pairs."""
        return self.train_corpora[0].src_lang != ""


# ----------------------------------------------------------------------------- train
BEST_METRICS = ("loss", "ppl", "bleu", "chrf", "comet")  # comet, bleu, chrf: higher is better
# torch.compile's modes (train.compile_mode)
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


@dataclass
class AugmentConfig:
    """Robustness noise on the fly, after OpusTrainer's modifiers (nmt.wings.augment): each
    rate is the share of training pairs a modifier rewrites, drawn per pair and on its own,
    seeded by the batch's place in the data as subword sampling is (exact resumes). Needs
    nmt-preprocess keep_text=true. Tags (<2de>, <BT>, >>de<<, __KEEP1__) are left whole."""

    uppercase: float = 0.0  # share of pairs upper-cased, source and target
    titlecase: float = 0.0  # share of pairs with each word's first letter upper-cased, both sides
    drop_punctuation: float = 0.0  # share of pairs losing final punctuation (where both have it)
    typos: float = 0.0  # share of pairs given typos, on the source only
    typo_edits: int = 1  # typos per such source, each a letter swapped, deleted or repeated

    def __post_init__(self) -> None:
        for name in ("uppercase", "titlecase", "drop_punctuation", "typos"):
            check_rate(getattr(self, name), f"train.augment.{name}")
        check_min(self, "train.augment.", 1, "typo_edits")

    @property
    def active(self) -> bool:
        """Whether any modifier rewrites some pairs."""
        return any((self.uppercase, self.titlecase, self.drop_punctuation, self.typos))


@dataclass
class TrainLoopConfig:
    """Batching, stopping, checkpointing, validation, logging and hardware of nmt-train."""

    max_tokens: int = 4096  # per-device batch budget: max(B * S_max, B * T_max), padding counted
    # global_tokens > 0: each rank accumulates x = global_tokens / (world_size * t) batches per
    # update on average, t the mean target tokens (EOS included, padding not) of epoch 1's
    # batches: update u takes floor(u x) - floor((u - 1) x) of them, so fractional x is kept
    # on average. x < 1/1.1 (one batch per rank is more than 10% too many) is an error.
    global_tokens: int = 0  # target tokens wanted per update over all devices; sets update_freq
    update_freq: int = 1  # batches accumulated per update (ignored when global_tokens > 0)
    # Several training corpora (nmt-preprocess train=[...]): an epoch takes floor(w) copies
    # of each of a corpus's sentences and a random fraction w - floor(w) of them once more
    # (drawn anew each epoch), w its weight; so an epoch holds sum(w_i * n_i) sentences.
    corpus_weights: list[float] = field(default_factory=list)  # per corpus ([]: preprocess's)
    # A multilingual directory's language pairs share an epoch by fairseq's temperature
    # sampling, on top of the corpus weights: a pair of s sentences an epoch gets a share
    # proportional to s^(1/T) (nmt.data.batches.temperature_weights); bilingual data ignores it.
    temperature: float = 1.0  # T: 1 proportional to size, large T uniform over the pairs
    # BPE-dropout (Provilkov et al. 2020) on the fly: every batch's sentences are segmented
    # afresh, each merge skipped with this probability, seeded by the batch's place in the data
    # (resumes and rank counts see the same draws). Needs nmt-preprocess keep_text=true.
    # Batches are cut for max_tokens / (1 + 3 alpha) stored tokens, and a sampled side that
    # would push a batch past max_tokens keeps its stored segmentation.
    subword_sampling: float = 0.0  # BPE-dropout probability alpha at training time; 0: off
    # Upper/title case, dropped final punctuation and typos on a share of the pairs, on the
    # fly (OpusTrainer's modifiers); batches keep room for longer rows as subword sampling's.
    augment: AugmentConfig = field(default_factory=AugmentConfig)
    check_data: bool = False  # verify the data's checksums and ids at every start, not once
    # An update skipped on the device (non-finite loss or gradient, fp16 overflow) still counts
    # for max_updates, the intervals and checkpoint names (the host knows it without reading
    # the device); the learning-rate schedule and Adam count applied updates only.
    max_updates: int = 0  # stop after this many updates, skipped ones included (0: no limit)
    max_epochs: int = 0  # stop after this many epochs (0: no limit)
    max_minutes: float = 0.0  # stop after this much wall-clock time (0: no limit)
    save_interval_updates: int = 1000  # write checkpoint_<update>.pt this often
    keep_last: int = 5  # keep this many numbered checkpoints (0: all)
    valid_interval_updates: int = 1000  # validate this often (and at the end)
    valid_bleu: bool = False  # also translate the valid set greedily and score BLEU and chrF
    comet: str = ""  # with valid_bleu: a COMET-22 model directory also scores them (valid COMET)
    best_metric: str = "loss"  # checkpoint_best.pt by: loss, ppl, bleu, chrf or comet
    patience: int = 0  # stop after this many validations without improvement (0: never)
    seed: int = 1  # 0 <= seed < 2^63: model init, batch order (seed, epoch), dropout masks
    init_from: str = ""  # a new run starts from this checkpoint's weights (fresh optimizer/data)
    ema_decay: float = 0.0  # keep an exponential moving average of the weights (0: off)
    # auto (bf16 on GPUs with it, else fp16; none on CPUs), bf16_native (bf16 where the device
    # computes it natively, CPUs with AVX512-BF16 or AMX included; else none), bf16, fp16, none
    amp: str = "auto"
    tf32: bool = True  # TensorFloat-32 matmuls for fp32 work on Ampere and later GPUs
    # The update compiled (nmt/training/compiled_step.py): forward, loss and backward one graph
    # per batch shape, Adam fused; docs/training.md, "A compiled update". true, false, or auto:
    # compiled on GPUs and where a CPU run computes in bf16 (in fp32 Inductor's CPU kernels
    # gain nothing: docs/results.md, "Compiled training on the CPU")
    compile: str = "false"
    # Its shapes: static (every batch padded to one of train.buckets shapes fitted to the data:
    # a graph each, which CUDA graphs need), dynamic (one graph), auto: static on GPUs, dynamic
    # on CPUs (Inductor's build takes minutes a shape on 2 cores)
    shapes: str = "auto"
    buckets: int = 16  # static shapes: length buckets, each with rows max_tokens / length
    # torch.compile's mode: default, reduce-overhead (CUDA graphs of the static graphs),
    # max-autotune, max-autotune-no-cudagraphs
    compile_mode: str = "default"
    # Batch lengths padded to a multiple of this (fairseq's --required-seq-len-multiple; with
    # static shapes, the bucket lengths'); 0: none (the matrix products see B x L rows, and
    # 8 pads WMT-like batches 14-17% where 16 buckets of any length pad 11-14%)
    pad_to_multiple: int = 0  # round source and target lengths up to a multiple of this
    checkpoint_activations: bool = False  # recompute layers' activations in backward: less memory
    # A share of each GPU's memory (e.g. 0.9): train.max_tokens is lowered to the batch whose
    # update fits in it, from a probe of the first steps (nmt/training/batch_memory.py); 0: off
    gpu_memory: float = 0.0
    device: str = "auto"  # "auto", "cpu" or "cuda"
    collective_timeout: float = 600.0  # seconds a rank waits for the others before failing
    log_interval: int = 50  # updates between log lines (GPU statistics are read only then)
    max_nonfinite: int = 10  # stop after this many consecutive non-finite losses
    threads: int = 0  # CPU threads for torch (0: torch's default)
    valid_bleu_max_sentences: int = 0  # translate only the first N valid sentences (0: all)
    valid_refs: list[str] = field(default_factory=list)  # more valid references, line-aligned
    bleu_tokenize: str = "13a"  # sacreBLEU tokenizer of valid BLEU: 13a, intl, zh, ja-mecab, none
    tensorboard: bool = True  # also log to RUN/tensorboard when tensorboard is installed
    plot: bool = True  # draw RUN/curves.png at every validation when matplotlib is installed

    def __post_init__(self) -> None:
        check_min(self, "train.", 1, "max_tokens", "update_freq", "max_nonfinite",
                   "save_interval_updates", "valid_interval_updates", "log_interval", "buckets")
        check(self.shapes in ("auto", "static", "dynamic"), "train.shapes",
              f"must be auto, static or dynamic, got {self.shapes!r}")
        self.compile = str(self.compile).lower()  # train.compile=true comes as a bool
        check(self.compile in ("true", "false", "auto"), "train.compile",
              f"must be true, false or auto, got {self.compile!r}")
        check(self.compile_mode in COMPILE_MODES, "train.compile_mode",
              f"must be {', '.join(COMPILE_MODES)}, got {self.compile_mode!r}")
        check_min(self, "train.", 0, "pad_to_multiple", "global_tokens", "max_updates",
                   "max_epochs", "max_minutes", "keep_last", "patience", "threads",
                   "valid_bleu_max_sentences")
        check(0 <= self.seed < 2 ** 63, "train.seed", f"must be in [0, 2^63), got {self.seed}")
        check_prob(self.ema_decay, "train.ema_decay")
        check_prob(self.gpu_memory, "train.gpu_memory")
        check_prob(self.subword_sampling, "train.subword_sampling")
        check(self.temperature >= 1, "train.temperature",
              f"must be >= 1, got {self.temperature}")
        for i, weight in enumerate(self.corpus_weights):
            check(weight >= 0, f"train.corpus_weights[{i}]", f"must be >= 0, got {weight}")
        check(self.collective_timeout > 0, "train.collective_timeout",
              f"must be > 0, got {self.collective_timeout}")
        check(self.best_metric in BEST_METRICS, "train.best_metric",
              f"must be loss, ppl, bleu, chrf or comet, got {self.best_metric!r}")
        check(self.best_metric in ("loss", "ppl") or self.valid_bleu, "train.best_metric",
              f"{self.best_metric} needs train.valid_bleu=true")
        check(self.best_metric != "comet" or bool(self.comet), "train.best_metric",
              "comet needs train.comet=DIR (a COMET-22 model directory)")
        check(not self.comet or self.valid_bleu, "train.comet", "needs train.valid_bleu=true")
        check(self.amp in ("auto", "bf16_native", "none", "bf16", "fp16"), "train.amp",
              f"must be auto, bf16_native, none, bf16 or fp16, got {self.amp!r}")
        check(self.device in ("auto", "cpu", "cuda"), "train.device",
              f"must be auto, cpu or cuda, got {self.device!r}")
        check(not self.valid_refs or self.valid_bleu, "train.valid_refs",
              "needs train.valid_bleu=true")


@dataclass
class TrainConfig:
    """nmt-train: a data directory in, a run directory of checkpoints and logs out."""

    data_dir: str = MISSING  # written by nmt-preprocess
    run_dir: str = MISSING  # checkpoints, metrics.jsonl and config.yaml go here; resumes if present
    model: ModelConfig = MISSING  # chosen with +model=small|base|big
    optim: OptimConfig = MISSING  # set by the same +model=... file (the paper's training row)
    train: TrainLoopConfig = field(default_factory=TrainLoopConfig)
    search: SearchConfig = field(default_factory=lambda: SearchConfig(beam_size=1))  # valid BLEU

    def __post_init__(self) -> None:
        if self.train.valid_bleu:
            check_search_device(self.search.dtype, self.train.device)
        check(not self.optim.cooldown or bool(self.train.max_updates or self.train.max_minutes),
              "optim.cooldown", "needs a budget: train.max_updates or train.max_minutes")
        check(self.search.compile != "true", "search.compile",
              "is nmt-translate's and nmt-serve's: validation decodes new weights each time")
        self.search.compile = "false"  # auto too: a package of each validation's weights


# ----------------------------------------------------------------------------- translate
MBR_UTILITIES = ("chrf", "bleu")  # sacreBLEU's utilities of nmt.wings.mbr (nmt-serve's too)
MBR_MAX_CANDIDATES = 32


@dataclass
class MbrConfig:
    """Minimum Bayes risk selection (nmt.wings.mbr), nmt-translate's and nmt-serve's: of N
    candidates per line, the one of highest expected utility against the others is written."""

    candidates: int = 0  # N: search.sampling's N samples, else beam search's N-best (0: off)
    utility: str = "chrf"  # chrf, bleu (sacreBLEU's sentence scores), comet (nmt-translate comet=)
    aggregate: bool = False  # chrf: against the others' mean n-gram counts, linear in N

    def __post_init__(self) -> None:
        check(self.candidates == 0 or 2 <= self.candidates <= MBR_MAX_CANDIDATES,
              "mbr.candidates", f"must be 0 (off) or 2 to {MBR_MAX_CANDIDATES}, "
              f"got {self.candidates}")
        check(self.utility in (*MBR_UTILITIES, "comet"), "mbr.utility",
              f"must be chrf, bleu or comet, got {self.utility!r}")
        check(not self.aggregate or self.utility == "chrf", "mbr.aggregate",
              f"is chrF's reference aggregation: needs mbr.utility=chrf, not {self.utility}")


@dataclass
class RerankConfig:
    """nmt-translate's reranking of search.nbest hypotheses: the one of highest forward
    log P(Y|X) + reverse log P(X|Y) + length |Y| is written (nmt.wings.rerank)."""

    model: str = ""  # a reverse (target-to-source) checkpoint: log P(X|Y) of each pair ("": off)
    forward: float = 1.0  # weight of log P(Y|X), the translating model's
    reverse: float = 1.0  # weight of log P(X|Y), the reverse model's
    length: float = 0.0  # weight of |Y| in pieces, EOS counted (> 0: a bonus against short ones)


@dataclass
class TranslateConfig:
    """nmt-translate: a checkpoint and raw text in, detokenized translations out."""

    checkpoint: Any = MISSING  # nmt-train's or nmt-average's; [A.pt,B.pt,...]: an ensemble
    input: str = "-"  # raw source text, a sentence a line; "-": stdin (a pipe: line by line)
    output: str = "-"  # translations, one a line, in input order; "-" is standard output
    ref: str = ""  # reference translations: print sacreBLEU BLEU and chrF
    # A COMET model directory (nmt.wings.comet): a COMET-22 one prints COMET beside BLEU
    # and chrF (needs ref=) and is mbr.utility=comet's; a CometKiwi one adds a column of each
    # line's reference-free score (translation<TAB>score) and prints their mean.
    comet: str = ""
    refs: list[str] = field(default_factory=list)  # more reference files (adds to ref)
    bleu_tokenize: str = "13a"  # sacreBLEU's BLEU tokenizer: 13a, intl, zh, ja-mecab, none, char
    max_input_tokens: int = 1000  # longer inputs are truncated with a warning
    device: str = "auto"  # "auto", "cpu" or "cuda"
    workers: int = 0  # one-thread CPU processes translating batches in parallel (0: one per core)
    threads: int = 0  # PyTorch threads when workers=1 (0: PyTorch's default)
    # engine=ctranslate2: workers and threads are its inter_threads and intra_threads
    attention_plot: str = ""  # write attention heatmaps (PNG) for one input line to this directory
    attention_line: int = 1  # which input line (1-based) attention_plot draws
    vocab_check: str = ""  # data dir, its manifest.json or a .model: the checkpoint must match it
    weights: str = "auto"  # "model", "ema" (train.ema_decay's average) or "auto" (ema if saved)
    quiet: bool = False  # no progress bar, summary or truncation warnings on stderr
    prefix: bool = False  # input lines are source<TAB>prefix; translations start with the prefix
    constraints: str = ""  # FILE: per input line, TAB-separated phrases its translation must hold
    glossary: str = ""  # FILE of source<TAB>target terms; a source's terms constrain its output
    keep: str = ""  # FILE of terms, one a line, copied byte for byte where a source holds them
    score_reference: bool = False  # score given targets (ref=FILE or source<TAB>target lines)
    alignment: bool = False  # add a column of source-target piece links (Pharaoh: 0-0 1-2 ...)
    alignment_layer: int = -1  # decoder layer whose heads' mean attention aligns (-1: the last)
    word_scores: bool = False  # add a column of each target word's probability (word|0.93 ...)
    word_combine: str = "product"  # a word's probability from its pieces': product or min
    engine: str = "nmt"  # decode with "nmt" or "ctranslate2" (the checkpoint's export, cached)
    ct2_model: str = ""  # engine=ctranslate2: the export's folder ("": CHECKPOINT.ct2/ beside it)
    split: str = "auto"  # none|sentence|paragraph (segment.py); auto: segment.auto_mode's rule
    split_lang: str = ""  # split=sentence|auto: the source language, ISO 639 (""; the checkpoint's)
    markup: str = "none"  # html|xml: each line's tags kept inside whole sentences (markup.py)
    placeholders: bool = False  # markup=xml: {0}-style placeholders are void tags too
    # A multilingual checkpoint's languages (nmt.data.languages): names it records, e.g. de,
    # deu_Latn
    src_lang: str = ""  # the language of the input (M2M100, NLLB-200 need it); "": none
    tgt_lang: str = ""  # the language to translate into (a multilingual model's choice)
    search: SearchConfig = field(default_factory=SearchConfig)
    mbr: MbrConfig = field(default_factory=MbrConfig)  # choose among candidates by MBR
    rerank: RerankConfig = field(default_factory=RerankConfig)  # or rerank the n-best

    @property
    def checkpoints(self) -> list[str]:
        """The checkpoint paths: one, or an ensemble's."""
        return [self.checkpoint] if isinstance(self.checkpoint, str) else list(self.checkpoint)

    def __post_init__(self) -> None:
        ok = isinstance(self.checkpoint, str) or (
            isinstance(self.checkpoint, list | tuple) and len(self.checkpoint) > 0
            and all(isinstance(c, str) for c in self.checkpoint))
        check(ok, "checkpoint", "must be a path or a list of paths: checkpoint=[A.pt,B.pt]")
        check(not (self.prefix and self.score_reference), "prefix",
              "prefix=true and score_reference=true do not go together")
        for key in CONSTRAINING:
            check(not (getattr(self, key) and self.score_reference), key,
                   f"{key}=... and score_reference=true do not go together")
            check(not (getattr(self, key) and self.search.sampling), key,
                   "need beam search, not search.sampling=true")
        check_min(self, "", 1, "max_input_tokens", "attention_line")
        check_min(self, "", 0, "threads", "workers")
        check(self.device in ("auto", "cpu", "cuda"), "device",
              f"must be auto, cpu or cuda, got {self.device!r}")
        check(self.weights in ("auto", "model", "ema"), "weights",
              f"must be auto, model or ema, got {self.weights!r}")
        check(self.word_combine in WORD_COMBINES, "word_combine",
              f"must be {' or '.join(WORD_COMBINES)}, got {self.word_combine!r}")
        check_engine(self, len(self.checkpoints))
        check_split(self)
        check_markup(self)
        check_choice(self)


# ----------------------------------------------------------------------------- average
@dataclass
class AverageConfig:
    """nmt-average: several checkpoints in, one model-only checkpoint out."""

    output: str = MISSING  # the averaged checkpoint to write
    run_dir: str = ""  # pick the last `last` numbered checkpoints of this run, by update number
    last: int = 5  # how many checkpoints to average from run_dir
    inputs: list[str] = field(default_factory=list)  # or average exactly these files

    def __post_init__(self) -> None:
        check(bool(self.run_dir) != bool(self.inputs), "run_dir",
              "give either run_dir=... (with last=N) or inputs=[...], not both or neither")
        check_min(self, "", 1, "last")


# ----------------------------------------------------------------------------- export
CT2_QUANTIZATIONS = ("", "int8", "int8_float32", "int8_float16", "int8_bfloat16", "int16",
                     "float16", "bfloat16", "float32")


@dataclass
class ExportConfig:
    """nmt-export: a checkpoint in, a CTranslate2, Hugging Face transformers or ONNX
    (transformers.js) model out."""

    checkpoint: str = MISSING  # a checkpoint written by nmt-train or nmt-average
    output: str = MISSING  # the model directory to write (atomically: temp dir, then rename)
    # "ctranslate2", "transformers" (MarianMT; Pegasus if pre-norm) or "onnx" (transformers.js's
    # layout: ONNX encoder and merged decoder, fp32 and int8, tokenizer.json)
    format: str = "ctranslate2"
    quantization: str = ""  # ctranslate2 only: stored weight type, e.g. int8 ("": float32)
    force: bool = False  # replace an existing output (only a model directory, or an empty one)
    shortlist: str = ""  # ctranslate2: a shortlist FILE, written as vmap.txt (for use_vmap)
    # onnx: a folder where `npm install @huggingface/transformers` ran, whose transformers.js
    # and ONNX Runtime WebAssembly files the page's runtime/ gets ("": the page without them)
    web_runtime: str = ""

    def __post_init__(self) -> None:
        check(not self.shortlist or self.format == "ctranslate2", "shortlist",
              "applies to format=ctranslate2 only")
        check(not self.web_runtime or self.format == "onnx", "web_runtime",
              "applies to format=onnx only")
        check(self.format in ("ctranslate2", "transformers", "onnx"), "format",
              f"must be ctranslate2, transformers or onnx, got {self.format!r}")
        check(self.quantization in CT2_QUANTIZATIONS, "quantization",
              f"must be one of {', '.join(q for q in CT2_QUANTIZATIONS if q)}, "
              f"got {self.quantization!r}")
        check(not self.quantization or self.format == "ctranslate2", "quantization",
              "applies to format=ctranslate2 only")


# ----------------------------------------------------------------------------- import
@dataclass
class ImportConfig:
    """nmt-import: a Hugging Face MarianMT, M2M100 or NLLB-200 directory, or a CTranslate2
    model directory (an Argos package's), in; an nmt checkpoint out."""

    input: str = MISSING  # the model directory (config.json, the weights, the tokenizer's files)
    output: str = MISSING  # the checkpoint to write (atomically)
    force: bool = False  # replace an existing output
    # CTranslate2 input: its SentencePiece models (default: source.spm and target.spm beside
    # model.bin, or sentencepiece.model there or in the Argos package); tgt_spm: src_spm's
    src_spm: str = ""
    tgt_spm: str = ""

    def __post_init__(self) -> None:
        check(bool(self.src_spm) or not self.tgt_spm, "tgt_spm", "needs src_spm")


# ----------------------------------------------------------------------------- serve
@dataclass
class ServeConfig:
    """nmt-serve: a checkpoint behind an HTTP endpoint that batches concurrent requests."""

    checkpoint: str = ""  # a checkpoint written by nmt-train or nmt-average (or models=DIR)
    # models=DIR: every model in DIR served at once (nmt.serve.models; "argos": argostranslate's
    # package folder), each pair routed to its model, or through English (pivot)
    models: str = ""
    pivot: bool = True  # models=: a pair no model covers goes through English where it can
    preload: bool = False  # models=: load every model at start (else each on its first use)
    max_models: int = 0  # models=: loaded at most (0: no limit); the least recently used goes
    memory_gb: float = 0.0  # models=: loaded models' size on disk at most (0: no limit)
    host: str = "127.0.0.1"  # address to listen on (0.0.0.0: every interface)
    port: int = 8000  # TCP port to listen on (0: any free port, printed at start)
    device: str = "auto"  # "auto", "cpu" or "cuda"
    workers: int = 0  # CPU: one-thread decoding processes (0: one per core; 1: a thread here)
    threads: int = 0  # PyTorch threads of the decoding thread when workers=1 (0: the default)
    # engine=ctranslate2: workers and threads are its inter_threads and intra_threads
    vocab_check: str = ""  # data dir, its manifest.json or a .model: the checkpoint must match it
    continuous: bool = False  # sentences join running batches at any decoding step (else batches)
    max_wait_ms: float = 5.0  # continuous=false: a sentence waits this long at most for batch mates
    max_input_tokens: int = 1000  # longer inputs are truncated (flagged in the response)
    # A request's limits let a 100 KB HTML page through whole (markup: max_chars counts the
    # text outside tags and untranslated elements; real pages of 94 KB: 16,000 and 485 pieces)
    max_sentences: int = 2048  # pieces per request at most, once split (413 beyond)
    max_chars: int = 100000  # characters per request at most, all texts together (413 beyond)
    max_queued: int = 4096  # sentences waiting for a batch at most (503 + Retry-After beyond)
    timeout_s: float = 60.0  # a request not answered within this many seconds gets a 504
    max_beam_size: int = 16  # the largest beam_size (and nbest) a request may ask for
    max_len_b: int = 256  # the largest max_len_b and min_len a request may ask for
    access_log: bool = True  # log one line per HTTP request (uvicorn's access log)
    log_level: str = "info"  # uvicorn's log level: debug, info, warning or error
    engine: str = "nmt"  # decode with "nmt" or "ctranslate2" (the checkpoint's export, cached)
    ct2_model: str = ""  # engine=ctranslate2: the export's folder ("": CHECKPOINT.ct2/ beside it)
    split: str = "auto"  # none|sentence|paragraph (segment.py); auto: sentence if src_lang
    src_lang: str = ""  # the model's source language, ISO 639 (split=sentence, LibreTranslate)
    tgt_lang: str = ""  # the model's target language, ISO 639 (LibreTranslate's API)
    api_keys: str = ""  # a file of API keys, one a line, re-read on change: each request needs one
    # an nmt-export format=onnx folder (written with web_runtime=): its page at /offline/,
    # which translates in the browser (nmt.serve.offline)
    offline: str = ""
    glossary: str = ""  # FILE of source<TAB>target terms for every request (as nmt-translate)
    keep: str = ""  # FILE of terms every request copies byte for byte (as nmt-translate's keep)
    max_glossary: int = 256  # a request's glossary and keep entries together at most (422 beyond)
    comet: str = ""  # a COMET-22 model directory: MBR may use mbr.utility=comet (as nmt-translate)
    search: SearchConfig = field(default_factory=SearchConfig)  # defaults; batch token budget
    mbr: MbrConfig = field(default_factory=MbrConfig)  # MBR's defaults (a request's mbr_* fields)

    def __post_init__(self) -> None:
        check(0 <= self.port <= 65535, "port", f"must be in [0, 65535], got {self.port}")
        check(self.device in ("auto", "cpu", "cuda"), "device", "must be auto, cpu or cuda")
        check_serve_models(self)
        for key in ("workers", "threads", "max_wait_ms"):
            check(getattr(self, key) >= 0, key, "must be >= 0")
        for key in ("max_input_tokens", "max_sentences", "max_chars", "max_queued",
                    "max_beam_size", "max_glossary"):
            check(getattr(self, key) >= 1, key, "must be >= 1")
        check(self.max_len_b >= 0, "max_len_b", "must be >= 0")
        check(self.timeout_s > 0, "timeout_s", "must be > 0")
        check(self.max_queued >= self.max_sentences, "max_queued",
              f"must be >= max_sentences ({self.max_sentences}): a full request must fit")
        check(self.search.beam_size <= self.max_beam_size, "search.beam_size",
              f"must be <= max_beam_size ({self.max_beam_size})")
        check(self.search.max_len_b <= self.max_len_b, "search.max_len_b",
              f"must be <= max_len_b ({self.max_len_b})")
        check(self.log_level in ("debug", "info", "warning", "error"), "log_level",
              f"must be debug, info, warning or error, got {self.log_level!r}")
        check_engine(self, 1)
        sampling = self.search.sampling or (
            self.mbr.candidates and candidate_search(self.search, self.mbr).sampling)
        ENGINES[self.engine].check("search.sampling", sampling)
        for key in ("glossary", "keep"):
            check(not (getattr(self, key) and sampling), key,
                   "need beam search, not search.sampling=true")
        check_serve_split(self)
        check(self.mbr.utility != "comet" or bool(self.comet), "mbr.utility",
              "comet needs comet=DIR (a COMET-22 model directory)")
        check(not self.mbr.candidates or self.search.nbest == 1, "mbr.candidates",
              f"answers one translation per text: leave search.nbest at 1, "
              f"got {self.search.nbest}")


# ----------------------------------------------------------------------------- Hydra glue
SCHEMAS = {
    "preprocess_schema": PreprocessConfig,
    "train_schema": TrainConfig,
    "translate_schema": TranslateConfig,
    "average_schema": AverageConfig,
    "export_schema": ExportConfig,
    "import_schema": ImportConfig,
    "serve_schema": ServeConfig,
}


def register_configs(*names: str) -> None:
    """Store the schemas `names` (of SCHEMAS; all where none is named) in Hydra's ConfigStore
    so that the YAML files are checked against them. A command stores its own only: each
    store builds its schema's OmegaConf node, a few milliseconds of every command's startup."""
    from hydra.core.config_store import ConfigStore
    cs = ConfigStore.instance()
    for name in names or SCHEMAS:
        cs.store(name=name, node=SCHEMAS[name])


def to_object(cfg: DictConfig, schema: type):
    """Convert a composed config to its dataclass, running every validation once."""
    from omegaconf import DictConfig, OmegaConf, errors
    if isinstance(cfg, schema):
        return cfg
    if not isinstance(cfg, DictConfig):
        cfg = OmegaConf.create(cfg)
    if "model" in cfg.keys() and OmegaConf.is_missing(cfg, "model"):
        add = "add +model=small (or +model=tiny, +model=base, +model=big)"
        raise ConfigError("model", f"none chosen: {add}", line=f"no model chosen: {add}")
    extra = extra_keys(cfg, schema)
    if extra:  # added with +key=... or ++key=..., which Hydra allows
        raise unknown_key(extra[0], schema)
    try:
        merged = OmegaConf.merge(OmegaConf.structured(schema), cfg)
        return OmegaConf.to_object(merged)
    except errors.OmegaConfBaseException as e:
        raise explain(e, schema) from None


def compose(name: str, overrides: list[str] | None = None) -> DictConfig:
    """Compose configs/<name>.yaml with command-line style overrides, as the CLI would."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_module

    register_configs()
    with initialize_config_module("nmt.configs", version_base="1.3"):
        return hydra_compose(config_name=name, overrides=list(overrides or []))
