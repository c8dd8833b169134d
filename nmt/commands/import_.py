"""nmt-import: a Hugging Face transformers model directory, or a CTranslate2 model directory, in;
an nmt checkpoint out.

A directory with model.bin (or an Argos package, holding it in model/) is a CTranslate2 model
(nmt.wings.interop.ct2_import); otherwise config.json's model_type picks the converter: marian
(MarianMT, the OPUS-MT models: nmt.wings.interop.marian) or m2m_100 (M2M100 and NLLB-200:
nmt.wings.interop.m2m100). Each reads the network,
the vocabulary and the weights; the model is built as every command builds it (nmt.variants), the
weights loaded into it, and the checkpoint written atomically and read back. The checkpoint
translates, serves, exports and fine-tunes as nmt-train's do; the command prints the nmt-train
overrides of its model.
"""

from __future__ import annotations

from pathlib import Path

from nmt.config import ImportConfig, ModelConfig
from nmt.errors import NmtError
from nmt.system.files import check_output, replaced_file
from nmt.training.checkpoint import load_checkpoint, save_checkpoint
from nmt.variants import build_model
from nmt.wings.interop import ct2_import, m2m100, marian
from nmt.wings.interop.hf_files import Converted, read_json

PROG = "nmt-import"
CONVERTERS = {"marian": marian.convert, "m2m_100": m2m100.convert}  # by config.json's model_type


def import_model(cfg: ImportConfig) -> Path:
    """nmt-import: read the model directory cfg.input and write the checkpoint cfg.output."""
    src, out = Path(cfg.input), Path(cfg.output)
    check_output(out, "output")
    replaced = replaced_file(out)  # None: a pipe or device, written into (nothing replaced)
    if replaced is not None and replaced.exists() and not cfg.force:
        raise NmtError(f"output={out}: exists; give force=true to replace it")
    try:
        converted = convert(cfg)
        model_cfg, vocab = converted.model_cfg, converted.vocab
        model = build_model(model_cfg, vocab.src_size, vocab.tgt_size, vocab.pad_id,
                            vocab.joint)
        model.load_state_dict(converted.weights)
    except (RuntimeError, IndexError) as e:  # a shape that config.json does not give
        layout = "model.bin" if ct2_import.is_ct2_model(src) else "config.json"
        raise NmtError(f"{src}: weights do not fit {layout} "
                       f"({str(e).strip().splitlines()[-1].strip()[:150]})") from None
    save_checkpoint({"model": model.state_dict(), "model_cfg": model_cfg.__dict__.copy(),
                     "vocab": vocab.to_dict(), "update": 0, "epoch": 0,
                     "imported_from": str(src)}, out)
    if replaced is not None:
        load_checkpoint(out)  # read back as every command will
    languages = vocab.languages.codes if vocab.languages else {}
    print(f"{PROG}: {src} -> {out} ({converted.kind}, {model_cfg.N}+"
          f"{model_cfg.decoder_layers} layers, d_model {model_cfg.d_model}, "
          f"{model_cfg.activation}, vocabulary {vocab.src_size}/{vocab.tgt_size}"
          f"{f', {len(languages)} languages' if languages else ''})\n{PROG}: fine-tune it "
          f"with: nmt-train +model=base {' '.join(model_overrides(model_cfg))} "
          f"train.init_from={out} ...", flush=True)
    return out


def convert(cfg: ImportConfig) -> Converted:
    """The input model as nmt's model config, vocabulary and weights, by its converter."""
    src = Path(cfg.input)
    if ct2_import.is_ct2_model(src):
        return ct2_import.convert(src, cfg.src_spm, cfg.tgt_spm)
    if src.is_dir() and not (src / "config.json").exists():
        raise NmtError(f"{src}: neither model.bin (a CTranslate2 model or Argos package) nor "
                       f"config.json (a transformers model directory)")
    config = read_json(src / "config.json")
    kind = config.get("model_type")
    if kind not in CONVERTERS:
        raise NmtError(f"{src / 'config.json'}: model_type={kind!r}: nmt-import reads marian "
                       f"(MarianMT, OPUS-MT) and m2m_100 (M2M100, NLLB-200) models, and "
                       f"CTranslate2 models (model.bin)")
    if cfg.src_spm:
        raise NmtError(f"src_spm={cfg.src_spm}: applies to CTranslate2 models only (model.bin)")
    return CONVERTERS[kind](src, config)


def model_overrides(cfg: ModelConfig) -> list[str]:
    """The command-line overrides that make nmt-train's model this one (on top of +model=...)."""
    keys = ("N", "N_dec", "d_model", "d_ff", "h", "norm", "share_embeddings", "max_positions",
            "activation", "output_bias", "positions", "dropout", "attention_dropout")
    values = {k: getattr(cfg, k) for k in keys + ("norm_eps",) * (cfg.norm_eps != 1e-5)}
    return [f"model.{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in values.items()]
