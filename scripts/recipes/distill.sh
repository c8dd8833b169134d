#!/usr/bin/env bash
# Sequence-level knowledge distillation (Kim and Rush 2016), as the students that run on users'
# machines are made (Bergamot, Firefox Translations, OPUS-MT): a teacher larger than the
# student translates part of the training sources; a small student (the tiny shape, or a deep
# encoder with a one-layer decoder) learns from those translations, and ships in int8 with a
# lexical shortlist. The last step scores teacher and student on the test split in one table.
#
#   scripts/recipes/distill.sh [--dry-run] [WORK_DIR]    # default work/distill
#
#   1 part         the first DISTILL_LINES training pairs: the sources the teacher translates
#   2 teacher      nmt-preprocess, nmt-train +model=TEACHER_MODEL, nmt-average on the whole
#                  training split (TEACHER=CKPT: that checkpoint, or ensemble, instead)
#   3 distill      nmt-translate the part's sources with the teacher (DISTILL_SEARCH)
#   4 student      nmt-preprocess the part's sources with the teacher's translations, with a
#                  lexical shortlist (shortlist.k=SHORTLIST_K); nmt-train, nmt-average
#                  (STUDENT_INIT=teacher: from some of the teacher's layers, in its vocabulary,
#                  scripts/recipes/distill.py shrink)
#   5 score        teacher and student on the test split: BLEU, chrF and sentences/s with
#                  search.dtype=int8 at each of SCORE_BEAMS, in nmt and, if installed,
#                  CTranslate2 (the student with its shortlist), one table
#                  (scripts/recipes/distill.py score)
#
# The environment picks the data and the sizes (defaults in brackets):
#   CORPUS [scripts/data/debian-po/en-de]  PFX of PFX/{train,valid,test}.{SRC,TGT}
#   SRC, TGT [en, de]        the languages
#   TEACHER []               a teacher checkpoint, or an ensemble [A.pt,B.pt] ("": train one)
#   TEACHER_MODEL [small]    the teacher's +model= (small: 3+3 layers, d_model 256)
#   TEACHER_MINUTES [60]     the teacher's training time
#   TEACHER_UPDATES []       the teacher's updates instead of minutes (a budget that other
#                            work on the machine slows but does not change)
#   DISTILL_LINES [100000]   training pairs whose sources the teacher translates
#   DISTILL_SEARCH [beam]    beam (beam 4's best) or nbest (of the NBEST-best of a beam of
#                            NBEST, the candidate closest to the reference by sentence chrF,
#                            as Mozilla's pipeline keeps)
#   NBEST [8]                DISTILL_SEARCH=nbest: the candidates per source
#   STUDENT_LAYERS [1+1]     the student's encoder+decoder layers at the tiny shape (d_model 256,
#                            +recipe=cpu20); 6+1: a deep encoder with a one-layer decoder
#   STUDENT_INIT []          teacher: the student starts from the teacher's weights, with its
#                            vocabulary (its embeddings, output layer and STUDENT_LAYERS of its
#                            layers, spread from first to last: "shrink and fine-tune", Shleifer
#                            and Rush 2020); "": from scratch, with a vocabulary of its own
#   STUDENT_MINUTES [20]     the student's training time (cpu20's 20 minutes)
#   STUDENT_UPDATES []       the student's updates instead of minutes
#   SHORTLIST_K [50]         the student's shortlist: target pieces kept per source piece
#   SCORE_BEAMS [4 1]        the beam sizes teacher and student are scored at (1: greedy, as
#                            students ship: sequence-level distillation makes greedy nearly
#                            as good as beam search)
#   VOCAB [4000]             each model's joint SentencePiece vocabulary (bpe.vocab_size)
#   AVERAGE [5]              the last checkpoints averaged (one every 500 updates)
#   COMET []                 a COMET-22 model directory: the table gets a COMET column
#                            (nmt-translate comet=DIR; docs/commands.md, COMET)
#
# --dry-run (or NMT_DRY_RUN=1) prints every command on stderr and, for each nmt-* step, its
# composed and validated config under "### STEP" on stdout (the score step's under
# "### score_MODEL_ENGINE_bBEAM"), and stops before any work (tests/system/test_recipes.py).
# docs/distillation.md: what it does and why.
set -euo pipefail

if [ "${1:-}" = --dry-run ]; then
  NMT_DRY_RUN=1; shift
fi
DRY=${NMT_DRY_RUN:-}
WORK=${1:-work/distill}
HERE=$(dirname "$0")
CORPUS=${CORPUS:-scripts/data/debian-po/en-de}
SRC=${SRC:-en}
TGT=${TGT:-de}
TEACHER=${TEACHER:-}
TEACHER_MODEL=${TEACHER_MODEL:-small}
TEACHER_MINUTES=${TEACHER_MINUTES:-60}
DISTILL_LINES=${DISTILL_LINES:-100000}
DISTILL_SEARCH=${DISTILL_SEARCH:-beam}
NBEST=${NBEST:-8}
STUDENT_LAYERS=${STUDENT_LAYERS:-1+1}
STUDENT_MINUTES=${STUDENT_MINUTES:-20}
STUDENT_INIT=${STUDENT_INIT:-}
TEACHER_UPDATES=${TEACHER_UPDATES:-}
STUDENT_UPDATES=${STUDENT_UPDATES:-}
SHORTLIST_K=${SHORTLIST_K:-50}
AVERAGE=${AVERAGE:-5}
VOCAB=${VOCAB:-4000}
SCORE_BEAMS=${SCORE_BEAMS:-4 1}
COMET=${COMET:-}

fail() {  # fail MESSAGE: a one-line error, exit status 2
  echo "distill.sh: error: $1" >&2
  exit 2
}

case "$DISTILL_SEARCH" in
  beam) SEARCH=(search.beam_size=4) ;;
  nbest) SEARCH=(search.beam_size="$NBEST" search.nbest="$NBEST") ;;
  *) fail "unknown DISTILL_SEARCH '$DISTILL_SEARCH' (beam or nbest)" ;;
esac
case "$STUDENT_INIT" in
  "") INIT=(); VOCAB_OF_STUDENT=(bpe.vocab_size="$VOCAB") ;;
  teacher) INIT=(train.init_from="$WORK/student/init.pt")
    VOCAB_OF_STUDENT=(bpe.model="$WORK/student/teacher.spm.model") ;;
  *) fail "unknown STUDENT_INIT '$STUDENT_INIT' (teacher, or empty: from scratch)" ;;
esac
[[ $STUDENT_INIT != teacher || $TEACHER != \[* ]] ||
  fail "STUDENT_INIT=teacher needs one teacher checkpoint, not an ensemble"
[[ $STUDENT_LAYERS =~ ^([1-9][0-9]*)\+([1-9][0-9]*)$ ]] ||
  fail "STUDENT_LAYERS='$STUDENT_LAYERS' is not ENCODER+DECODER layers, e.g. 1+1 or 6+1"
STUDENT_SHAPE=(model.N="${BASH_REMATCH[1]}" model.N_dec="${BASH_REMATCH[2]}")
for n in DISTILL_LINES NBEST SHORTLIST_K AVERAGE VOCAB; do
  [[ ${!n} =~ ^[1-9][0-9]*$ ]] || fail "$n='${!n}' must be a positive whole number"
done
for n in TEACHER_UPDATES STUDENT_UPDATES; do
  [[ -z ${!n} || ${!n} =~ ^[1-9][0-9]*$ ]] || fail "$n='${!n}' must be a positive whole number"
done
read -ra BEAMS <<< "$SCORE_BEAMS"
[ ${#BEAMS[@]} -gt 0 ] || fail "SCORE_BEAMS is empty (beam sizes, e.g. '4 1')"
for b in "${BEAMS[@]}"; do
  [[ $b =~ ^[1-9][0-9]*$ ]] || fail "SCORE_BEAMS='$SCORE_BEAMS': '$b' is not a beam size"
done
for n in TEACHER_MINUTES STUDENT_MINUTES; do
  [[ ${!n} =~ ^[0-9]*\.?[0-9]+$ && ! ${!n} =~ ^[0.]+$ ]] || fail "$n='${!n}' must be > 0"
done

source "$(dirname "${BASH_SOURCE[0]}")/steps.sh"  # corpus_file, text, q, words, step, shell

for side in "$SRC" "$TGT"; do
  [ -f "$(corpus_file "$CORPUS/train.$side")" ] || fail "$CORPUS/train.$side: no such file" \
    "(CORPUS=PFX of PFX/train.$SRC and PFX/train.$TGT, or their .xz, .gz or .bz2)"
done
TRAIN_SRC=$(corpus_file "$CORPUS/train.$SRC")
TRAIN_TGT=$(corpus_file "$CORPUS/train.$TGT")
TEST_SRC=$(corpus_file "$CORPUS/test.$SRC")
TEST_TGT=$(corpus_file "$CORPUS/test.$TGT")


trained() {  # trained NAME MODEL_OPTIONS...: preprocessed data -> trained, averaged checkpoint
  local name=$1 start=$SECONDS; shift
  step "train_$name" nmt-train data_dir="$WORK/$name/data" run_dir="$WORK/$name/run" "$@" \
    train.save_interval_updates=500 train.valid_interval_updates=1000 train.keep_last="$AVERAGE"
  SPENT[$name]=$((SECONDS - start))
  step "average_$name" nmt-average run_dir="$WORK/$name/run" last="$AVERAGE" \
    output="$WORK/$name/averaged.pt"
}

budget() {  # budget MINUTES UPDATES: train.max_updates=UPDATES where given, else the minutes
  if [ -n "$2" ]; then
    echo "train.max_updates=$2 train.max_minutes=0"
  else
    echo "train.max_minutes=$1"
  fi
}

declare -A SPENT=([teacher]=-)
[ -n "$DRY" ] || mkdir -p "$WORK"
# 1: the sources the teacher translates, and their references
shell "$(text "$TRAIN_SRC") | head -n $DISTILL_LINES > $(q "$WORK/part.$SRC")"
shell "$(text "$TRAIN_TGT") | head -n $DISTILL_LINES > $(q "$WORK/part.$TGT")"

# 2: the teacher, on the whole training split
if [ -z "$TEACHER" ]; then
  step preprocess_teacher nmt-preprocess src_lang="$SRC" tgt_lang="$TGT" \
    train="$CORPUS/train" valid="$CORPUS/valid" out_dir="$WORK/teacher/data" \
    bpe.vocab_size="$VOCAB" force=true
  # shellcheck disable=SC2046  # budget's words are separate overrides
  trained teacher +model="$TEACHER_MODEL" $(budget "$TEACHER_MINUTES" "$TEACHER_UPDATES") \
    train.max_tokens=1536 train.amp=bf16
  TEACHER=$WORK/teacher/averaged.pt
fi

# 3: the teacher's translations of the part's sources
if [ "$DISTILL_SEARCH" = beam ]; then
  step distill nmt-translate checkpoint="$TEACHER" input="$WORK/part.$SRC" \
    output="$WORK/distilled.$TGT" "${SEARCH[@]}"
else
  step distill nmt-translate checkpoint="$TEACHER" input="$WORK/part.$SRC" \
    output="$WORK/nbest.$TGT" "${SEARCH[@]}"
  shell "$(words python "$HERE/distill.py" closest "$WORK/nbest.$TGT" "$WORK/part.$TGT" \
    "$WORK/distilled.$TGT")"
fi
shell "cp $(q "$WORK/part.$SRC") $(q "$WORK/distilled.$SRC")"

# 4: the student, on the teacher's translations, with a shortlist (from the teacher's layers)
if [ "$STUDENT_INIT" = teacher ]; then
  shell "$(words python "$HERE/distill.py" shrink "$TEACHER" "$WORK/student/init.pt" \
    "$WORK/student/teacher.spm.model" --layers "$STUDENT_LAYERS")"
fi
step preprocess_student nmt-preprocess src_lang="$SRC" tgt_lang="$TGT" \
  train="$WORK/distilled" valid="$CORPUS/valid" out_dir="$WORK/student/data" \
  "${VOCAB_OF_STUDENT[@]}" shortlist.k="$SHORTLIST_K" force=true
# shellcheck disable=SC2046
trained student +recipe=cpu20 "${STUDENT_SHAPE[@]}" $(budget "$STUDENT_MINUTES" "$STUDENT_UPDATES") \
  "${INIT[@]}"

# 5: teacher and student on the test split, int8, in nmt and CTranslate2, at each beam size
SCORE=(python "$HERE/distill.py" score --src "$TEST_SRC" --ref "$TEST_TGT" --out "$WORK/score"
  --beams "${BEAMS[@]}" ${COMET:+--comet "$COMET"}
  --row teacher "$TEACHER" - "${SPENT[teacher]}"
  --row student "$WORK/student/averaged.pt" "$WORK/student/data/shortlist.pt"
  "${SPENT[student]}")
echo "+ $(words "${SCORE[@]}")" >&2
"${SCORE[@]}" ${DRY:+--dry-run}
