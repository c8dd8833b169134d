"""nmt-export format=onnx against nmt-translate on real sentences: equality and BLEU.

Exports --checkpoint (or reads an existing export, --model), then decodes the source file
greedily three ways: nmt (Translator, search.beam_size=1, its default length limit), and the
export in onnxruntime (CPU, one thread) fp32 and int8, as transformers.js runs it (the encoder
once, the merged decoder a token at a time with its cache:
nmt.wings.interop.onnx_export.OnnxGreedy),
each with nmt's length limit. Prints the export's file sizes, how many of the first
--equal sentences the fp32 and int8 exports decode to nmt's exact text, and the BLEU of the
three against --reference on every line. Timings are not reported: see docs/results.md.

    .venv/bin/python scripts/onnx_parity.py --checkpoint RUN/averaged.pt \\
        --source scripts/data/debian-po/en-de/test.en.xz \\
        --reference scripts/data/debian-po/en-de/test.de.xz
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch

from nmt.commands.export import export
from nmt.config import ExportConfig, SearchConfig
from nmt.decoding.batches import translate_ids
from nmt.decoding.lengths import max_output_lengths
from nmt.engines.translator import Translator
from nmt.metrics.scoring import score
from nmt.system.files import read_lines
from nmt.wings.interop.onnx_export import OnnxGreedy


def parse_args() -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--model", default="", help="an existing export of the checkpoint")
    p.add_argument("--source", required=True)
    p.add_argument("--reference", required=True)
    p.add_argument("--equal", type=int, default=200, help="sentences compared for equality")
    p.add_argument("--lines", type=int, default=0, help="use the first N lines (0: all)")
    return p.parse_args()


def main() -> None:
    """Export, decode three ways, print sizes, equality counts and BLEU."""
    args = parse_args()
    torch.set_num_threads(1)
    sources = read_lines(args.source)
    references = read_lines(args.reference)
    if args.lines:
        sources, references = sources[:args.lines], references[:args.lines]
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(args.model) if args.model else export(ExportConfig(
            checkpoint=args.checkpoint, output=str(Path(tmp) / "onnx"), format="onnx"))
        for path in sorted((model / "onnx").iterdir()):
            print(f"{path.name}: {path.stat().st_size / 1e6:.2f} MB")
        tr = Translator.load(args.checkpoint, dtype=None)
        search = SearchConfig(beam_size=1)
        src = tr.src_tok.encode(sources)
        ours = translate_ids(tr.model, src, search, tr.specials)
        limits = max_output_lengths([len(s) for s in src], search,
                                    tr.model.cfg.max_positions).tolist()
        texts = {"nmt": tr.tgt_tok.decode(ours)}
        for name, quantized in (("onnx fp32", False), ("onnx int8", True)):
            runner = OnnxGreedy(model, quantized=quantized)
            ids = [runner.translate(tr.specials.source(s), n)  # EOS appended where trained so
                   for s, n in zip(src, limits, strict=True)]
            texts[name] = tr.tgt_tok.decode(ids)
            n = min(args.equal, len(src))
            same = sum(a == b for a, b in zip(texts["nmt"][:n], texts[name][:n], strict=True))
            print(f"{name}: {same}/{n} sentences with nmt's text")
        for name, hyps in texts.items():
            print(f"{name}: {score(hyps, references).bleu_line} ({len(hyps)} lines)")


if __name__ == "__main__":
    main()
