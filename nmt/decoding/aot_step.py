"""A decoding step of a few rows, and the encoder of a few sources, compiled ahead of time:
search.compile's int8 at the sizes where a call's fixed cost is its time (one sentence, a beam,
a few sentences, a server's few requests; issue 60, item 1).

The step: the rows' tokens embedded (FastModel.embed_rows), FastModel.step_layers, and greedy's
choice (nmt::top_k of one, the banned columns skipped) for 1 to `most_rows` rows (as many as
every map of the step gives nmt::int8_rows: 32 on the demo's model with VNNI, and 64 without
VNNI or with AMX's tiles, WIDE_STEP_ROWS), exported with torch.export (the rows, the caches'
buffer rows and positions, the memory's sentences and source length dynamic). The encoder:
FastModel's encoder layers and every decoder layer's keys and values of the memory, for 1 to
ENCODER_SOURCES sources of 2 to `encoder_rows` positions, padded (at most that many in all; a
batch of more, or of unlike lengths, in up to ENCODER_CALLS such calls:
PackagedEncoder.chunks). Each is compiled by AOTInductor into a package once per machine, model
and code: a file under $XDG_CACHE_HOME/nmt/steps (~/.cache by default) named by a hash of the
weights, the precision, the rows, this torch, ISA and CPU kind (Inductor compiles for the CPU
it runs on), the part and the sources it runs (package_key). Each process loads it on its first
call (milliseconds; after the workers fork). Inside, the int8 maps are nmt::int8_rows,
attention nmt::one_query_attention and the choice nmt::top_k, the operators eager calls,
through the package's proxy executor; the embedding, norms, additions and reshapes are
Inductor's C++. The step replaces ~90 operators called from Python: 1.4-3.6x eager's step at 16
to 1 rows (docs/results.md, "A decoding step through AOTInductor", "Packages of a few rows"),
and greedy's embedding, bans and maximum around it (15% of a token at one row, "Greedy's choice
inside the package"); the encoder's ~7% of a token at batch 1 ("The encoder of one source in a
package"), and a fifth of the encoder's time at a few sources ("The encoder of a few sources in
a package"). A beam loop's step has a package of its own (BeamGraph: the last step's reorder of
the cache tables, the step, and the beam's choice, nmt::beam_top_k, for any beam of 2 or more;
built when a beam search first asks): ~18% of a token of beam 4 at batch 1 ("The beam's step in
one package"). Greedy search and a beam run GREEDY_STEPS / BEAM_STEPS steps a call too
(GreedyGraph, BeamStepsGraph: each step's bans its own, the rows that go on chosen inside as
the host chooses them; "Greedy steps four at a time"). All give eager's choices
(tests/unit/test_aot_step.py).
"""

from __future__ import annotations

import hashlib
import os
import platform
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import torch
from torch import Tensor, nn
from torch.export import Dim

from nmt.decoding import affine, attention_op, fast_state
from nmt.decoding.fast_state import StepRows
from nmt.decoding.strategies import BeamStep, Choice, eos_last
from nmt.model import additive_mask
from nmt.system import private_ops

# Without VNNI (the quads' layout), and with AMX's tiles, a package takes steps of this many rows
# at least (its maps given int8_rows past few_rows: give_rows): at 16 rows of the demo's model
# under AVX2 int8_rows' maps cost ~8 us more than fbgemm's, at 64 rows its output map ~7% more
# than oneDNN's, and the package saves ~90 operators' calls (docs/results.md, "int8 maps of a
# few rows under AVX2", "A package of up to 64 rows without VNNI"); through AMX's tiles its
# output map at 64 rows takes 0.77x oneDNN's time ("int8 maps through AMX's tiles")
WIDE_STEP_ROWS = 64
# ... and its encoder this many positions of all its sources together (within the model's): a
# batch with a longer source is encoded eager whole (18.6-37.6 ms a batch of 4 test sources of
# 122-276 pieces, against 3-5 ms for one of 251 through the package; docs/results.md, "A
# sentence's fixed cost, and long sources in the encoder's package")
WIDE_ENCODER_ROWS = 256
ENCODER_SOURCES = 4  # the encoder's package takes batches of 1 to this many sources
# ... and encodes a batch in at most this many calls, its groups of like length in chunks
# (0.80-0.87x eager's time at 2-8 sources; more calls: as slow as eager's larger products;
# docs/results.md, "Fewer calls around the step")
ENCODER_CALLS = 4
# greedy search's package (GreedyGraph) takes this many steps a call: the Python between two
# steps runs with caches the step's weights have flushed (~3 us for a line that takes 0.6
# after it), ~50 us a step at one row; 1.16x / 1.20x / 1.19x greedy's time at one row for 2,
# 4, 8 steps (docs/results.md, "Greedy steps four at a time")
GREEDY_STEPS = 4
BEAM_STEPS = 4  # ... and beam search's (BeamStepsGraph), for the same reason
SOURCES = [Path(__file__), Path(affine.__file__), Path(fast_state.__file__),
           Path(__file__).with_name("fast_model.py")]  # the code the step runs


class StepOut(NamedTuple):
    """A packaged step's outputs."""

    logits: Tensor  # (B, 1, V) the rows' next tokens' logits
    best: Tensor  # (B,) each row's largest logit outside the banned columns
    token: Tensor  # (B,) its first column (strategies.row_max's, after the bans)


class StepGraph(nn.Module):
    """FastModel's step of B rows from their tokens as a function of flat tensors: tokens (B,)
    (embedded inside, FastModel.embed_rows), StepRows' tensors but `end` (where + 1 for every
    row, made inside; the rows' memory rows (B,) expanded inside), the columns the choice bans
    (V,) bool, each layer's (k, v, table) and (k, v) of the memory; returns StepOut's tensors,
    the caches written at `where`."""

    def __init__(self, fast):
        super().__init__()
        self.fast = [fast]  # not a submodule: its tensors become the package's constants
        self.layers = len(fast.decoder)

    def forward(self, tokens: Tensor, start: Tensor, memory_row: Tensor, zero: Tensor,
                source: Tensor, where: Tensor, banned: Tensor, kv: list[Tensor],
                mem: list[Tensor]) -> tuple[Tensor, Tensor, Tensor]:
        """The logits of the rows' next tokens, and each row's best allowed one."""
        logits = self.logits(tokens, start, memory_row, zero, source, where, kv, mem)
        # strategies.row_max's after the bans (B, 1) each, without a banned copy of the logits
        best, token = torch.ops.nmt.top_k(logits[:, 0], 1, banned)
        return logits, best[:, 0], token[:, 0]

    def logits(self, tokens: Tensor, start: Tensor, memory_row: Tensor, zero: Tensor,
               source: Tensor, where: Tensor, kv: list[Tensor], mem: list[Tensor]) -> Tensor:
        """The step's logits (B, 1, V), the caches written at `where`."""
        fast = self.fast[0]
        end = where.expand(tokens.size(0)) + 1  # (B,) the cache's positions after the step
        rows = StepRows(start, end, memory_row[:, None].expand(-1, mem[0].size(2)), zero,
                        source, where)
        caches = [tuple(kv[3 * i:3 * i + 3]) for i in range(self.layers)]
        memory = [tuple(mem[2 * i:2 * i + 2]) for i in range(self.layers)]
        return fast.step_layers(fast.embed_rows(tokens, rows), rows, caches, memory, True)


class BeamGraph(StepGraph):
    """A beam loop's step (tight_loops.beam's usual one: the rows' number and grouping stay)
    of B rows as a function of flat tensors: first the last step's reorder (row r takes row
    parents[r]'s past before `where` and its own buffer row from there on: FastState.
    reorder_own's, each layer's table in place), then StepGraph's step, then the beam's
    choice: nmt::beam_top_k (strategies.choose_beam_logits') of its logits, the rows' scores
    (U, kb) and the banned ids, n the size of `width` (n,) (2k: any beam of k >= 2); returns
    its six tensors."""

    def forward(self, tokens: Tensor, start: Tensor, memory_row: Tensor, zero: Tensor,
                source: Tensor, where: Tensor, banned: Tensor, scores: Tensor,
                parents: Tensor, width: Tensor, kv: list[Tensor],
                mem: list[Tensor]) -> tuple[Tensor, ...]:
        """beam_top_k's candidates of the rows' next tokens."""
        own = torch.arange(tokens.size(0), device=tokens.device)[:, None]  # (B, 1)
        for table in kv[2::3]:  # (B, C) each
            before = torch.arange(table.size(1), device=table.device) < where  # (C,)
            table.copy_(torch.where(before, table.index_select(0, parents), own))
        logits = self.logits(tokens, start, memory_row, zero, source, where, kv, mem)
        return torch.ops.nmt.beam_top_k(logits[:, 0], scores, banned, width.size(0))


class GreedyGraph(StepGraph):
    """GREEDY_STEPS steps of greedy search in one call (StepGraph's arguments, `banned` each
    step's: (GREEDY_STEPS, V) bool, EOS's ban ending inside the call at search.min_len): each
    step's tokens the last one's choices, at positions where, where + 1, ...; returns each
    row's best logits and tokens (B, GREEDY_STEPS) and its last token (B,), the caches written
    at each position. A row that ends inside goes on stepping (its caller reads no further)."""

    def forward(self, tokens: Tensor, start: Tensor, memory_row: Tensor, zero: Tensor,
                source: Tensor, where: Tensor, banned: Tensor, kv: list[Tensor],
                mem: list[Tensor]) -> tuple[Tensor, Tensor, Tensor]:
        """The rows' greedy choices of GREEDY_STEPS steps."""
        bests, chosen = [], []
        for i in range(GREEDY_STEPS):
            logits = self.logits(tokens, start, memory_row, zero, source, where + i, kv, mem)
            best, token = torch.ops.nmt.top_k(logits[:, 0], 1, banned[i])  # (B, 1) each
            tokens = token[:, 0]
            bests.append(best)
            chosen.append(token)
        return torch.cat(bests, 1), torch.cat(chosen, 1), tokens


class BeamStepsGraph(BeamGraph):
    """BEAM_STEPS of BeamGraph's steps in one call (its arguments, `banned` each step's ids
    (BEAM_STEPS, nb), then `specials` (2,): EOS, PAD), the rows that go on from one step to the
    next chosen inside as tight_loops.beam's host chooses them where a unit goes on
    (_beam_step's: a dead candidate continues its unit's first row with PAD; the first k of the
    2k, EOS pushed last); returns each step's candidates (BEAM_STEPS, U, 2k) x3 and the last
    step's rows that go on (BeamStep's): their scores (U, k), rows in the batch (U k,) and
    tokens (U k,). A unit that ends inside goes on stepping (its caller reads no further). Its
    units hold k rows each (kb = k)."""

    def forward(self, tokens: Tensor, start: Tensor, memory_row: Tensor, zero: Tensor,
                source: Tensor, where: Tensor, banned: Tensor, scores: Tensor,
                parents: Tensor, width: Tensor, specials: Tensor, kv: list[Tensor],
                mem: list[Tensor]) -> tuple[Tensor, ...]:
        """The candidates of BEAM_STEPS steps, and the rows that go on after the last."""
        k = width.size(0) // 2
        row = torch.arange(tokens.size(0), device=tokens.device)  # (B,), B = U k
        unit, slot = row // k, row % k  # (B,) each row's unit and its place there
        chosen: list[list[Tensor]] = [[], [], []]
        for i in range(BEAM_STEPS):
            top, parent, token, *_ = super().forward(tokens, start, memory_row, zero, source,
                                                     where + i, banned[i], scores, parents,
                                                     width, kv, mem)  # (U, 2k) each
            for got, made in zip(chosen, (top, parent, token), strict=True):
                got.append(made)
            dead = top == -torch.inf
            parent = parent.masked_fill(dead, 0)
            token = torch.where(dead, specials[1], token)
            on = eos_last(token, specials[0], k)  # (U, k)
            scores = top.gather(1, on)  # (U, k)
            going = on[unit, slot]  # (B,) each row's candidate (indexed by rows: B stays B)
            parents, tokens = parent[unit, going] + unit * k, token[unit, going]  # (B,) each
        return (*(torch.stack(got) for got in chosen), scores, parents, tokens)


TOKENS, WHERE, BANNED = 0, 5, 6  # flat_inputs: where the tokens, position and bans are
SCORES, PARENTS, WIDTH = 7, 8, 9  # beam_inputs: where the scores, parents and 2k are
SPECIALS = 10  # ... and BeamStepsGraph's EOS and PAD


def flat_inputs(tokens: Tensor, rows: StepRows, banned: Tensor, caches: list,
                memory_kv: list) -> list:
    """StepGraph's arguments from the step's (rows.where a (1,) tensor, rows.end unread: every
    row's is where + 1), flat: what a caller may keep between steps, replacing the tokens and
    bans (TOKENS, BANNED) in place."""
    return [tokens, rows.start, rows.memory[:, 0], rows.zero, rows.source, rows.where, banned,
            *(t for cache in caches for t in cache), *(t for pair in memory_kv for t in pair)]


def beam_inputs(rows: StepRows, caches: list, memory_kv: list, steps: bool = False) -> list:
    """BeamGraph's arguments (steps: BeamStepsGraph's), flat_inputs' with the scores, parents
    and width (SCORES, PARENTS, WIDTH; and SPECIALS) after the bans: placeholders here, which
    a caller replaces at each step."""
    flat = flat_inputs(rows.start, rows, rows.start, caches, memory_kv)
    return [*flat[:BANNED + 1], *[rows.start] * (4 if steps else 3), *flat[BANNED + 1:]]


def cpu_flags() -> str:
    """This CPU's instruction-set flags (Linux's /proc/cpuinfo; elsewhere the processor's
    name): Inductor compiles a package with -march=native, so a package is this CPU kind's."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            return next((line for line in info if line.startswith("flags")), "")
    except OSError:
        return platform.processor()


def weights_digest(model: nn.Module) -> bytes:
    """A hash of the model's weights (their names and bytes): hashed once a model, every
    process that decodes it in int8 pays it (~12 ms for the demo's 4.9M parameters)."""
    digest = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().view(torch.uint8).numpy())
    return digest.digest()


def package_key(weights: bytes, dtype: str, kv_dtype: torch.dtype | None,
                rows: int, part: str = "step") -> str:
    """A hash of what a package is compiled from: the model's weights (weights_digest), the
    precision, its rows, this torch, the ISA and its operators' object
    (attention_op.build_key), this CPU's flags (the package is compiled for it), the step's
    code and the part (step, encoder)."""
    digest = hashlib.sha256(weights)
    isa = attention_op.capability()
    for item in (dtype, str(kv_dtype), str(rows), torch.__version__, torch.version.git_version, isa,
                 attention_op.build_key(isa), sys.implementation.cache_tag, cpu_flags(), part,
                 *(path.read_bytes() for path in SOURCES)):
        digest.update(item if isinstance(item, bytes) else item.encode())
        digest.update(b"\0")
    return digest.hexdigest()[:20]


def package_path(key: str, part: str = "step") -> Path:
    """Where the package of `key` (a `part`'s: step, encoder) is kept."""
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return root / "nmt" / "steps" / f"torch-{torch.__version__}" / f"{part}-{key}.pt2"


def step_maps(eager) -> list:
    """The int8 maps of `eager`'s decoding step."""
    return [*(m for layer in eager.decoder for m in (layer.qkv, layer.o, layer.q, layer.o2,
                                                     layer.W_1, layer.W_2)), eager.generator]


def most_rows(eager) -> int:
    """The most rows a package of `eager`'s step takes: the fewest that every int8 map of the
    step gives nmt::int8_rows (affine.few_rows), so that each map of each size the package
    takes is eager's own operator (bit for bit fbgemm's for each row alone); at least one (a
    one-row package, its larger maps eager's maps of many rows); without VNNI or with AMX's
    tiles at least WIDE_STEP_ROWS (the package's maps given int8_rows past few_rows:
    give_rows)."""
    return max(1, _package_rows(step_maps(eager), WIDE_STEP_ROWS))


def _package_rows(maps: list, wide: int) -> int:
    """The fewest rows every one of `maps` gives nmt::int8_rows; at least `wide` where it
    takes them all without VNNI or with AMX's tiles (give_rows)."""
    least = min(m.few_rows for m in maps)
    tiles = affine.int8_rows_layout() == "quads" or affine.int8_rows_amx() > 0
    return max(least, wide) if least and tiles else least


def give_rows(maps: list, rows: int) -> None:
    """Give nmt::int8_rows up to `rows` rows in each of `maps` that it takes at all (a
    package's FastModel's: each row's outputs are its own alone either way, to float
    rounding)."""
    for m in maps:
        if m.few_rows:
            m.few_rows = max(m.few_rows, rows)


def compile_package(eager, path: Path, rows: int = 1, graph: str = "step") -> None:
    """Export `eager`'s step_layers (a FastModel in eager's forms) for 1 to `rows` rows and
    compile it into `path`, written whole (renamed into place: a process that reads it finds a
    whole package or none; two that build at once write the same): StepGraph's (graph
    "step"), GreedyGraph's ("greedy"), BeamGraph's ("beam"; rows >= 4) or BeamStepsGraph's
    ("beam_steps"; rows >= 4)."""
    beam = graph.startswith("beam")
    h, d = eager.decoder[0].h, eager.cfg.d_model
    like = (eager.kv_dtype or eager.float_dtype, torch.long)
    C, S = Dim("C", min=2, max=1 << 16), Dim("S", min=2, max=1 << 16)
    N, M = Dim("N", max=1 << 16), Dim("M", max=1 << 16)
    B = Dim("B", min=1, max=rows) if rows > 1 else None
    # the example's rows (one would specialize the dimension; a beam's: 2 units of 2)
    b = 4 if beam else 2 if rows > 1 else 1

    def zeros(*shape: int, dtype: torch.dtype = like[0]) -> Tensor:
        """A new example input (each its own: export keeps aliased inputs one input)."""
        return torch.zeros(*shape, dtype=dtype)

    caches = [(zeros(3, h, 8, d // h), zeros(3, h, 8, d // h), zeros(b, 8, dtype=like[1]))
              for _ in eager.decoder]
    memory = [(zeros(3, h, 5, d // h), zeros(3, h, 5, d // h)) for _ in eager.decoder]
    ones = torch.ones(b, dtype=torch.long)
    step = StepRows(0 * ones, 2 * ones, ones[:, None].expand(b, 5), 0 * ones, 4 * ones,
                    ones[:1].clone())
    banned = torch.zeros(eager.vocab_size, dtype=torch.bool)
    tokens, start, memory_row, zero, source, where, banned, *flat = flat_inputs(
        torch.zeros(b, dtype=torch.long), step, banned, caches, memory)
    kv, mem = flat[:3 * len(caches)], flat[3 * len(caches):]
    shapes = ({0: B}, *[{0: B}] * 4, None, None,
              [{0: N, 2: C}, {0: N, 2: C}, {0: B, 1: C}] * len(eager.decoder),
              [{0: M, 2: S}, {0: M, 2: S}] * len(eager.decoder))
    if not beam:
        if graph == "greedy":  # each step's bans
            banned = torch.zeros(GREEDY_STEPS, eager.vocab_size, dtype=torch.bool)
        args = (tokens, start, memory_row, zero, source, where, banned, kv, mem)
        made = GreedyGraph(eager) if graph == "greedy" else StepGraph(eager)
        _export_and_compile(made, args, shapes, path)
        return
    banned = torch.tensor([0, 1, 2])  # ids, (3,): as few as a vocabulary bans
    scores, parents = torch.zeros(2, 2), torch.tensor([1, 0, 3, 3])  # (U, kb), (B,)
    args = (tokens, start, memory_row, zero, source, where, banned, scores, parents,
            torch.zeros(8), kv, mem)  # the width of k = 4's 2k
    width = Dim("W", min=4, max=1 << 12)  # beams of 2 or more (k = 1 would specialize)
    shapes = (*shapes[:6], {0: Dim("banned", min=1, max=1 << 16)},
              {0: Dim("U", max=rows), 1: Dim("kb", max=rows)}, {0: B}, {0: width}, *shapes[7:])
    if graph == "beam":
        _export_and_compile(BeamGraph(eager), args, shapes, path)
        return
    # units of k rows: 2 units of 2 (2k = 4: an even width), EOS 3 and PAD 0; each step's bans
    args = (*args[:6], banned.expand(BEAM_STEPS, 3).clone(), *args[7:9], torch.zeros(4),
            torch.tensor([3, 0]), *args[10:])
    shapes = (*shapes[:6], {1: Dim("banned", min=1, max=1 << 16)}, *shapes[7:9],
              {0: 2 * Dim("k", min=2, max=1 << 11)}, None, *shapes[10:])
    _export_and_compile(BeamStepsGraph(eager), args, shapes, path)


def _export_and_compile(graph: nn.Module, args: tuple, shapes: tuple, path: Path) -> None:
    """Export `graph` at example `args` (dynamic `shapes`) and compile it into `path`, written
    whole (renamed into place: a process that reads it finds a whole package or none; two
    that build at once write the same)."""
    with torch.inference_mode():
        program = torch.export.export(graph, args, dynamic_shapes=shapes)
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
        built = private_ops.aoti_compile(program, str(Path(tmp) / "s.pt2"))
        os.replace(built, path)


class EncoderGraph(nn.Module):
    """FastModel's encoder of B sources (B, S), padded on the right, and every decoder layer's
    keys and values of their memory: [k_0, v_0, k_1, ...], (B, h, S, d_k) each."""

    def __init__(self, fast):
        super().__init__()
        self.fast = [fast]  # not a submodule: its tensors become the package's constants

    def forward(self, src: Tensor) -> list[Tensor]:
        """The memory's keys and values."""
        fast = self.fast[0]
        mask = additive_mask((src != fast.pad_id)[:, None, None, :], fast.float_dtype)
        memory = fast.encode_layers(src, mask)  # (B, S, d_model)
        return [t for layer in fast.decoder for t in layer.memory_kv(memory, fast.kv_dtype)]


def encoder_maps(eager) -> list:
    """The int8 maps of `eager`'s encoder and of the memory's keys and values."""
    return [*(m for layer in eager.encoder for m in (layer.qkv, layer.o, layer.W_1, layer.W_2)),
            *(layer.kv for layer in eager.decoder)]


def encoder_rows(eager) -> int:
    """The most positions of all its sources an encoder package of `eager` takes in a call: the
    fewest rows every int8 map of the encoder and of the memory's keys and values gives
    nmt::int8_rows (each map of each size eager's own operator; without VNNI or with AMX's
    tiles at least WIDE_ENCODER_ROWS, give_rows), within the model's positions; below 2:
    none."""
    return min(eager.cfg.max_positions, _package_rows(encoder_maps(eager), WIDE_ENCODER_ROWS))


def compile_encoder(eager, path: Path, rows: int) -> None:
    """Export `eager`'s EncoderGraph for 1 to ENCODER_SOURCES sources of 2 to `rows` positions
    (its maps given nmt::int8_rows for them all: give_rows) and compile it into `path` (as
    compile_package)."""
    give_rows(encoder_maps(eager), ENCODER_SOURCES * rows)
    src = torch.full((2, 3), eager.pad_id + 1, dtype=torch.long)
    src[1, 2] = eager.pad_id  # (2, 3), one padded: neither size specialized
    shapes = ({0: Dim("B", min=1, max=ENCODER_SOURCES), 1: Dim("S", min=2, max=rows)},)
    _export_and_compile(EncoderGraph(eager), (src,), shapes, path)


class Package:
    """A part compiled ahead of time: built by `build()` (compile_package, compile_encoder) if
    `path` has none, loaded by each process at its first call."""

    def __init__(self, path: Path, build: Callable[[], None], what: str):
        if not path.exists():
            print(f"nmt: compiling {what} into {path} (once per machine and model, ~10 s; "
                  f"search.compile=false runs eager)", file=sys.stderr)
            build()
        self.path, self.runner, self.calls = path, None, 0

    def run(self, inputs: list[Tensor]) -> list[Tensor]:
        """The package's outputs of these flat inputs."""
        if self.runner is None:
            self.runner = private_ops.aoti_load(str(self.path))
        self.calls += 1
        return self.runner(inputs)


class PackagedStep(Package):
    """The compiled step of 1 to `rows` rows (compile_package, from the FastModel in eager's
    forms that make_eager returns)."""

    def __init__(self, path: Path, make_eager: Callable[[], nn.Module], rows: int, vocab: int):
        super().__init__(path, lambda: compile_package(make_eager(), path, rows),
                         f"the decoding step of 1-{rows} rows")
        self.rows = rows
        self.no_bans = torch.zeros(vocab, dtype=torch.bool)  # (V,)

    def __call__(self, tokens: Tensor, rows: StepRows, caches: list, memory_kv: list,
                 banned: Tensor | None = None) -> StepOut:
        """FastModel.step_layers of B <= self.rows rows after their tokens (B,) (embedded at
        their positions, rows.end - 1 - rows.start), the whole vocabulary's logits, and each
        row's best token outside `banned` (V,) bool (None: none banned)."""
        return self.step(self.inputs(rows, caches, memory_kv), tokens, banned, rows.where)

    def inputs(self, rows: StepRows, caches: list, memory_kv: list) -> list[Tensor]:
        """The flat inputs of steps of these rows, caches and memory (flat_inputs'), which a
        caller keeps while they stay (`step` sets the tokens and bans in them)."""
        return flat_inputs(self.no_bans, rows, self.no_bans, caches, memory_kv)

    def step(self, inputs: list[Tensor], tokens: Tensor, banned: Tensor | None,
             where: Tensor) -> StepOut:
        """__call__'s step from `inputs` (the rows' `self.inputs`), tokens (B,), banned (V,)
        bool (None: none banned) and the position `where` (1,) set in them."""
        inputs[TOKENS], inputs[BANNED] = tokens, self.no_bans if banned is None else banned
        inputs[WHERE] = where
        return StepOut(*self.run(inputs))


class PackagedGreedy(Package):
    """The compiled GREEDY_STEPS steps of greedy search of 1 to `rows` rows (compile_package's
    GreedyGraph, from the FastModel in eager's forms that make_eager returns)."""

    def __init__(self, path: Path, make_eager: Callable[[], nn.Module], rows: int):
        super().__init__(path, lambda: compile_package(make_eager(), path, rows, "greedy"),
                         f"greedy's {GREEDY_STEPS} steps of 1-{rows} rows")
        self.rows, self.steps = rows, GREEDY_STEPS

    def run_steps(self, inputs: list[Tensor], tokens: Tensor, banned: Tensor,
                  where: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """GreedyGraph's steps from `inputs` (flat_inputs' of the rows, caches and memory, as
        the step's package takes them, room made for every position), the tokens (B,),
        each step's bans (steps, V) bool and the first position `where` (1,) set in them: the
        best logits and tokens (B, steps), the last tokens (B,)."""
        inputs[TOKENS], inputs[BANNED], inputs[WHERE] = tokens, banned, where
        return tuple(self.run(inputs))


class PackagedBeam(Package):
    """The compiled beam step of 1 to `rows` (>= 4) rows (compile_package's BeamGraph, from
    the FastModel in eager's forms that make_eager returns)."""

    def __init__(self, path: Path, make_eager: Callable[[], nn.Module], rows: int):
        super().__init__(path, lambda: compile_package(make_eager(), path, rows, "beam"),
                         f"the beam's step of 1-{rows} rows")
        self.rows = rows

    def inputs(self, rows: StepRows, caches: list, memory_kv: list) -> list[Tensor]:
        """The flat inputs of steps of these rows, caches and memory (beam_inputs'), which a
        caller keeps while they stay (`step` sets the rest in them)."""
        return beam_inputs(rows, caches, memory_kv)

    def step(self, inputs: list[Tensor], tokens: Tensor, banned: Tensor, where: Tensor,
             scores: Tensor, parents: Tensor, width: Tensor) -> BeamStep:
        """BeamGraph's step from `inputs` (beam_inputs' of the rows, caches and memory, kept
        while they stay): the tokens (B,), banned ids, position (1,), scores (U, kb), parents
        (B,) and width (2k,) set in them."""
        inputs[TOKENS], inputs[BANNED], inputs[WHERE] = tokens, banned, where
        inputs[SCORES], inputs[PARENTS], inputs[WIDTH] = scores, parents, width
        top, parents, tokens, *first = self.run(inputs)
        return BeamStep(Choice(top, parents, tokens), *first)


class PackagedBeamSteps(Package):
    """The compiled BEAM_STEPS steps of beam search of 1 to `rows` (>= 4) rows
    (compile_package's BeamStepsGraph, from the FastModel in eager's forms that make_eager
    returns)."""

    def __init__(self, path: Path, make_eager: Callable[[], nn.Module], rows: int):
        super().__init__(path, lambda: compile_package(make_eager(), path, rows, "beam_steps"),
                         f"the beam's {BEAM_STEPS} steps of 1-{rows} rows")
        self.rows, self.steps = rows, BEAM_STEPS

    def inputs(self, rows: StepRows, caches: list, memory_kv: list) -> list[Tensor]:
        """The flat inputs of steps of these rows, caches and memory (beam_inputs'), which a
        caller keeps while they stay (`run_steps` sets the rest in them)."""
        return beam_inputs(rows, caches, memory_kv, True)

    def run_steps(self, inputs: list[Tensor], tokens: Tensor, banned: Tensor, where: Tensor,
                  scores: Tensor, parents: Tensor, width: Tensor,
                  specials: Tensor) -> BeamStep:
        """BeamStepsGraph's steps from `inputs` (kept while the rows, caches and memory stay,
        room made for every position): the tokens (B,), each step's banned ids (steps, nb),
        first position (1,), scores (U, k), parents (B,), width (2k,) and specials (EOS, PAD)
        set in them. Its choice's tensors are each step's, (steps, U, 2k); its rows the last's
        that go on."""
        inputs[TOKENS], inputs[BANNED], inputs[WHERE] = tokens, banned, where
        inputs[SCORES], inputs[PARENTS], inputs[WIDTH] = scores, parents, width
        inputs[SPECIALS] = specials
        top, parents, tokens, scores, rows, going = self.run(inputs)
        return BeamStep(Choice(top, parents, tokens), scores, rows, going)


class PackagedEncoder(Package):
    """The compiled encoder of 1 to ENCODER_SOURCES sources of 2 to `rows` positions, padded
    (compile_encoder)."""

    def __init__(self, path: Path, make_eager: Callable[[], nn.Module], rows: int):
        super().__init__(path, lambda: compile_encoder(make_eager(), path, rows),
                         f"the encoder of 1-{ENCODER_SOURCES} sources of 2-{rows} positions")
        self.rows = rows

    def takes(self, length: int) -> bool:
        """Whether a call takes sources of this (padded) length: 2 to `rows` positions."""
        return 2 <= length <= self.rows

    def chunks(self, groups: list[tuple[Tensor, int]]) -> list[tuple[Tensor, int]] | None:
        """The calls that encode sources in `groups` of like length (rows (n,), longest
        length; source_groups'): each group's rows in chunks of 1 to ENCODER_SOURCES sources,
        at most `rows` positions in all with the padding; None where a call does not take a
        group's longest source (`takes`), or where that takes more than ENCODER_CALLS calls."""
        calls = []
        for rows, L in groups:
            if not self.takes(L):
                return None
            n = min(ENCODER_SOURCES, self.rows // L)  # sources a call
            calls += [(rows[i:i + n], L) for i in range(0, len(rows), n)]
        return calls if len(calls) <= ENCODER_CALLS else None

    def __call__(self, src: Tensor) -> list[tuple[Tensor, Tensor]]:
        """Every decoder layer's keys and values (B, h, S, d_k) of (B, S) source ids (made
        contiguous: the package reads its inputs at their sizes' strides)."""
        out = self.run([src.contiguous()])
        return [(out[i], out[i + 1]) for i in range(0, len(out), 2)]
