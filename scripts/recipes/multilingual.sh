#!/usr/bin/env bash
# One model for en->de, en->fr, de->en and fr->en against four bilingual models given the same
# compute in all, and zero-shot de<->fr beside the pivot through English (issue 32, item 5).
#
#   scripts/recipes/multilingual.sh [--dry-run] [WORK_DIR]    # default work/multilingual
#
#   1 multi       nmt-preprocess of the four directions (en-de and en-fr, each both ways) into
#                 one data directory (valid and test sentences of every pair held out of all
#                 training data); nmt-train +recipe=cpu20 for MULTI_MINUTES with
#                 train.temperature=TEMPERATURE; nmt-average
#   2 test        nmt-translate each direction's test split with tgt_lang= (beam 4): BLEU, chrF
#   3 bilingual   per direction: nmt-preprocess, nmt-train +recipe=cpu20 for BI_MINUTES,
#                 nmt-average, nmt-translate the same test split (BI=0: skip)
#   4 zero-shot   en-de's and en-fr's test splits joined on their English side (de-fr pairs);
#                 de->fr and fr->de directly (tgt_lang=) and through English (two steps)
#   5 table       BLEU / chrF of every output, updates, and the zero-shot outputs' share in
#                 the target language (scripts/recipes/multilingual.py)
#
# The environment (defaults in brackets):
#   CORPORA [../shared/data/debian-po]  holding en-de/{train,valid,test}.{en,de} and en-fr/...
#   MULTI_MINUTES [40]  BI_MINUTES [10]  TEMPERATURE [1]  VOCAB [8000]  BI [1]
#
# --dry-run (or NMT_DRY_RUN=1) prints every command on stderr and, for each nmt-* step, its
# composed and validated config under "### STEP" on stdout, and stops before any work
# (tests/system/test_recipes.py).
set -euo pipefail

if [ "${1:-}" = --dry-run ]; then
  NMT_DRY_RUN=1; shift
fi
DRY=${NMT_DRY_RUN:-}
WORK=${1:-work/multilingual}
CORPORA=${CORPORA:-../shared/data/debian-po}
MULTI_MINUTES=${MULTI_MINUTES:-40}
BI_MINUTES=${BI_MINUTES:-10}
TEMPERATURE=${TEMPERATURE:-1}
VOCAB=${VOCAB:-8000}
BI=${BI:-1}
DIRECTIONS=(en-de de-en en-fr fr-en)

for pair in en-de en-fr; do
  for split in train valid test; do
    for lang in en "${pair#en-}"; do
      if [ ! -f "$CORPORA/$pair/$split.$lang" ]; then
        echo "multilingual.sh: error: $CORPORA/$pair/$split.$lang: no such file (CORPORA:" \
          "the folder of en-de/ and en-fr/)" >&2
        exit 2
      fi
    done
  done
done

source "$(dirname "${BASH_SOURCE[0]}")/steps.sh"  # corpus_file, text, q, words, step, shell

pfx() {  # pfx SRC-TGT SPLIT: the corpus prefix of a direction's split
  local src=${1%-*} tgt=${1#*-}
  if [ "$src" = en ]; then echo "$CORPORA/en-$tgt/$2"; else echo "$CORPORA/en-$src/$2"; fi
}

corpora() {  # corpora SPLIT: nmt-preprocess's list of the four directions' corpora
  local out=() d
  for d in "${DIRECTIONS[@]}"; do
    out+=("{path:'$(pfx "$d" "$1")',src_lang:${d%-*},tgt_lang:${d#*-}}")
  done
  local IFS=,
  echo "[${out[*]}]"
}

TRAIN=(+recipe=cpu20 train.save_interval_updates=100 train.keep_last=5)
[ -n "$DRY" ] || mkdir -p "$WORK"

# 1: the multilingual model
step preprocess_multi nmt-preprocess src_lang=src tgt_lang=tgt out_dir="$WORK/multi/data" \
  "train=$(corpora train)" "valid=$(corpora valid)" "test=$(corpora test)" \
  bpe.vocab_size="$VOCAB" force=true
step train_multi nmt-train data_dir="$WORK/multi/data" run_dir="$WORK/multi/run" "${TRAIN[@]}" \
  train.max_minutes="$MULTI_MINUTES" train.temperature="$TEMPERATURE"
step average_multi nmt-average run_dir="$WORK/multi/run" last=5 output="$WORK/multi/averaged.pt"

# 2 and 3: each direction's test split, by the multilingual and by a bilingual model
for d in "${DIRECTIONS[@]}"; do
  src=${d%-*} tgt=${d#*-}
  test=$(pfx "$d" test)
  step "translate_multi_$d" nmt-translate checkpoint="$WORK/multi/averaged.pt" tgt_lang="$tgt" \
    input="$test.$src" ref="$test.$tgt" output="$WORK/multi/test.$d.$tgt" search.beam_size=4
  [ "$BI" = 0 ] && continue
  step "preprocess_$d" nmt-preprocess src_lang="$src" tgt_lang="$tgt" \
    train="$(pfx "$d" train)" valid="$(pfx "$d" valid)" test="$test" \
    out_dir="$WORK/$d/data" bpe.vocab_size=4000 force=true
  step "train_$d" nmt-train data_dir="$WORK/$d/data" run_dir="$WORK/$d/run" "${TRAIN[@]}" \
    train.max_minutes="$BI_MINUTES"
  step "average_$d" nmt-average run_dir="$WORK/$d/run" last=5 output="$WORK/$d/averaged.pt"
  step "translate_$d" nmt-translate checkpoint="$WORK/$d/averaged.pt" input="$test.$src" \
    ref="$test.$tgt" output="$WORK/$d/test.$tgt" search.beam_size=4
done

# 4: zero-shot de<->fr on the test pairs that share their English side, and the pivot
ZS=$WORK/zero-shot
shell "export LC_ALL=C && mkdir -p '$ZS' && paste '$CORPORA/en-de/test.en' '$CORPORA/en-de/test.de' | sort -t\$'\\t' -k1,1 > '$ZS/de.tsv' && paste '$CORPORA/en-fr/test.en' '$CORPORA/en-fr/test.fr' | sort -t\$'\\t' -k1,1 > '$ZS/fr.tsv' && join -t\$'\\t' '$ZS/de.tsv' '$ZS/fr.tsv' | awk -F'\\t' '!seen[\$1]++' > '$ZS/joined.tsv' && cut -f2 '$ZS/joined.tsv' > '$ZS/test.de' && cut -f3 '$ZS/joined.tsv' > '$ZS/test.fr'"
for d in de-fr fr-de; do
  src=${d%-*} tgt=${d#*-}
  step "zero_shot_$d" nmt-translate checkpoint="$WORK/multi/averaged.pt" tgt_lang="$tgt" \
    input="$ZS/test.$src" ref="$ZS/test.$tgt" output="$ZS/direct.$d.$tgt" search.beam_size=4
  step "pivot_$d-en" nmt-translate checkpoint="$WORK/multi/averaged.pt" tgt_lang=en \
    input="$ZS/test.$src" output="$ZS/pivot.$d.en" search.beam_size=4
  step "pivot_$d" nmt-translate checkpoint="$WORK/multi/averaged.pt" tgt_lang="$tgt" \
    input="$ZS/pivot.$d.en" ref="$ZS/test.$tgt" output="$ZS/pivot.$d.$tgt" search.beam_size=4
done

# 5: the tables (docs/results.md, "Many languages")
shell "$(words python "$(dirname "$0")/multilingual.py" "$WORK" "$CORPORA")"
