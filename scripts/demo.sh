#!/usr/bin/env bash
# The main job end to end on the bundled English-German sample (scripts/data/debian-po):
# preprocess, train the small Transformer for a fixed time, average the last checkpoints,
# translate the test set with beam search, print BLEU and chrF and a few sample translations.
#
#   make demo                     # ~15 minutes on 2 CPU cores
#   DEMO_MINUTES=3 make demo      # a shorter run
#
# Every choice below is there to make a few CPU minutes count; README.md ("The demo") says
# what each buys.
set -euo pipefail
cd "$(dirname "$0")/.."

CORPUS=scripts/data/debian-po/en-de
WORK=${DEMO_DIR:-work/demo}
MINUTES=${DEMO_MINUTES:-11}
mkdir -p "$WORK"
rm -rf "$WORK/run"  # the demo always trains from scratch

echo "== 1/5 preprocess: joint SentencePiece BPE (4k), clean, binarize"
nmt-preprocess src_lang=en tgt_lang=de train=$CORPUS/train valid=$CORPUS/valid \
  test=$CORPUS/test out_dir="$WORK/data" bpe.vocab_size=4000 force=true

echo "== 2/5 train: small Transformer for $MINUTES minutes"
nmt-train +model=small data_dir="$WORK/data" run_dir="$WORK/run" \
  train.max_minutes="$MINUTES" train.amp=bf16 train.max_tokens=1536 \
  model.norm=pre optim.lr_factor=0.5 optim.warmup=200 \
  train.save_interval_updates=50 train.keep_last=5 train.valid_interval_updates=600 \
  train.log_interval=100

echo "== 3/5 average the last 5 checkpoints (the final 200 updates)"
nmt-average run_dir="$WORK/run" last=5 output="$WORK/run/averaged.pt"

echo "== 4/5 translate the test set (beam 4) and score"
nmt-translate checkpoint="$WORK/run/averaged.pt" input=$CORPUS/test.en \
  output="$WORK/test.hyp.de" ref=$CORPUS/test.de search.beam_size=4

echo "== 5/5 sample translations"
python - "$CORPUS/test.en" "$WORK/test.hyp.de" "$CORPUS/test.de" <<'PY'
import sys

src, hyp, ref = (open(p, encoding="utf-8").read().splitlines() for p in sys.argv[1:4])
plain = [i for i, s in enumerate(src)  # short plain strings: 3-6 words, letters only
         if 3 <= len(s.split()) <= 6 and all(w.isalpha() for w in s.split())]
for i in plain[:8]:
    print(f"  source     {src[i]}\n  nmt        {hyp[i]}\n  reference  {ref[i]}\n")
PY
