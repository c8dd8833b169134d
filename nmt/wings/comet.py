"""COMET (Rei et al. 2020, 2022): a translation's quality estimated by a regression head on
XLM-R sentence embeddings, from a local copy of an Unbabel model directory.

Two forms, as Unbabel's `unbabel-comet` 2.2.7 computes them (comet/models/...):
- reference-based (COMET-22, wmt22-comet-da, class_identifier regression_metric): source,
  translation and reference are embedded apart (the encoder's layers mixed, then pooled),
  and the head reads [mt; ref; mt*ref; |mt-ref|; mt*src; |mt-src|];
- reference-free (CometKiwi, wmt22-cometkiwi-da, unified_metric): "<s> mt </s></s> src </s>"
  is embedded as one sequence and the head reads its first position.

A model directory holds hparams.yaml and checkpoints/model.ckpt (a Lightning checkpoint, read
with weights_only=True). The encoder's config.json and tokenizer (sentencepiece.bpe.model or
tokenizer.json) are read from hparams' pretrained_model when that is a local directory, else
from MODEL_DIR/<its last path part> (e.g. wmt22-comet-da/xlm-roberta-large/): nothing is
downloaded. Needs transformers (the `comet` extra).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import torch
from torch import nn

from nmt.errors import NmtError, first_line

# class_identifier -> whether the form needs references
FORMS = {"regression_metric": True, "unified_metric": False}
BATCH = 16  # sentences per encoder batch, after sorting by length (Unbabel's default)
PROGRESS_AT = 512  # a progress bar on stderr from this many sentences on


@dataclass(frozen=True)
class CometSpec:
    """What nmt reads of a COMET model's hyper-parameters."""

    form: str  # class_identifier: regression_metric or unified_metric
    pool: str  # avg or cls (unified_metric: cls)
    layer: str | int  # "mix" (the layer-wise mixture) or one layer's index
    sparsemax: bool  # the mixture's weights by sparsemax (else softmax)
    layer_norm: bool  # each layer normalised over a sentence's tokens before mixing
    hidden_sizes: tuple[int, ...]  # the head's hidden layers
    activation: str  # the head's activation, a torch.nn class name (Tanh)
    final_activation: str | None  # after the head's last layer (None: none)
    encoder_dir: Path  # the encoder's config.json and tokenizer

    @property
    def needs_reference(self) -> bool:
        """Whether the form scores against references (COMET-22) or without (CometKiwi)."""
        return FORMS[self.form]


def sparsemax(z: torch.Tensor) -> torch.Tensor:
    """Sparsemax of a vector (Martins and Astudillo 2016): its Euclidean projection onto the
    probability simplex, max(z - tau, 0) with sum 1."""
    zs, _ = torch.sort(z, descending=True)
    cumulative = zs.cumsum(0)
    k = torch.arange(1, len(z) + 1, dtype=z.dtype, device=z.device)
    support = (1 + k * zs) > cumulative  # true for the first k(z) entries
    k_z = support.sum()
    tau = (cumulative[k_z - 1] - 1) / k_z
    return torch.clamp(z - tau, min=0)


class LayerMix(nn.Module):
    """COMET's layer-wise attention without dropout: gamma * sum_k w_k h_k, w the softmax or
    sparsemax of one scalar per layer; with layer_norm, each h_k first normalised by the mean
    and variance over a sentence's unmasked positions and features (eps 1e-12)."""

    def __init__(self, layers: int, sparse: bool, layer_norm: bool):
        super().__init__()
        self.scalar_parameters = nn.ParameterList(
            [nn.Parameter(torch.zeros(1)) for _ in range(layers)])
        self.gamma = nn.Parameter(torch.ones(1))
        self.sparse, self.layer_norm = sparse, layer_norm

    def forward(self, layers: tuple[torch.Tensor, ...], mask: torch.Tensor) -> torch.Tensor:
        """(B, S, H) per layer, mask (B, S) -> (B, S, H)."""
        raw = torch.cat(list(self.scalar_parameters))  # (L,)
        weights = sparsemax(raw) if self.sparse else torch.softmax(raw, dim=0)
        if self.layer_norm:
            m = mask.to(layers[0].dtype)[:, :, None]  # (B, S, 1)
            count = m.sum((1, 2)) * layers[0].shape[-1]  # (B,) values per sentence
            layers = tuple(_masked_norm(h, m, count) for h in layers)
        return self.gamma * sum(w * h for w, h in zip(weights, layers, strict=True))


def _masked_norm(h: torch.Tensor, m: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    """h (B, S, H) minus its mean over the unmasked values of each sentence, divided by their
    standard deviation."""
    mean = ((h * m).sum((1, 2)) / count)[:, None, None]  # (B, 1, 1)
    var = ((((h * m) - mean) * m) ** 2).sum((1, 2)) / count
    return (h - mean) / torch.sqrt(var + 1e-12)[:, None, None]


def feed_forward(in_dim: int, spec: CometSpec) -> nn.Sequential:
    """COMET's estimator: Linear, activation, Dropout per hidden size, then Linear to one
    score (and the final activation); the same indices as its estimator.ff."""
    act = getattr(nn, spec.activation.title(), None)
    if act is None:
        raise NmtError(f"COMET activation {spec.activation!r} is no torch.nn activation")
    layers, width = [], in_dim
    for size in spec.hidden_sizes:
        layers += [nn.Linear(width, size), act(), nn.Dropout(0.0)]
        width = size
    layers.append(nn.Linear(width, 1))
    if spec.final_activation:
        layers.append(getattr(nn, spec.final_activation.title())())
    return nn.Sequential(*layers)


class Comet(nn.Module):
    """A loaded COMET model: score(), qe(), and for MBR embed() and estimate()."""

    def __init__(self, spec: CometSpec, encoder: nn.Module, tokenizer, name: str):
        super().__init__()
        self.spec, self.encoder, self.tokenizer, self.name = spec, encoder, tokenizer, name
        hidden, layers = encoder.config.hidden_size, encoder.config.num_hidden_layers + 1
        self.mix = LayerMix(layers, spec.sparsemax, spec.layer_norm) if (
            spec.layer == "mix") else None
        self.estimator = feed_forward(hidden * (6 if spec.needs_reference else 1), spec)
        # XLM-R's positions start after the padding index: max_position_embeddings - 2 in all
        self.max_positions = encoder.config.max_position_embeddings - 2
        self.pad_id = tokenizer.pad_token_id
        self.cls_id, self.sep_id = tokenizer.cls_token_id, tokenizer.sep_token_id

    @property
    def device(self) -> torch.device:
        """Where the weights are."""
        return self.estimator[0].weight.device

    def _ids(self, texts: list[str]) -> list[list[int]]:
        """<s> pieces </s> per text, cut to max_positions - 2 tokens as Unbabel's tokenizer
        call does."""
        out = self.tokenizer(texts, truncation=True, max_length=self.max_positions - 2)
        return out["input_ids"]

    def _pad(self, rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """Token rows -> ids (B, S) padded with <pad>, and their mask (B, S)."""
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, :len(r)] = torch.tensor(r)
        return ids.to(self.device), (ids != self.pad_id).long().to(self.device)

    def _embed_rows(self, rows: list[list[int]]) -> torch.Tensor:
        """Pooled sentence embeddings (B, H) of one batch of token rows."""
        ids, mask = self._pad(rows)
        out = self.encoder(input_ids=ids, attention_mask=mask, output_hidden_states=True)
        layers = out.hidden_states  # L + 1 tensors (B, S, H): embeddings, then each layer
        h = self.mix(layers, mask) if self.mix is not None else layers[self.spec.layer]
        if self.spec.pool == "cls":
            return h[:, 0]
        keep = mask[:, :, None].to(h.dtype)  # (B, S, 1)
        if self.spec.pool == "max":
            return h.masked_fill(keep == 0, float("-inf")).max(1).values
        return (h * keep).sum(1) / keep.sum(1)  # avg

    def _by_length(self, rows: list[list[int]], progress: bool, fn) -> list:
        """fn (a batch of token rows -> one output per row) over batches of BATCH rows sorted
        by length, longest first; the outputs in input order."""
        order = sorted(range(len(rows)), key=lambda i: -len(rows[i]))
        out: list = [None] * len(rows)
        bar = _bar(len(rows), progress)
        for start in range(0, len(order), BATCH):
            batch = order[start:start + BATCH]
            for i, e in zip(batch, fn([rows[i] for i in batch]), strict=True):
                out[i] = e
            if bar is not None:
                bar.update(len(batch))
        if bar is not None:
            bar.close()
        return out

    @torch.no_grad()
    def _embed_all(self, rows: list[list[int]], progress: bool) -> torch.Tensor:
        """Embeddings (N, H) of token rows, batched by length, in input order."""
        out = self._by_length(rows, progress, self._embed_rows)
        return torch.stack(out) if out else torch.zeros(0, self.encoder.config.hidden_size,
                                                        device=self.device)

    def embed(self, texts: list[str], progress: bool = False) -> torch.Tensor:
        """Sentence embeddings (N, H) of texts, each embedded apart (the reference-based form's
        inputs): what estimate() combines."""
        return self._embed_all(self._ids(texts), progress)

    @torch.no_grad()
    def estimate(self, src: torch.Tensor, mt: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
        """The reference-based head on embeddings (N, H) each -> scores (N,)."""
        feats = torch.cat([mt, ref, mt * ref, (mt - ref).abs(), mt * src, (mt - src).abs()],
                          dim=1)  # (N, 6H)
        return self.estimator(feats).view(-1)

    def score(self, sources: list[str], hypotheses: list[str], references: list[str],
              progress: bool = False) -> list[float]:
        """COMET-22 of each hypothesis against its reference; each distinct text embedded once."""
        _check_lengths(sources, hypotheses, references)
        if not self.spec.needs_reference:
            return self.qe(sources, hypotheses, progress)
        unique = list(dict.fromkeys([*sources, *hypotheses, *references]))
        where = {t: i for i, t in enumerate(unique)}
        emb = self.embed(unique, progress)  # (U, H)

        def rows(texts: list[str]) -> torch.Tensor:
            return emb[torch.tensor([where[t] for t in texts], dtype=torch.long)]

        return self.estimate(rows(sources), rows(hypotheses), rows(references)).tolist()

    @torch.no_grad()
    def qe(self, sources: list[str], hypotheses: list[str], progress: bool = False
           ) -> list[float]:
        """CometKiwi's reference-free score of each hypothesis given its source."""
        _check_lengths(sources, hypotheses)
        if self.spec.needs_reference:
            raise NmtError(f"{self.name} is a reference-based COMET ({self.spec.form}): "
                           "reference-free scores need a CometKiwi (unified_metric) model")
        rows = [self._joined(m, s) for m, s in zip(self._ids(hypotheses), self._ids(sources),
                                                   strict=True)]
        return self._by_length(rows, progress,
                               lambda b: self.estimator(self._embed_rows(b)).view(-1).tolist())

    def _joined(self, mt: list[int], src: list[int]) -> list[int]:
        """<s> mt </s></s> src </s>, cut to max_positions tokens when the two are longer than
        max_positions - 5 (Unbabel's concat_sequences)."""
        row = [self.cls_id, *mt[1:-1], self.sep_id, self.sep_id, *src[1:-1], self.sep_id]
        if len(mt) + len(src) - 4 > self.max_positions - 5:
            row = row[:self.max_positions]
        return row


def _check_lengths(*streams: list[str]) -> None:
    """The streams have one line each for the same pairs."""
    if len({len(s) for s in streams}) > 1:
        raise NmtError(f"COMET: the streams differ in length: {[len(s) for s in streams]}")


def _bar(total: int, progress: bool):
    """A tqdm bar on stderr for long runs (None below PROGRESS_AT sentences)."""
    if not progress or total < PROGRESS_AT:
        return None
    from tqdm import tqdm

    return tqdm(total=total, unit="sent", desc="COMET", leave=False, disable=None)


# ----------------------------------------------------------------------------- loading
def read_spec(model_dir: Path, hparams: dict, patched: bool) -> CometSpec:
    """The spec of a model's hyper-parameters (the checkpoint's, over hparams.yaml's);
    patched: hparams.yaml says layer_transformation: sparsemax_patch, Unbabel's mark of
    models trained with a softmax (their issue 244)."""
    form = hparams.get("class_identifier")
    if form not in FORMS:
        raise NmtError(f"{model_dir}: class_identifier {form!r} is not a COMET form nmt reads: "
                       "give a wmt22-comet-da (regression_metric) or a wmt22-cometkiwi-da "
                       "(unified_metric) model directory")
    if form == "unified_metric" and (hparams.get("word_level_training")
                                     or "src" not in hparams.get("input_segments", ["src"])):
        raise NmtError(f"{model_dir}: a unified_metric without the source or with word-level "
                       "tags is not a CometKiwi form: give a wmt22-cometkiwi-da model directory")
    layer = hparams.get("sent_layer" if form == "unified_metric" else "layer", "mix")
    pool = "cls" if form == "unified_metric" else hparams.get("pool", "avg")
    if pool not in ("avg", "cls", "max"):
        raise NmtError(f"{model_dir}: pool {pool!r}: nmt reads avg, cls and max")
    return CometSpec(
        form=form, pool=pool, layer=layer,
        sparsemax=hparams.get("layer_transformation", "softmax") == "sparsemax" and not patched,
        layer_norm=bool(hparams.get("layer_norm", False)),
        hidden_sizes=tuple(hparams.get("hidden_sizes", (3072, 1024))),
        activation=hparams.get("activations", "Tanh"),
        final_activation=hparams.get("final_activation"),
        encoder_dir=encoder_dir(model_dir, str(hparams.get("pretrained_model", ""))))


def encoder_dir(model_dir: Path, pretrained: str) -> Path:
    """Where the encoder's config.json and tokenizer are: pretrained_model when it is a local
    directory, else MODEL_DIR/<its last part>."""
    for place in (Path(pretrained), model_dir / Path(pretrained).name):
        if pretrained and (place / "config.json").is_file():
            return place
    raise NmtError(f"{model_dir}: no encoder config for pretrained_model {pretrained!r}: put "
                   f"its config.json and tokenizer in {model_dir / Path(pretrained).name} "
                   f"(docs/commands.md, COMET)")


def read_model_dir(model_dir: str | Path) -> tuple[CometSpec, dict]:
    """A COMET model directory's spec and state_dict; one-line errors for what is missing."""
    root = Path(model_dir)
    ckpt_path, hparams_path = root / "checkpoints" / "model.ckpt", root / "hparams.yaml"
    for path in (hparams_path, ckpt_path):
        if not path.is_file():
            raise NmtError(f"{root}: no {path.relative_to(root)}: give a COMET model directory "
                           "(e.g. huggingface-cli download Unbabel/wmt22-comet-da --local-dir "
                           "DIR; docs/commands.md)")
    yaml_hp = _read_hparams(hparams_path)
    try:
        ckpt = torch.load(ckpt_path, map_location="cpu", weights_only=True)
    except Exception as e:  # a damaged file or one that needs code to load
        raise NmtError(f"{ckpt_path}: cannot be read as a COMET checkpoint: "
                       f"{first_line(e)}") from None
    if not isinstance(ckpt, dict) or "state_dict" not in ckpt:
        raise NmtError(f"{ckpt_path}: no state_dict: not a COMET (Lightning) checkpoint")
    if not isinstance(ckpt.get("hyper_parameters") or {}, dict):
        raise NmtError(f"{ckpt_path}: its hyper_parameters are not a mapping")
    hparams = {**yaml_hp, **(ckpt.get("hyper_parameters") or {})}
    hparams["class_identifier"] = yaml_hp.get("class_identifier",
                                              hparams.get("class_identifier"))
    patched = yaml_hp.get("layer_transformation") == "sparsemax_patch"
    return read_spec(root, hparams, patched), ckpt["state_dict"]


def _read_hparams(path: Path) -> dict:
    """hparams.yaml: a mapping of hyper-parameters ({} where the file is empty); a one-line
    error naming the file where it is not YAML or not a mapping."""
    import yaml

    try:
        hparams = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, ValueError, yaml.YAMLError) as e:  # UnicodeDecodeError is a ValueError
        raise NmtError(f"{path}: cannot be read as YAML: {first_line(e)}") from None
    if not isinstance(hparams, dict):
        raise NmtError(f"{path}: is a YAML {type(hparams).__name__}, not a mapping of "
                       "hyper-parameters: not a COMET model's hparams.yaml")
    return hparams


def _renamed(state: dict) -> dict:
    """COMET's parameter names -> this module's (encoder.model. -> encoder., layerwise_attention.
    -> mix., estimator.ff. -> estimator.)."""
    out = {}
    for key, value in state.items():
        for old, new in (("encoder.model.", "encoder."), ("layerwise_attention.", "mix."),
                         ("estimator.ff.", "estimator.")):
            if key.startswith(old):
                out[new + key[len(old):]] = value
    return out


@cache
def load_comet(model_dir: str, device: str = "cpu") -> Comet:
    """The COMET model of a directory on `device`, in eval mode, loaded once per process."""
    try:
        from transformers import XLMRobertaConfig, XLMRobertaModel, XLMRobertaTokenizer
    except ImportError:
        raise NmtError("COMET needs transformers: pip install 'nmt[comet]'") from None
    spec, state = read_model_dir(model_dir)
    try:
        config = XLMRobertaConfig.from_pretrained(str(spec.encoder_dir), local_files_only=True)
        tokenizer = XLMRobertaTokenizer.from_pretrained(str(spec.encoder_dir),
                                                        local_files_only=True)
    except Exception as e:
        raise NmtError(f"{spec.encoder_dir}: no usable XLM-R config and tokenizer "
                       f"(config.json, sentencepiece.bpe.model or tokenizer.json): "
                       f"{first_line(e)}") from None
    encoder = XLMRobertaModel(config, add_pooling_layer=False)
    model = Comet(spec, encoder, tokenizer, str(model_dir))
    missing, _ = model.load_state_dict(_renamed(state), strict=False)
    if missing:
        raise NmtError(f"{model_dir}: the checkpoint lacks {len(missing)} of the model's "
                       f"weights (e.g. {missing[0]}): not the form its hparams.yaml names")
    bad = [k for k, v in model.state_dict().items() if v.is_floating_point()
           and not bool(torch.isfinite(v).all())]
    if bad:
        raise NmtError(f"{model_dir}: non-finite weights in {bad[0]}")
    return model.to(device).eval()


def system_score(scores: list[float]) -> float:
    """The mean of segment scores (COMET's system score); nan for none."""
    return sum(scores) / len(scores) if scores else math.nan
