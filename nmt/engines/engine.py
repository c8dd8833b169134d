"""The engine interface: what nmt-translate, nmt-serve, alignments, attention plots and the
benchmarks decode through (`open_translator`, the one switch between the engines, is the front
ends': nmt.inference.engines, since CTranslate2's engine is a wing).

Two engines implement it: nmt's own Translator (engine=nmt, nmt.engines.translator) and
CTranslate2's (engine=ctranslate2, nmt.wings.ctranslate2). What an engine cannot do is
stated once, in its `capabilities` (nmt.capabilities): the configs refuse it before
loading, the engine again when it is asked, each a one-line ConfigError naming the key.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol, runtime_checkable

import torch
from torch import Tensor

from nmt.capabilities import Capabilities
from nmt.config import SearchConfig
from nmt.data.tokenizer import Specials, Tokenizer, check_same_vocabulary
from nmt.data.vocab import Vocab
from nmt.decoding.messages import Hypothesis


@runtime_checkable
class Workers(Protocol):
    """An engine's workers running nmt-serve's loops (Engine.stepper): what nmt-serve's Batcher,
    its warm-up and its health check use of them. nmt's WorkerPool (nmt.engines.workers)
    is the one implementation, for both engines."""

    workers: int  # loops, one inbox each
    processes: bool  # the loops run in forked processes (else in threads of this one)

    def send(self, worker: int, message) -> None:
        """Put a message (a Batch, or STOP) in a worker's inbox."""

    def read(self, timeout: float | None = None):
        """The next message any loop put in the outbox; queue.Empty after `timeout` seconds."""

    def dead(self) -> str:
        """Why the loops cannot run any more; "" while they all run."""

    def close(self) -> None:
        """Stop the loops, then the workers."""


class Engine(Protocol):
    """A loaded model (or ensemble) that decodes id lists: nmt's Translator or CTranslate2's.

    Each also has `load` (a classmethod: checkpoints, device, weights, dtype, workers,
    threads) and works as a context manager (closing it)."""

    capabilities: Capabilities  # what it can do; it refuses the rest
    src_tok: Tokenizer  # the source SentencePiece model
    tgt_tok: Tokenizer  # the target SentencePiece model
    specials: Specials  # the target's BOS, EOS and PAD ids
    vocab: Vocab  # the checkpoint's vocabulary (sizes, special ids, sha256)
    device: torch.device  # where it decodes
    workers: int  # batches it decodes at once

    @property
    def max_input_tokens(self) -> int:
        """The longest source (EOS excluded) it can take."""

    @property
    def decoder_layers(self) -> int:
        """The decoder layers whose attention `attention` returns (0: it returns none)."""

    def ready(self, search: SearchConfig) -> object:
        """Build what `search` compiles once per machine before the workers first need it (a
        request would wait for it)."""

    def batch_sentences(self, search: SearchConfig) -> int:
        """The most sentences nmt-serve's dynamic batcher puts in one batch of `search`: as
        many as the workers' fastest loop takes (0: any number)."""

    def translate_ids(self, src_ids: list[list[int]], search: SearchConfig,
                      prefixes: list[list[int]] | None = None, lines: list[int] | None = None,
                      progress=None, parallel: bool = True,
                      constraints: list[list[list[int]]] | None = None, scores: bool = True
                      ) -> list[list[Hypothesis]]:
        """search.nbest hypotheses of each id list (no BOS/EOS), in input order; prefixes:
        forced output starts; lines: input line numbers (seeds); progress: called with each
        batch's size; parallel=False: in the calling thread; constraints: phrases per line;
        scores=False: the hypotheses' scores may be left NaN (what the caller does not write
        need not be computed: greedy search skips the log-softmax)."""

    def score_ids(self, src_ids: list[list[int]], tgt_ids: list[list[int]],
                  search: SearchConfig, progress=None, parallel: bool = True
                  ) -> list[Hypothesis]:
        """log P(Y|X) and the search's score of each (source, target) pair of id lists."""

    def attention(self, src_ids: list[list[int]], out_ids: list[list[int]]
                  ) -> dict[str, Tensor]:
        """Teacher-forced attention weights per kind, (B, N, h, T_q, T_k) each."""

    def stepper(self) -> Workers:
        """The workers running nmt-serve's loops (nmt.decoding.stepping), started once."""

    def close(self) -> None:
        """Stop its workers."""


def check_vocab(engine: Engine, against: str, checkpoint: str) -> None:
    """vocab_check=... (nmt-translate, nmt-serve): a data directory, its manifest.json or a
    .model file must match the engine's vocabulary."""
    path = Path(against)
    if path.suffix == ".model":
        theirs, ours = Tokenizer.from_file(path).sha256, engine.src_tok.sha256
    else:
        from nmt.data.manifest import MANIFEST, read_manifest

        manifest = read_manifest(path.parent if path.name == MANIFEST else path)
        theirs, ours = manifest.vocab_sha256, engine.vocab.sha256
    check_same_vocabulary(ours, theirs, checkpoint, str(path))
