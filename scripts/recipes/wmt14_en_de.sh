#!/usr/bin/env bash
# WMT14 English-German with the Transformer base or big of Vaswani et al. (2017), Table 3.
#
#   scripts/recipes/wmt14_en_de.sh base [WORK_DIR]    # 100k updates, average the last 5
#   scripts/recipes/wmt14_en_de.sh big  [WORK_DIR]    # 300k updates, average the last 20
#
# Data: Hugging Face `datasets` wmt14 de-en (train 4.5M pairs; validation newstest2013; test
# newstest2014), one joint SentencePiece BPE of 37k tokens. Training: one machine with GPUS
# GPUs (default 8) through torchrun, ~25k target tokens per update, bf16 autocast (AMP=fp16 on
# GPUs without bf16). Decoding: beam 4, length penalty alpha 0.6, max length source + 50;
# sacreBLEU on newstest2014. The paper reports 27.3 (base) and 28.4 (big) tokenized BLEU.
#
# NMT_DRY_RUN=1 composes and validates every command's config, prints it, and stops before any
# work (tests/test_recipes.py runs this on CPU).
set -euo pipefail

ROW=${1:?usage: wmt14_en_de.sh base|big [WORK_DIR]}
WORK=${2:-work/wmt14_en_de_$ROW}
GPUS=${GPUS:-8}
AMP=${AMP:-bf16}
case "$ROW" in
  base) UPDATES=100000; SAVE_EVERY=1500; LAST=5 ;;   # the paper: checkpoints every 10 minutes
  big)  UPDATES=300000; SAVE_EVERY=1000; LAST=20 ;;
  *) echo "wmt14_en_de.sh: error: unknown row '$ROW' (base or big)" >&2; exit 2 ;;
esac
DATA=$WORK/data
RUN=$WORK/run

step() {  # step NAME COMMAND...: run it, or in a dry run validate and print its config
  local name=$1; shift
  if [ -n "${NMT_DRY_RUN:-}" ]; then
    echo "### $name"
    "$@" --cfg job
  else
    echo "+ $*" >&2
    "$@"
  fi
}

step preprocess nmt-preprocess src_lang=en tgt_lang=de \
  hf_name=wmt14 hf_config=de-en train=hf:train valid=hf:validation test=hf:test \
  out_dir="$DATA" bpe.vocab_size=37000 bpe.joint=true bpe.input_sentence_size=4000000 \
  clean.max_tokens=250 clean.max_ratio=1.5

TRAIN=(nmt-train "+model=$ROW" data_dir="$DATA" run_dir="$RUN"
  train.max_tokens=4096 train.global_tokens=25000 train.max_updates=$UPDATES
  train.save_interval_updates=$SAVE_EVERY train.keep_last=$LAST
  train.valid_interval_updates=$SAVE_EVERY train.amp=$AMP train.device=cuda)
if [ -n "${NMT_DRY_RUN:-}" ]; then
  step train "${TRAIN[@]}"
else
  step train torchrun --standalone --nproc_per_node "$GPUS" --no-python "${TRAIN[@]}"
fi

step average nmt-average run_dir="$RUN" last=$LAST output="$RUN/averaged.pt"

step translate nmt-translate checkpoint="$RUN/averaged.pt" \
  input="$DATA/test.raw.en" output="$WORK/newstest2014.hyp.de" ref="$DATA/test.raw.de" \
  search.beam_size=4 search.alpha=0.6 search.max_len_a=1 search.max_len_b=50
