"""What nmt.system.private_ops' oneDNN packed linear maps buy: decoding speed with them and with
F.linear (the public API) in their place, rows interleaved, in one process.

The setting of bench_translate.py (the small model, 500 sentences of 25 tokens, batches of 64,
outputs forced to 40 tokens), greedy and beam 4, fp32 (and bf16 where oneDNN runs it), one
PyTorch thread per process as nmt-translate's workers run:

    flock /tmp/nmt-cpu.lock .venv/bin/python scripts/bench_private_ops.py --repeat 3
"""

from __future__ import annotations

import argparse
import time

import torch

import nmt.decoding.affine
import nmt.decoding.fast_model
from nmt.config import ModelConfig, SearchConfig
from nmt.data.tokenizer import SPECIALS
from nmt.decoding.probes import kernel_report
from nmt.engines.translator import Translator
from nmt.model import make_model


def seconds(model, src_ids: list[list[int]], beam: int, dtype: str, packed: bool) -> float:
    """Wall-clock seconds of one decoding run, the model prepared before timing."""
    search = SearchConfig(beam_size=beam, alpha=0.6, max_len_a=0.0, max_len_b=40, min_len=40,
                          max_tokens=10 ** 9, max_sentences=64, dtype=dtype)
    kept = nmt.decoding.fast_model.PACKED_DTYPES
    nmt.decoding.fast_model.PACKED_DTYPES = (dtype,) if packed else ()
    try:  # prepared here, before timing
        translator = Translator([model], SPECIALS, dtype=dtype)
    finally:
        nmt.decoding.fast_model.PACKED_DTYPES = kept
    generator = translator.prepared(dtype)[0].generator
    assert isinstance(generator, nmt.decoding.affine.PackedAffine) == packed
    with translator:
        start = time.perf_counter()
        translator.translate_ids(src_ids, search)
        return time.perf_counter() - start


def main() -> None:
    """Print one line per (dtype, beam): sentences/s without and with packing, and the ratio."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeat", type=int, default=3, help="timed runs per row (best kept)")
    p.add_argument("--sentences", type=int, default=500)
    args = p.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    cfg = ModelConfig(N=3, d_model=256, d_ff=1024, h=4, dropout=0.1)
    model = make_model(cfg, 8000, 8000, 0, True).eval()
    g = torch.Generator().manual_seed(1)
    src_ids = torch.randint(4, 8000, (args.sentences, 25), generator=g).tolist()
    report = kernel_report()
    print("\n".join(report.lines()), flush=True)
    dtypes = ["fp32"] + ["bf16"] * ("bf16" in report.packed)
    for dtype in dtypes:
        for beam in (1, 4):
            best = {False: float("inf"), True: float("inf")}
            for _ in range(args.repeat):
                for packed in (False, True):  # interleaved
                    best[packed] = min(best[packed], seconds(model, src_ids, beam, dtype, packed))
            n = len(src_ids)
            print(f"{dtype} beam {beam}: F.linear {n / best[False]:6.1f} sent/s | packed "
                  f"(private ops) {n / best[True]:6.1f} sent/s | x{best[False] / best[True]:.2f}",
                  flush=True)


if __name__ == "__main__":
    main()
