#!/usr/bin/env bash
# Tagged back-translation (Sennrich et al. 2016; Edunov et al. 2018; Caswell et al. 2019): a
# target-to-source model translates monolingual target text into synthetic sources; the
# synthetic pairs, each source tagged <BT>, train the source-to-target model beside the real
# ones. A baseline trains the same final model on the same data directory without them.
#
#   scripts/recipes/backtranslation.sh [--dry-run] [WORK_DIR]    # default work/backtranslation
#
#   1 real/mono    the real pairs; the monolingual target text (MONO=FILE), or else the target
#                  side of the last HOLD_PAIRS training pairs, held aside from the real ones
#   2 reverse      nmt-preprocess TGT->SRC, nmt-train, nmt-average: the back-translation model
#   3 backtranslate  nmt-translate the monolingual text into synthetic sources (BT_SEARCH)
#   4 preprocess   SRC->TGT: train=[real, {path: synthetic, tag: '<BT>', weight: BT_WEIGHT}];
#                  one SentencePiece model for both, <BT> a user-defined piece of it
#   5 bt           nmt-train, nmt-average, nmt-translate the test split: BLEU and chrF
#   6 baseline     the same on the same data with train.corpus_weights=[1,0] (BASELINE=0: skip)
#
# The environment picks the data and the sizes (defaults in brackets):
#   CORPUS [scripts/data/debian-po/en-de]  PFX of PFX/{train,valid,test}.{SRC,TGT}
#   SRC, TGT [en, de]        the languages
#   MONO []                  monolingual TGT text, one sentence a line ("": hold pairs aside)
#   HOLD_PAIRS [20000]       without MONO: training pairs held aside as monolingual text
#   REAL_PAIRS [0]           real pairs kept (the first ones; 0: all those not held aside)
#   MINUTES [4]              minutes of each training (+recipe=cpu20, the tiny model)
#   BT_SEARCH [beam]         beam (beam 4) or sampling (unrestricted sampling, Edunov et al.)
#   BT_WEIGHT [1]            the synthetic corpus's sampling weight
#
# --dry-run (or NMT_DRY_RUN=1) prints every command on stderr and, for each nmt-* step, its
# composed and validated config under "### STEP" on stdout, and stops before any work
# (tests/system/test_recipes.py). docs/backtranslation.md: a run in miniature and what it measured.
set -euo pipefail

if [ "${1:-}" = --dry-run ]; then
  NMT_DRY_RUN=1; shift
fi
DRY=${NMT_DRY_RUN:-}
WORK=${1:-work/backtranslation}
CORPUS=${CORPUS:-scripts/data/debian-po/en-de}
SRC=${SRC:-en}
TGT=${TGT:-de}
MONO=${MONO:-}
HOLD_PAIRS=${HOLD_PAIRS:-20000}
REAL_PAIRS=${REAL_PAIRS:-0}
MINUTES=${MINUTES:-4}
BT_SEARCH=${BT_SEARCH:-beam}
BT_WEIGHT=${BT_WEIGHT:-1}
BASELINE=${BASELINE:-1}
case "$BT_SEARCH" in
  beam) SEARCH=(search.beam_size=4) ;;
  sampling) SEARCH=(search.sampling=true search.nbest=1 search.top_k=0 search.top_p=1) ;;
  *) echo "backtranslation.sh: error: unknown BT_SEARCH '$BT_SEARCH' (beam or sampling)" >&2
    exit 2 ;;
esac
source "$(dirname "${BASH_SOURCE[0]}")/steps.sh"  # corpus_file, text, q, words, step, shell

for side in "$SRC" "$TGT"; do
  if [ ! -f "$(corpus_file "$CORPUS/train.$side")" ]; then
    echo "backtranslation.sh: error: $CORPUS/train.$side: no such file (CORPUS=PFX of" \
      "PFX/train.$SRC and PFX/train.$TGT, or their .xz, .gz or .bz2)" >&2
    exit 2
  fi
done
TRAIN_SRC=$(corpus_file "$CORPUS/train.$SRC")
TRAIN_TGT=$(corpus_file "$CORPUS/train.$TGT")
if [ -n "$MONO" ]; then
  KEEP=$(bash -c "$(text "$TRAIN_SRC")" | wc -l)
else
  KEEP=$(( $(bash -c "$(text "$TRAIN_SRC")" | wc -l) - HOLD_PAIRS ))
fi
[ "$REAL_PAIRS" -gt 0 ] && [ "$REAL_PAIRS" -lt "$KEEP" ] && KEEP=$REAL_PAIRS
if [ "$KEEP" -le 0 ]; then
  echo "backtranslation.sh: error: HOLD_PAIRS=$HOLD_PAIRS leaves no real pairs in" \
    "$CORPUS/train.$SRC" >&2
  exit 2
fi


TRAIN=(+recipe=cpu20 train.max_minutes="$MINUTES" train.save_interval_updates=100
  train.keep_last=5 train.valid_interval_updates=1000)
REVERSE=$WORK/reverse
DATA=$WORK/data

[ -n "$DRY" ] || mkdir -p "$WORK"
# 1: the real pairs and the monolingual text
shell "$(text "$TRAIN_SRC") | head -n $KEEP > $(q "$WORK/real.$SRC")"
shell "$(text "$TRAIN_TGT") | head -n $KEEP > $(q "$WORK/real.$TGT")"
if [ -n "$MONO" ]; then
  shell "cp $(q "$MONO") $(q "$WORK/mono.$TGT")"
else
  shell "$(text "$TRAIN_TGT") | tail -n $HOLD_PAIRS > $(q "$WORK/mono.$TGT")"
fi

# 2: the back-translation model, TGT -> SRC
step preprocess_reverse nmt-preprocess src_lang="$TGT" tgt_lang="$SRC" train="$WORK/real" \
  valid="$CORPUS/valid" out_dir="$REVERSE/data" bpe.vocab_size=4000 force=true
step train_reverse nmt-train data_dir="$REVERSE/data" run_dir="$REVERSE/run" "${TRAIN[@]}"
step average_reverse nmt-average run_dir="$REVERSE/run" last=5 output="$REVERSE/averaged.pt"

# 3: synthetic sources for the monolingual text
step backtranslate nmt-translate checkpoint="$REVERSE/averaged.pt" input="$WORK/mono.$TGT" \
  output="$WORK/synthetic.$SRC" "${SEARCH[@]}"
shell "cp $(q "$WORK/mono.$TGT") $(q "$WORK/synthetic.$TGT")"

# 4: real and tagged synthetic pairs in one data directory
step preprocess nmt-preprocess src_lang="$SRC" tgt_lang="$TGT" \
  "train=[$WORK/real,{path:$WORK/synthetic,tag:'<BT>',weight:$BT_WEIGHT}]" \
  valid="$CORPUS/valid" test="$CORPUS/test" out_dir="$DATA" bpe.vocab_size=4000 force=true

# 5 and 6: the final model with the synthetic pairs, and without them
final() {  # final NAME OPTIONS...: train, average, translate and score the test split
  local name=$1; shift
  step "train_$name" nmt-train data_dir="$DATA" run_dir="$WORK/$name" "${TRAIN[@]}" "$@"
  step "average_$name" nmt-average run_dir="$WORK/$name" last=5 output="$WORK/$name/averaged.pt"
  step "translate_$name" nmt-translate checkpoint="$WORK/$name/averaged.pt" \
    input="$(corpus_file "$CORPUS/test.$SRC")" output="$WORK/$name/test.hyp.$TGT" \
    ref="$(corpus_file "$CORPUS/test.$TGT")" \
    search.beam_size=4
}
final bt
[ "$BASELINE" = 0 ] || final baseline "train.corpus_weights=[1,0]"
