"""nmt-export's onnx format: the layout transformers.js loads for a text2text model.

onnx/encoder_model.onnx (input_ids, attention_mask -> last_hidden_state) and
onnx/decoder_model_merged.onnx, optimum's merged decoder: inputs input_ids,
encoder_attention_mask, encoder_hidden_states, past_key_values.{i}.decoder.key/value,
past_key_values.{i}.encoder.key/value and use_cache_branch; outputs logits and
present.{i}.decoder.key/value, present.{i}.encoder.key/value. With use_cache_branch false (the
first step) the past inputs may be empty and are not read, the encoder's keys and values are
projected from encoder_hidden_states; with it true they are the past ones (passed through as
the present ones). Both graphs are exported (torch.onnx, the dynamo exporter) from nmt's own
modules through the wrappers below, which compute what nmt.model computes from optimum's
inputs; the merged decoder is the two decoders (without and with past) as the branches of one
ONNX If, their weights shared (merge_decoders). onnx/*_quantized.onnx: the same with int8
weights (onnxruntime's dynamic quantization), config.json (MarianMT's type for either norm:
transformers.js takes only sizes and ids from it), generation_config.json (greedy, nmt's
start and end tokens and its banned ones), tokenizer.json and tokenizer_config.json
(nmt.wings.interop.tokenizer_json); index.html and offline.js, the page that translates in the
browser with transformers.js from runtime/ (copied from web_runtime=DIR, an npm install of
@huggingface/transformers).

Not exported: multilingual models (target-language tags or forced languages: transformers.js's
text2text pipeline has no way to add them), models with model.positions=fairseq (imported M2M100
and NLLB-200) and models whose source and target vocabularies differ (one tokenizer.json).
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from nmt.data.vocab import LanguagePair
from nmt.errors import NmtError
from nmt.loading import LoadedCheckpoint
from nmt.model import SelfAttention, Transformer
from nmt.wings.interop.tokenizer_json import write_tokenizer_json
from nmt.wings.interop.transformers_export import MAX_LENGTH

OPSET = 18
EXAMPLE_BATCH, EXAMPLE_SRC, EXAMPLE_PAST = 2, 5, 3  # example sizes (> 1: none specialised)


# ----------------------------------------------------------------------------- wrappers
def _positions(model: Transformer, start: Tensor | int, T: int) -> Tensor:
    """The sinusoids of positions start..start+T-1, (T, d_model), by index (no size check:
    ONNX graphs take symbolic starts)."""
    return model.positions.pe[torch.arange(T, device=model.positions.pe.device) + start]


def _self_attention(attn: SelfAttention, x: Tensor, past: tuple[Tensor, Tensor] | None
                    ) -> tuple[Tensor, Tensor, Tensor]:
    """Causal self-attention of x's T new positions after `past` keys and values:
    (output, all keys, all values)."""
    B, T, _ = x.shape
    q, k, v = attn.W_qkv(x).view(B, T, 3, attn.h, attn.d_k).permute(2, 0, 3, 1, 4)
    if past is not None:
        k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
    L = k.size(2)
    mask = torch.arange(L)[None, :] <= torch.arange(T)[:, None] + (L - T)  # (T, L)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return attn.combine_heads(out), k, v


class EncoderExport(nn.Module):
    """nmt's encoder with optimum's inputs: (input_ids, attention_mask) -> last_hidden_state."""

    def __init__(self, model: Transformer):
        super().__init__()
        self.model = model

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        """(B, S) ids and mask (1: a token) -> (B, S, d_model)."""
        m = self.model
        mask = attention_mask.bool()[:, None, None, :]
        x = m.src_embed(input_ids) + _positions(m, 0, input_ids.size(1))
        for layer in m.encoder:
            x = layer(x, mask)
        return m.encoder_norm(x)


class DecoderExport(nn.Module):
    """nmt's decoder with optimum's inputs: (input_ids, encoder_attention_mask,
    encoder_hidden_states, then per layer past decoder key, value, encoder key, value when
    with_past) -> logits, then per layer present decoder key, value, encoder key, value."""

    def __init__(self, model: Transformer, with_past: bool):
        super().__init__()
        self.model, self.with_past = model, with_past

    def forward(self, input_ids: Tensor, encoder_attention_mask: Tensor,
                encoder_hidden_states: Tensor, *past: Tensor) -> tuple[Tensor, ...]:
        """One decoding step (or, without past, teacher-forced positions 0..T-1)."""
        m = self.model
        mask = encoder_attention_mask.bool()[:, None, None, :]
        start = past[0].size(2) if self.with_past else 0
        x = m.tgt_embed(input_ids) + _positions(m, start, input_ids.size(1))
        presents: list[Tensor] = []
        for i, layer in enumerate(m.decoder):
            if self.with_past:
                dec, enc = past[4 * i:4 * i + 2], past[4 * i + 2:4 * i + 4]
            else:
                dec, enc = None, layer.src_attn.project_kv(encoder_hidden_states)
            kv: list[Tensor] = []

            def attend(y: Tensor, layer=layer, dec=dec, kv=kv) -> Tensor:
                out, k, v = _self_attention(layer.self_attn, y, dec)
                kv += [k, v]
                return out

            x = layer.sublayer[0](x, attend)
            x = layer.sublayer[1](x, lambda y, layer=layer, enc=enc:
                                  layer.src_attn(y, enc, mask))
            x = layer.sublayer[2](x, layer.feed_forward)
            presents += [*kv, *enc]
        return m.generator(m.decoder_norm(x)), *presents


# ----------------------------------------------------------------------------- names
def past_names(layers: int, prefix: str) -> list[str]:
    """optimum's names of the past (prefix past_key_values) or present key/value tensors."""
    return [f"{prefix}.{i}.{side}.{kind}" for i in range(layers)
            for side in ("decoder", "encoder") for kind in ("key", "value")]


def check_exportable(loaded: LoadedCheckpoint) -> None:
    """A one-line NmtError for a model this format does not export."""
    v, cfg = loaded.vocab, loaded.model.cfg
    if v.languages:
        raise NmtError("format=onnx exports bilingual models only: this model's language tags "
                       "(which nmt adds to each source or forces as the first output token) "
                       "have no place in transformers.js's text2text pipeline")
    if cfg.positions != "paper":
        raise NmtError(f"format=onnx: model.positions={cfg.positions} (an imported M2M100 or "
                       "NLLB-200 model) is not exported; format=transformers exports it")


# ----------------------------------------------------------------------------- the graphs
def export_graph(module: nn.Module, args: tuple, names: list[str], outputs: list[str],
                 dynamic: tuple, path: Path) -> None:
    """torch.onnx's dynamo export of `module` on example `args` to `path` (one file)."""
    import logging

    # their progress notes ("Obtain model graph ... ✅", "Removed 32 unused nodes"), which
    # nmt-export's logging (Hydra's, at INFO) would print
    loggers = [logging.getLogger(name) for name in ("torch.onnx", "onnxscript", "onnx_ir")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # axis-renaming and deprecation notes
            program = torch.onnx.export(module, args, input_names=names,
                                        output_names=outputs, dynamic_shapes=dynamic,
                                        opset_version=OPSET, dynamo=True, verbose=False)
        program.save(str(path), external_data=False)
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


def export_graphs(model: Transformer, out: Path) -> tuple[Path, Path, Path]:
    """The encoder and the two decoders (without past, with past) as ONNX files in `out`."""
    from torch.export import Dim

    cfg = model.cfg
    L, d_k, n = cfg.decoder_layers, cfg.d_model // cfg.h, cfg.max_positions
    B, S, P = EXAMPLE_BATCH, EXAMPLE_SRC, EXAMPLE_PAST
    batch, src = Dim("batch_size"), Dim("encoder_sequence_length", max=n)
    ids = torch.full((B, S), 4, dtype=torch.long)
    mask = torch.ones(B, S, dtype=torch.long)
    paths = out / "encoder.onnx", out / "decoder.onnx", out / "decoder_with_past.onnx"
    with torch.no_grad():
        export_graph(EncoderExport(model), (ids, mask), ["input_ids", "attention_mask"],
                     ["last_hidden_state"], ({0: batch, 1: src}, {0: batch, 1: src}), paths[0])
        hidden = EncoderExport(model)(ids, mask)
        step = torch.full((B, 1), 4, dtype=torch.long)
        common = ["input_ids", "encoder_attention_mask", "encoder_hidden_states"]
        outputs = ["logits", *past_names(L, "present")]
        export_graph(DecoderExport(model, False), (step, mask, hidden), common, outputs,
                     ({0: batch, 1: Dim("decoder_sequence_length", max=n)},
                      {0: batch, 1: src}, {0: batch, 1: src}), paths[1])
        names = past_names(L, "past_key_values")
        past = tuple(torch.zeros(B, cfg.h, P if ".decoder." in k else S, d_k) for k in names)
        shapes = tuple({0: batch, 2: Dim("past_sequence_length", max=n - 1)}
                       if ".decoder." in k else {0: batch, 2: src} for k in names)
        export_graph(DecoderExport(model, True), (step, mask, hidden, *past), common + names,
                     outputs, ({0: batch}, {0: batch, 1: src}, {0: batch, 1: src}, shapes),
                     paths[2])
    return paths


def merge_decoders(no_past, with_past):
    """optimum's merged decoder: one ONNX model whose If on use_cache_branch runs `with_past`
    (true) or `no_past` (false), both onnx.ModelProto; their weights are the outer graph's
    initializers, each distinct tensor once."""
    import onnx
    from onnx import TensorProto, helper

    shared: dict[tuple, onnx.TensorProto] = {}  # (type, dims, bytes) -> the outer initializer

    def branch(graph, tag: str):
        rename, outer = {}, {i.name for i in graph.input}
        for t in graph.initializer:
            key = (t.data_type, tuple(t.dims), onnx.numpy_helper.to_array(t).tobytes())
            if key not in shared:
                shared[key] = onnx.TensorProto()
                shared[key].CopyFrom(t)
                shared[key].name = f"shared_{len(shared)}"
            rename[t.name] = shared[key].name
        nodes = []
        for node in graph.node:
            node = onnx.NodeProto.FromString(node.SerializeToString())
            node.input[:] = [rename.get(x, x if x in outer or not x else f"{tag}/{x}")
                             for x in node.input]
            node.output[:] = [f"{tag}/{y}" if y else y for y in node.output]
            node.name = f"{tag}/{node.name}"
            nodes.append(node)
        outputs = [_unsized(o, f"{tag}/{o.name}") for o in graph.output]
        return helper.make_graph(nodes, tag, [], outputs)

    then_branch, else_branch = branch(with_past.graph, "with_past"), branch(no_past.graph,
                                                                             "no_past")
    names = [o.name for o in with_past.graph.output]
    if_node = helper.make_node("If", ["use_cache_branch"], names, name="optimum::if",
                               then_branch=then_branch, else_branch=else_branch)
    inputs = [*with_past.graph.input,
              helper.make_tensor_value_info("use_cache_branch", TensorProto.BOOL, [1])]
    outputs = [_unsized(o, o.name) for o in with_past.graph.output]
    graph = helper.make_graph([if_node], "merged_decoder", inputs, outputs,
                              initializer=list(shared.values()))
    merged = helper.make_model(graph, opset_imports=with_past.opset_import)
    merged.ir_version = with_past.ir_version
    return merged


def _unsized(value, name: str):
    """A graph output like `value` (a ValueInfoProto) named `name`, its sizes unknown (the two
    branches name their symbolic sizes differently)."""
    from onnx import helper

    t = value.type.tensor_type
    return helper.make_tensor_value_info(name, t.elem_type, [None] * len(t.shape.dim))


# ----------------------------------------------------------------------------- the directory
def hf_config(loaded: LoadedCheckpoint) -> dict:
    """config.json: MarianMT's, whatever the norm (the graphs hold the network: transformers.js
    reads the model type, sizes and ids only, and has no Pegasus in 4.x), with the sizes and
    ids of the checkpoint; normalize_before says which norm the graphs have."""
    cfg, v = loaded.model.cfg, loaded.vocab
    return {"architectures": ["MarianMTModel"], "model_type": "marian",
            "is_encoder_decoder": True, "normalize_before": cfg.norm == "pre",
            "d_model": cfg.d_model, "encoder_layers": cfg.N,
            "decoder_layers": cfg.decoder_layers, "encoder_attention_heads": cfg.h,
            "decoder_attention_heads": cfg.h, "encoder_ffn_dim": cfg.d_ff,
            "decoder_ffn_dim": cfg.d_ff, "activation_function": cfg.activation,
            "max_position_embeddings": cfg.max_positions, "scale_embedding": True,
            "vocab_size": v.src_size, "decoder_vocab_size": v.tgt_size,
            "pad_token_id": v.pad_id, "eos_token_id": v.eos_id,
            "bos_token_id": loaded.specials.bos, "decoder_start_token_id": loaded.specials.bos,
            "forced_eos_token_id": None, "tie_word_embeddings": cfg.share_embeddings,
            "use_cache": True}


def generation_config(loaded: LoadedCheckpoint) -> dict:
    """generation_config.json: greedy from nmt's BOS, its banned tokens never generated (as
    bad_words_ids, which transformers.js applies too), at least one token before EOS."""
    s = loaded.specials
    return {"decoder_start_token_id": s.bos, "bos_token_id": s.bos, "eos_token_id": s.eos,
            "pad_token_id": s.pad, "bad_words_ids": [[i] for i in s.banned],
            "min_new_tokens": 1, "num_beams": 1, "do_sample": False,
            "max_length": min(MAX_LENGTH, loaded.model.cfg.max_positions)}


def quantize(path: Path, out: Path) -> Path:
    """The int8 variant of an ONNX file: onnxruntime's dynamic quantization of its matrix
    products' weights (activations quantized as they come), written to `out`."""
    import logging

    from onnxruntime.quantization import QuantType, quantize_dynamic

    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)  # "Please consider to run pre-processing before quantization"
    try:
        quantize_dynamic(str(path), str(out), weight_type=QuantType.QInt8)
    finally:
        root.setLevel(level)
    return out


RUNTIME = {  # web_runtime's files (an npm install of @huggingface/transformers) -> runtime/
    "node_modules/@huggingface/transformers/dist/transformers.min.js": "transformers.min.js",
    "node_modules/onnxruntime-web/dist/ort-wasm-simd-threaded.asyncify.mjs":
        "ort-wasm-simd-threaded.asyncify.mjs",
    "node_modules/onnxruntime-web/dist/ort-wasm-simd-threaded.asyncify.wasm":
        "ort-wasm-simd-threaded.asyncify.wasm"}


def check_web_runtime(web_runtime: str) -> None:
    """A one-line NmtError unless `web_runtime` (a folder where `npm install
    @huggingface/transformers` ran) holds the files the page loads."""
    missing = [name for name in RUNTIME if not (Path(web_runtime) / name).is_file()]
    if missing:
        raise NmtError(f"web_runtime={web_runtime}: no {missing[0]} (run `npm install "
                       "@huggingface/transformers --ignore-scripts` in that folder)")


def write_page(loaded: LoadedCheckpoint, out: Path, web_runtime: str) -> None:
    """index.html and offline.js (the page that translates in the browser), with runtime/
    copied from web_runtime when given."""
    import html
    import shutil

    pair = loaded.vocab.pair or LanguagePair()
    name = f"{pair.src_lang or 'source'} \u2192 {pair.tgt_lang or 'target'}"
    page = (Path(__file__).parent / "offline.html").read_text(encoding="utf-8")
    (out / "index.html").write_text(page.replace("__PAIR__", html.escape(name)),
                                    encoding="utf-8")
    shutil.copyfile(Path(__file__).parent / "offline.js", out / "offline.js")
    if web_runtime:
        (out / "runtime").mkdir()
        for source, target in RUNTIME.items():
            shutil.copyfile(Path(web_runtime) / source, out / "runtime" / target)


def write_onnx(loaded: LoadedCheckpoint, out: Path, web_runtime: str = "") -> str:
    """Write the transformers.js layout into `out` (see the module's docstring), and the page
    (write_page). The decoders are quantized before they are merged: onnxruntime's quantizer
    leaves the branches of an If alone."""
    import onnx

    check_exportable(loaded)
    if web_runtime:
        check_web_runtime(web_runtime)
    write_page(loaded, out, web_runtime)
    write_tokenizer_json(loaded.src_tok, loaded.tgt_tok, out, loaded.model.cfg.max_positions,
                         loaded.vocab.source_eos)
    graphs, work = out / "onnx", out / ".graphs"
    graphs.mkdir()
    work.mkdir()
    encoder, no_past, with_past = export_graphs(loaded.model, work)
    quantize(encoder, graphs / "encoder_model_quantized.onnx")
    encoder.rename(graphs / "encoder_model.onnx")
    for suffix in ("", "_quantized"):
        pair = [p if not suffix else quantize(p, p.with_name(p.stem + suffix + ".onnx"))
                for p in (no_past, with_past)]
        merged = merge_decoders(*(onnx.load(str(p)) for p in pair))
        onnx.save(merged, str(graphs / f"decoder_model_merged{suffix}.onnx"))
    for path in work.iterdir():
        path.unlink()
    work.rmdir()
    for name, value in (("config.json", hf_config(loaded)),
                        ("generation_config.json", generation_config(loaded))):
        (out / name).write_text(json.dumps(value, indent=2) + "\n", encoding="utf-8")
    sizes = ", ".join(f"{p.name} {p.stat().st_size / 1e6:.1f} MB"
                      for p in sorted(graphs.iterdir()))
    return f"onnx for transformers.js ({sizes}), {loaded.describe()}"


# ----------------------------------------------------------------------------- running it
class OnnxGreedy:
    """Greedy decoding over an exported directory with onnxruntime (CPU), as transformers.js
    runs it: the encoder once, then the merged decoder a token at a time with its cache."""

    def __init__(self, directory: Path, quantized: bool = False, threads: int = 1):
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
        suffix = "_quantized" if quantized else ""
        graphs = Path(directory) / "onnx"
        self.encoder = ort.InferenceSession(str(graphs / f"encoder_model{suffix}.onnx"),
                                            options, providers=["CPUExecutionProvider"])
        self.decoder = ort.InferenceSession(str(graphs / f"decoder_model_merged{suffix}.onnx"),
                                            options, providers=["CPUExecutionProvider"])
        config = json.loads((Path(directory) / "config.json").read_text(encoding="utf-8"))
        generation = json.loads((Path(directory) / "generation_config.json").read_text(
            encoding="utf-8"))
        self.heads, self.d_k = config["decoder_attention_heads"], (
            config["d_model"] // config["decoder_attention_heads"])
        self.layers = config["decoder_layers"]
        self.start, self.eos = generation["decoder_start_token_id"], generation["eos_token_id"]
        self.banned = [ids[0] for ids in generation["bad_words_ids"]]

    def translate(self, src: list[int], max_len: int) -> list[int]:
        """One source's ids (EOS included) -> the greedy output ids (no BOS/EOS), at most
        max_len tokens."""
        return self._decode(src, max_len, None)[0]

    def top1(self, src: list[int], forced: list[int]) -> list[int]:
        """The best token (banned ones and an EOS first excluded) at each step of decoding
        `forced` (no BOS/EOS) and then EOS: len(forced) + 1 ids."""
        return self._decode(src, len(forced) + 1, forced)[1]

    def _decode(self, src: list[int], max_len: int, forced: list[int] | None
                ) -> tuple[list[int], list[int]]:
        """(the output ids, the best token at each step), the outputs greedy's or `forced`."""
        import numpy as np

        ids = np.array([src], dtype=np.int64)
        mask = np.ones_like(ids)
        (hidden,) = self.encoder.run(None, {"input_ids": ids, "attention_mask": mask})
        names = past_names(self.layers, "past_key_values")
        feeds = {"encoder_attention_mask": mask, "encoder_hidden_states": hidden,
                 "use_cache_branch": np.array([False]),
                 **{k: np.zeros((1, self.heads, 0, self.d_k), np.float32) for k in names}}
        out, best, token = [], [], self.start
        while len(best) < max_len:
            feeds["input_ids"] = np.array([[token]], dtype=np.int64)
            logits, *present = self.decoder.run(None, feeds)
            scores = logits[0, -1]
            scores[self.banned] = -np.inf
            if not best:
                scores[self.eos] = -np.inf
            best.append(int(scores.argmax()))
            token = best[-1] if forced is None else (forced + [self.eos])[len(best) - 1]
            if token == self.eos:
                break
            out.append(token)
            feeds.update(zip(names, present, strict=True))
            feeds["use_cache_branch"] = np.array([True])
        return out, best
