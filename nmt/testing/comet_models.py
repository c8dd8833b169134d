"""Tiny random COMET models, built the same way every time, for parity with unbabel-comet.

build(root, form) writes ROOT/<form>/ as Unbabel's model directories are laid out:
hparams.yaml, checkpoints/model.ckpt (a Lightning checkpoint: state_dict, hyper_parameters,
pytorch-lightning_version) and encoder/ (an XLM-R config.json of 2 layers, hidden 32, and a
SentencePiece model trained here), named by hparams' pretrained_model so nothing goes to a
hub. Weights come from a seeded generator, not from transformers' initialisers, and
checksum() hashes what decides the scores: `make test` fails loudly when a rebuild differs
from the one whose unbabel-comet scores tests/data/comet_scores.json records
(scripts/comet_reference.py).

Run as a module (make test-comet): python -m nmt.testing.comet_models OUT_DIR builds both forms.
Imports nothing else of nmt, so that unbabel-comet's venv can import it from a checkout.
"""

from __future__ import annotations

import hashlib
import io
import json
import sys
from pathlib import Path

import torch

HIDDEN, LAYERS, HEADS, FFN, POSITIONS = 32, 2, 4, 64, 66  # max_positions 64, 62 pieces a text
SPM_TEXT = [
    "the quick brown fox jumps over the lazy dog", "a small house stands by the lake",
    "der schnelle braune Fuchs springt über den faulen Hund", "ein kleines Haus am See",
    "le renard brun saute par-dessus le chien paresseux", "une petite maison près du lac",
    "Übersetzungen werden bewertet, Zahlen 1 2 3 4 5!", "translations are scored: 42 % ok?",
]
# (form, hparams): COMET-22's (avg pool, sparsemax, no layer norm) and CometKiwi's (cls pool;
# hparams.yaml patched to sparsemax_patch as Unbabel's hub copy is, so a softmax; layer norm)
FORMS = {
    "regression_metric": {"pool": "avg", "layer": "mix", "layer_transformation": "sparsemax",
                          "layer_norm": False},
    "unified_metric": {"sent_layer": "mix", "layer": "mix", "layer_transformation": "sparsemax",
                       "layer_norm": True, "input_segments": ["mt", "src"],
                       "word_level_training": False, "pool": "avg"},
}
SEEDS = {"regression_metric": 22, "unified_metric": 23}

# The lines both implementations score: a duplicate, a long one (truncated), non-ASCII.
LONG = " ".join(["ein kleines Haus am See"] * 20)
LINES = {
    "src": ["a small house stands by the lake", "the quick brown fox", "translations are scored",
            "a small house stands by the lake", LONG, "the lazy dog"],
    "mt": ["ein kleines Haus am See", "der schnelle Fuchs", "Übersetzungen werden bewertet",
           "ein Haus", LONG, "der faule Hund springt über den Fuchs und den See"],
    "ref": ["ein kleines Haus steht am See", "der schnelle braune Fuchs",
            "Übersetzungen werden bewertet!", "ein kleines Haus am See", LONG[:60], "der Hund"],
}


def train_spm() -> bytes:
    """An 80-piece (at most) unigram SentencePiece model of SPM_TEXT (XLM-R's ids: <unk> 0, <s> 1,
    </s> 2), trained on one thread."""
    import sentencepiece as spm

    out = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(SPM_TEXT * 20), model_writer=out,
                                   vocab_size=80, model_type="unigram", num_threads=1,
                                   character_coverage=1.0, hard_vocab_limit=False,
                                   minloglevel=2)
    return out.getvalue()


def encoder_config(vocab: int) -> dict:
    """A tiny XLM-R config.json (ids as XLM-R's: <s> 0, <pad> 1, </s> 2)."""
    return {"architectures": ["XLMRobertaModel"], "model_type": "xlm-roberta",
            "vocab_size": vocab, "hidden_size": HIDDEN, "num_hidden_layers": LAYERS,
            "num_attention_heads": HEADS, "intermediate_size": FFN, "hidden_act": "gelu",
            "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1,
            "max_position_embeddings": POSITIONS, "type_vocab_size": 1,
            "initializer_range": 0.02, "layer_norm_eps": 1e-5, "pad_token_id": 1,
            "bos_token_id": 0, "eos_token_id": 2, "position_embedding_type": "absolute"}


def encoder_shapes(vocab: int) -> dict[str, tuple[int, ...]]:
    """XLM-R's parameter names and shapes (no pooler), without transformers."""
    shapes = {"embeddings.word_embeddings.weight": (vocab, HIDDEN),
              "embeddings.position_embeddings.weight": (POSITIONS, HIDDEN),
              "embeddings.token_type_embeddings.weight": (1, HIDDEN),
              "embeddings.LayerNorm.weight": (HIDDEN,), "embeddings.LayerNorm.bias": (HIDDEN,)}
    for i in range(LAYERS):
        p = f"encoder.layer.{i}."
        for name in ("attention.self.query", "attention.self.key", "attention.self.value",
                     "attention.output.dense"):
            shapes[p + name + ".weight"], shapes[p + name + ".bias"] = (HIDDEN, HIDDEN), (HIDDEN,)
        shapes[p + "intermediate.dense.weight"] = (FFN, HIDDEN)
        shapes[p + "intermediate.dense.bias"] = (FFN,)
        shapes[p + "output.dense.weight"] = (HIDDEN, FFN)
        shapes[p + "output.dense.bias"] = (HIDDEN,)
        for norm in ("attention.output.LayerNorm", "output.LayerNorm"):
            shapes[p + norm + ".weight"], shapes[p + norm + ".bias"] = (HIDDEN,), (HIDDEN,)
    return shapes


def state_dict(form: str, vocab: int, hidden_sizes: list[int]) -> dict[str, torch.Tensor]:
    """COMET's state_dict of random weights from SEEDS[form]: normal(0, 0.2), LayerNorm
    weights around 1, the layer-mix scalars spread so that sparsemax and softmax differ."""
    shapes = {"encoder.model." + k: v for k, v in encoder_shapes(vocab).items()}
    for i in range(LAYERS + 1):
        shapes[f"layerwise_attention.scalar_parameters.{i}"] = (1,)
    shapes["layerwise_attention.gamma"] = (1,)
    width = HIDDEN * (6 if form == "regression_metric" else 1)
    for j, size in enumerate([*hidden_sizes, 1]):
        shapes[f"estimator.ff.{3 * j}.weight"] = (size, width)
        shapes[f"estimator.ff.{3 * j}.bias"] = (size,)
        width = size
    g = torch.Generator().manual_seed(SEEDS[form])
    state = {}
    for name in sorted(shapes):
        value = torch.randn(shapes[name], generator=g, dtype=torch.float32)
        if name.endswith("LayerNorm.weight") or name.endswith("gamma"):
            value = 1.0 + 0.1 * value
        elif "scalar_parameters" in name:
            value = 0.6 * value
        else:
            value = 0.2 * value
        state[name] = value.contiguous()
    return state


def hparams(form: str, encoder: Path) -> dict:
    """The hyper-parameters a checkpoint records (hparams.yaml holds the same)."""
    return {"class_identifier": form, "encoder_model": "XLM-RoBERTa",
            "pretrained_model": str(encoder), "hidden_sizes": [16, 8], "activations": "Tanh",
            "final_activation": None, "dropout": 0.1, "nr_frozen_epochs": 0.3,
            "keep_embeddings_frozen": True, "optimizer": "AdamW", "loss": "mse",
            "batch_size": 4, "load_pretrained_weights": False, **FORMS[form]}


def build(root: Path, form: str) -> Path:
    """ROOT/<form>/ as a COMET model directory (see the module docstring); its path."""
    import yaml

    model = Path(root) / form
    encoder = model / "encoder"
    (model / "checkpoints").mkdir(parents=True, exist_ok=True)
    encoder.mkdir(exist_ok=True)
    spm_bytes = train_spm()
    (encoder / "sentencepiece.bpe.model").write_bytes(spm_bytes)
    vocab = _pieces(spm_bytes) + 2  # XLM-R's offset of one, and <mask> at the end
    (encoder / "config.json").write_text(json.dumps(encoder_config(vocab), indent=2))
    hp = hparams(form, encoder.resolve())
    on_disk = dict(hp)
    if form == "unified_metric":
        on_disk["layer_transformation"] = "sparsemax_patch"
    (model / "hparams.yaml").write_text(yaml.safe_dump(on_disk))
    ckpt = {"state_dict": state_dict(form, vocab, hp["hidden_sizes"]), "hyper_parameters": hp,
            "pytorch-lightning_version": "2.0.0", "epoch": 0, "global_step": 0}
    torch.save(ckpt, model / "checkpoints" / "model.ckpt")
    return model


def _pieces(spm_bytes: bytes) -> int:
    """The number of pieces of a SentencePiece model."""
    import sentencepiece as spm

    return spm.SentencePieceProcessor(model_proto=spm_bytes).get_piece_size()


def checksum(model: Path) -> str:
    """SHA-256 of what decides a built model's scores: its weights (names, shapes, bytes), its
    SentencePiece model and config.json."""
    h = hashlib.sha256()
    state = torch.load(Path(model) / "checkpoints" / "model.ckpt", weights_only=True)["state_dict"]
    for name in sorted(state):
        h.update(f"{name}{tuple(state[name].shape)}".encode())
        h.update(state[name].numpy().tobytes())
    for part in ("sentencepiece.bpe.model", "config.json"):
        h.update((Path(model) / "encoder" / part).read_bytes())
    return h.hexdigest()


if __name__ == "__main__":
    out = Path(sys.argv[1])
    for form in FORMS:
        path = build(out, form)
        print(f"{path}: {checksum(path)}")
