#!/usr/bin/env bash
# The main job end to end on the bundled English-German corpus (scripts/data/debian-po, all
# 362,019 training pairs, xz-compressed): preprocess, train the cpu20 recipe for a fixed time,
# average the last checkpoints, translate the whole test split with beam search, print BLEU and
# chrF and a few sample translations.
#
#   make demo                     # ~14 minutes on 2 CPU cores (12 of them training)
#   DEMO_MINUTES=3 make demo      # a shorter run
#
# The recipe is configs/recipe/cpu20.yaml, the best found for a few CPU minutes
# (docs/results.md, "The demo" and "The best 20 minutes on 2 CPU cores").
set -euo pipefail
cd "$(dirname "$0")/.."

CORPUS=scripts/data/debian-po/en-de
WORK=${DEMO_DIR:-work/demo}
MINUTES=${DEMO_MINUTES:-12}
mkdir -p "$WORK"
rm -rf "$WORK/run"  # the demo always trains from scratch

echo "== 1/5 preprocess: read the .xz files, clean, joint SentencePiece BPE (4,000 pieces), binarize"
nmt-preprocess src_lang=en tgt_lang=de train=$CORPUS/train valid=$CORPUS/valid \
  test=$CORPUS/test out_dir="$WORK/data" bpe.vocab_size=4000 force=true

echo "== 2/5 train: +recipe=cpu20 (the tiny Transformer, 1+1 layers) for $MINUTES minutes"
nmt-train +recipe=cpu20 data_dir="$WORK/data" run_dir="$WORK/run" \
  train.max_minutes="$MINUTES"

# (fewer where a slow or busy machine saved fewer: one every 500 updates)
SAVED=$(find "$WORK/run" -name 'checkpoint_[0-9]*.pt' | wc -l)
LAST=$(( SAVED < 3 ? SAVED : 3 ))
echo "== 3/5 average the last $LAST checkpoints"
nmt-average run_dir="$WORK/run" last=$LAST output="$WORK/run/averaged.pt"

echo "== 4/5 translate the test split (2,000 sentences, beam 4) and score"
# one decoding process on every core: two workers hold 1.24 GB between them (torch and the
# model in each), one 0.72 GB, which keeps the demo under 1 GB (docs/results.md, "Compiled
# training on the CPU")
nmt-translate checkpoint="$WORK/run/averaged.pt" input=$CORPUS/test.en.xz \
  output="$WORK/test.hyp.de" ref=$CORPUS/test.de.xz search.beam_size=4 search.alpha=1.5 \
  workers=1

echo "== 5/5 sample translations: common short strings"
python - "$CORPUS/train.en.xz" "$CORPUS/test.en.xz" "$WORK/test.hyp.de" "$CORPUS/test.de.xz" <<'PY'
import collections
import sys

import sacrebleu

from nmt.system.files import read_lines

train, src, hyp, ref = (read_lines(p) for p in sys.argv[1:5])
# common short strings: 2-6 words, letters only, every word among the training set's 1,000
# most frequent English words (chosen by this rule, not by how well they are translated)
counts = collections.Counter(w.lower() for line in train for w in line.split() if w.isalpha())
common = {w for w, _ in counts.most_common(1000)}
pick = [i for i, s in enumerate(src)
        if 2 <= len(s.split()) <= 6 and all(w.isalpha() and w.lower() in common for w in s.split())]
h, r = [hyp[i] for i in pick], [[ref[i] for i in pick]]
print(f"{len(pick)} common short strings in the test set: BLEU {sacrebleu.corpus_bleu(h, r).score:.2f}"
      f" chrF {sacrebleu.corpus_chrf(h, r).score:.2f}\n")
for i in pick[:10]:
    print(f"  source     {src[i]}\n  nmt        {hyp[i]}\n  reference  {ref[i]}\n")
PY
