"""What goes into a decoding and what comes out, and what nmt-serve's Batcher and the decoding
workers' loops (nmt.decoding.stepping) send each other: plain dataclasses, no torch, so that
the Batcher imports them without PyTorch and process queues pickle them."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from nmt.config import SearchConfig

STOP = None  # put in a worker's inbox: its loop ends
# continuous batching: newcomers join a worker's running decoding in groups of this many where
# as many are live (each join encodes them and remakes the rows' view): the Batcher sends them
# so, a worker's loop admits them so (nmt.decoding.stepping)
ADMIT_GROUP = 4
# continuous batching: a worker holds up to this many sentences beyond the most its decoding
# takes (Batch.most), waiting in its loop to join as others end, so that no row stays empty
# while the server answers and sends the next ones
RESERVE = 2 * ADMIT_GROUP


@dataclass
class Hypothesis:
    """A finished output: ids without BOS/EOS, its length-normalised score, its log P(Y|X) and
    each output token's log P (from the search itself; EOS's is log P less their sum)."""

    tokens: list[int]
    score: float
    logprob: float
    # one per token (None: the engine gives none); not compared: it follows from the rest
    token_logprobs: list[float] | None = field(default=None, compare=False)


@dataclass
class Sentence:
    """One sentence to decode: what comes back with its hypotheses (`tag`), its source ids (no
    BOS/EOS), forced prefix ids, phrases every output must contain and input line number
    (which seeds its samples); or, to be scored or aligned instead (pair scoring, teacher
    forcing), its whole target's ids (no BOS/EOS)."""

    tag: object
    src: list[int]
    prefix: list[int] = field(default_factory=list)
    phrases: list[list[int]] = field(default_factory=list)
    line: int = 0
    target: list[int] = field(default_factory=list)


def search_key(search: SearchConfig) -> tuple:
    """What two sentences must share to be decoded in one batch: every search setting (its
    fields' values in order: numbers and strings, not copied as asdict's would be)."""
    return tuple(getattr(search, f.name) for f in fields(search))


@dataclass
class Batch:
    """Sentences of one search setting sent to a worker together: newcomers that join its
    live decoding at the next step (continuous batching), or a whole batch decoded apart, over
    its own shortlist (whole=True: dynamic batching, nmt-translate's batches)."""

    search: SearchConfig
    sentences: list[Sentence]
    whole: bool = False
    # newcomers: the most sentences the worker decodes at once (0: any); the rest wait to join
    most: int = 0


@dataclass
class Ended:
    """A sentence that ended (its Sentence's tag) and its search.nbest hypotheses, best first."""

    tag: object
    hypotheses: list[Hypothesis]


@dataclass
class Done:
    """A worker's message: these sentences ended."""

    worker: int
    results: list[Ended]


@dataclass
class Failed:
    """A worker's message: these sentences cannot be decoded (the error, or its text when it
    cannot be pickled)."""

    worker: int
    tags: list
    error: Exception
