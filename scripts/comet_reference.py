"""Unbabel's COMET scores of the tiny models nmt/testing/comet_models.py builds (parity test).

Runs in .venv-comet (make test-comet), where unbabel-comet 2.2.7 lives: it cannot share nmt's
venv (it pins transformers<5 and numpy<2). For each form it loads MODELS/<form> with
comet.load_from_checkpoint and writes `predict`'s scores of its LINES to OUT (JSON),
with the models' checksums and the versions that made them:

  .venv-comet/bin/python scripts/comet_reference.py build/comet/models build/comet/scores.json

Copy OUT to tests/data/comet_scores.json to record a new reference for `make test`.
"""

from __future__ import annotations

import json
import sys
from importlib.metadata import version
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # nmt/ of this checkout

from nmt.testing.comet_models import FORMS, LINES, checksum  # noqa: E402


def main(models: Path, out: Path) -> None:
    """Score LINES with each form's model; write the JSON record."""
    from comet import load_from_checkpoint

    record = {"lines": LINES, "checksums": {}, "scores": {},
              "versions": {p: version(p) for p in ("unbabel-comet", "torch", "transformers",
                                                     "pytorch-lightning")}}
    for form in FORMS:
        model = load_from_checkpoint(str(models / form / "checkpoints" / "model.ckpt"),
                                     local_files_only=True)
        keys = ("src", "mt", "ref") if form == "regression_metric" else ("src", "mt")
        data = [dict(zip(keys, row, strict=True))
                for row in zip(*(LINES[k] for k in keys), strict=True)]
        prediction = model.predict(data, batch_size=4, gpus=0, progress_bar=False)
        record["scores"][form] = [float(s) for s in prediction.scores]
        record["checksums"][form] = checksum(models / form)
        print(f"unbabel-comet {form}: {record['scores'][form]}")
    out.write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
