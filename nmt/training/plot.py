"""Pictures, drawn with matplotlib (the "plot" extra): a run's learning curves, and the
attention heatmaps of one translated sentence, one PNG per kind (layers x heads), like the
attention visualisation of the Annotated Transformer.

Rows of a decoder map are labelled with the token that position produces, columns with the
tokens it attends to (source pieces + </s>, or <s> + the produced pieces).
"""

from __future__ import annotations

import warnings
from pathlib import Path

from torch import Tensor

from nmt.errors import NmtError

TITLES = {"encoder_self": "Encoder self-attention",
          "decoder_self": "Decoder self-attention (masked)",
          "encoder_decoder": "Encoder-decoder attention"}


def draw(weights: Tensor, rows: list[str], cols: list[str], title: str, path: Path) -> None:
    """One figure: a grid of heatmaps, a row of heads per layer; written atomically to path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    N, h = weights.shape[:2]
    cell = max(2.2, 0.16 * max(len(rows), len(cols)) + 0.8)  # inches per heatmap
    fig, axes = plt.subplots(N, h, figsize=(cell * h + 0.8, cell * N + 0.6), squeeze=False,
                             layout="constrained")
    font = max(4.0, min(8.0, 120 / max(len(rows), len(cols))))
    for layer in range(N):
        for head in range(h):
            ax = axes[layer][head]
            image = ax.imshow(weights[layer, head].numpy(), cmap="viridis", vmin=0.0, vmax=1.0,
                              aspect="auto")
            ax.set_title(f"layer {layer + 1}, head {head + 1}", fontsize=9)
            ax.set_xticks(range(len(cols)), cols, rotation=90, fontsize=font)
            ax.set_yticks(range(len(rows)), rows, fontsize=font)
    fig.colorbar(image, ax=axes, shrink=min(1.0, 3.0 / N + 0.2), label="attention weight")
    fig.suptitle(title)
    save_figure(fig, path)


def save_figure(fig, path: Path) -> None:
    """Write a figure as PNG atomically (temporary file, then rename) and close it."""
    import matplotlib.pyplot as plt

    from nmt.system.files import write_atomically

    try:
        with warnings.catch_warnings():  # glyphs missing from the font are drawn as boxes
            warnings.simplefilter("ignore")
            write_atomically(path, lambda f: fig.savefig(f, dpi=110, format="png"))
    finally:
        plt.close(fig)


def per_direction(ax, valid: list[dict], metric: str) -> None:
    """A multilingual run's per-direction curves of `metric` (keys "loss/en-de" ...), dashed."""
    keys = sorted({k for r in valid for k in r if k.startswith(f"{metric}/")})
    for key in keys:
        points = [(r["update"], r[key]) for r in valid if key in r]
        ax.plot(*zip(*points, strict=True), linestyle="--", linewidth=1,
                label=f"valid {metric} {key.split('/', 1)[1]}")
    if keys:
        ax.legend()


def plot_learning_curves(records: list[dict], path: Path) -> None:
    """Training and validation loss (and validation BLEU when scored) against updates, from
    metrics.jsonl records, as one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    train = [(r["update"], r["loss"]) for r in records if r.get("kind") == "train"]
    valid = [r for r in records if r.get("kind") == "valid"]
    bleu = [(r["update"], r["bleu"]) for r in valid if "bleu" in r]
    fig, axes = plt.subplots(2 if bleu else 1, 1, sharex=True, squeeze=False,
                             figsize=(7, 6 if bleu else 4), layout="constrained")
    ax = axes[0][0]
    if train:
        ax.plot(*zip(*train, strict=True), label="train loss", linewidth=1)
    if valid:
        ema = valid[-1].get("weights") == "ema"
        ax.plot([r["update"] for r in valid], [r["loss"] for r in valid], marker="o",
                label="valid loss (EMA)" if ema else "valid loss")
        per_direction(ax, valid, "loss")
    ax.set_ylabel("label-smoothed loss (nats/token)")
    ax.legend()
    ax.grid(alpha=0.3)
    if bleu:
        axes[1][0].plot(*zip(*bleu, strict=True), marker="o", color="tab:green")
        axes[1][0].set_ylabel("valid BLEU (greedy)")
        per_direction(axes[1][0], valid, "bleu")
        axes[1][0].grid(alpha=0.3)
    axes[-1][0].set_xlabel("update")
    fig.suptitle(path.parent.name)
    save_figure(fig, path)


def plot_attention(engine, src_ids: list[int], out_ids: list[int],
                   out_dir: str | Path) -> list[Path]:
    """Write encoder_self.png, decoder_self.png and encoder_decoder.png into out_dir: the
    attention of the engine's (first) model (nmt.engines.engine) with out_ids
    teacher-forced on src_ids."""
    engine.capabilities.check("attention_plot")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise NmtError("attention_plot needs matplotlib: pip install 'nmt[plot]'") from None
    out_dir = Path(out_dir)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise NmtError(f"{out_dir}: cannot create directory ({e.strerror})") from None
    weights = {kind: w[0] for kind, w in engine.attention([src_ids], [out_ids]).items()}
    src = engine.src_tok.pieces(list(src_ids)) + ["</s>"]
    rows = weights["decoder_self"].shape[-2]  # a full-length output's: no </s> row
    produced = (engine.tgt_tok.pieces(list(out_ids)) + ["</s>"])[:rows]
    fed = ["<s>"] + produced[:-1]
    labels = {"encoder_self": (src, src), "decoder_self": (produced, fed),
              "encoder_decoder": (produced, src)}
    paths = []
    for kind, (rows, cols) in labels.items():
        path = out_dir / f"{kind}.png"
        draw(weights[kind], rows, cols, TITLES[kind], path)
        paths.append(path)
    return paths
