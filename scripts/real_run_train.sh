#!/usr/bin/env bash
# The real run of nmt-train: the small Transformer on debian-po en-de for a fixed wall-clock
# budget on this machine's CPU cores, then greedy (and beam, when nmt-translate is there)
# BLEU/chrF on the test set with sacreBLEU. Holds /tmp/nmt-cpu.lock so timed runs don't overlap.
#
#   scripts/real_run_train.sh [MINUTES] [RUN_DIR] [DATA_DIR]
#   e.g. scripts/real_run_train.sh 30 work/runs/small-ende work/data/ende8k   (the defaults)
#
# Paths are relative to the repository; the raw corpus is RAW (default: the shared debian-po
# en-de corpus beside the repository, ../shared/data/debian-po/en-de).
#
# Extra nmt-train overrides can be passed in NMT_TRAIN_ARGS, e.g. NMT_TRAIN_ARGS="train.amp=none".
set -euo pipefail
cd "$(dirname "$0")/.."
MINUTES=${1:-30}
RUN=${2:-work/runs/small-ende}
DATA=${3:-work/data/ende8k}
RAW=${RAW:-../shared/data/debian-po/en-de}
BIN=.venv/bin
LOCK=/tmp/nmt-cpu.lock

if [ ! -f "$DATA/manifest.json" ]; then
  flock "$LOCK" "$BIN/nmt-preprocess" src_lang=en tgt_lang=de train="$RAW/train" \
    valid="$RAW/valid" test="$RAW/test" out_dir="$DATA" bpe.vocab_size=8000
fi

# bf16 autocast (the CPU's AVX512-BF16 matmuls), batches of ~2,000 target tokens (more updates
# in a short budget), validation loss every 250 updates, greedy BLEU on 500 valid sentences.
# Pre-norm with a peak learning rate of ~2.8e-3: the post-norm small config (lr_factor 2,
# warmup 1000) stalled at the unigram loss (~7.4) for 750 updates on this data.
# shellcheck disable=SC2086
flock "$LOCK" "$BIN/nmt-train" +model=small data_dir="$DATA" run_dir="$RUN" \
  model.norm=pre optim.lr_factor=1.0 optim.warmup=500 \
  train.max_minutes="$MINUTES" train.amp=bf16 train.max_tokens=2048 \
  train.valid_interval_updates=250 train.save_interval_updates=250 train.keep_last=3 \
  train.valid_bleu=true train.valid_bleu_max_sentences=500 train.log_interval=50 \
  ${NMT_TRAIN_ARGS:-}

# Test set: greedy search with the best checkpoint (by valid loss), scored by sacreBLEU.
flock "$LOCK" "$BIN/python" - "$RUN/checkpoint_best.pt" "$DATA" <<'EOF'
import sys
from pathlib import Path

import torch

from nmt.config import SearchConfig
from nmt.data.tokenizer import Specials, Tokenizer
from nmt.decoding.batches import translate_ids
from nmt.loading import load_model
from nmt.metrics.scoring import score
from nmt.training.checkpoint import load_checkpoint

ckpt, data = sys.argv[1], Path(sys.argv[2])
model, v = load_model(ckpt, weights="model")
model.eval()
src_tok, tgt_tok = Tokenizer(v.src_spm), Tokenizer(v.tgt_spm)
src = (data / "test.clean.en").read_text(encoding="utf-8").split("\n")[:-1]
ref = (data / "test.clean.de").read_text(encoding="utf-8").split("\n")[:-1]
ids = [s[:model.cfg.max_positions - 1] for s in src_tok.encode(src)]
with torch.no_grad():
    out = translate_ids(model, ids, SearchConfig(beam_size=1),
                        Specials(v.bos_id, v.eos_id, v.pad_id), torch.device("cpu"))
hyps = tgt_tok.decode(out)
s = score(hyps, ref)
print(f"test ({len(src)} sentences), greedy, {ckpt} (update {load_checkpoint(ckpt)['update']}):")
print(s.bleu_line)
print(s.chrf_line)
EOF

if "$BIN/python" -c "import nmt.commands.translate" 2>/dev/null; then
  flock "$LOCK" "$BIN/nmt-translate" checkpoint="$RUN/checkpoint_best.pt" \
    input="$DATA/test.clean.en" output="$RUN/test.beam4.de" ref="$DATA/test.clean.de" \
    search.beam_size=4 || true
fi
