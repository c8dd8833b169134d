#!/usr/bin/env bash
# WMT14 English-German with the Transformer base or big of Vaswani et al. (2017), Table 3.
#
#   scripts/recipes/wmt14_en_de.sh base [WORK_DIR]    # 100k updates, average the last 5
#   scripts/recipes/wmt14_en_de.sh big  [WORK_DIR]    # 300k updates, average the last 20
#
# Data: Hugging Face `datasets` wmt/wmt14 de-en (train 4.5M pairs; validation newstest2013;
# test newstest2014), one joint SentencePiece BPE of 37k tokens. Training: GPUS GPUs (default 8)
# per machine, ~25k target tokens per update whatever the number of GPUs (train.global_tokens),
# bf16 autocast (AMP=fp16 on GPUs without bf16). Decoding: beam 4, length penalty alpha 0.6,
# max length source + 50; sacreBLEU on newstest2014. The paper reports 27.3 (base) and 28.4
# (big) tokenized BLEU.
#
# Where training runs (the other steps run where the script runs):
#   one machine (default)     torchrun --standalone --nproc_per_node $GPUS
#   NNODES machines           run the script on every machine with the same NNODES and
#                             RDZV_ENDPOINT=host:port of one of them (torchrun's c10d
#                             rendezvous; RDZV_ID names the job); the machines share WORK_DIR
#                             (a shared file system), only the first rank writes to it:
#       NNODES=2 RDZV_ENDPOINT=node1:29400 scripts/recipes/wmt14_en_de.sh big ~/wmt14
#   LAUNCHER=slurm            one SLURM job of NNODES nodes x GPUS tasks, submitted through
#                             Hydra's submitit launcher (pip install 'nmt[slurm]';
#                             configs/hydra/launcher/slurm.yaml); the script waits for it.
#                             SLURM_PARTITION, SLURM_ACCOUNT and SLURM_TIME (minutes) pass on:
#       LAUNCHER=slurm NNODES=2 SLURM_PARTITION=gpu scripts/recipes/wmt14_en_de.sh big
#
# The update and the per-GPU batch (WORLD = NNODES x GPUS GPUs):
#   VARIANT=paper (default)   ~25k target tokens per update, the paper's (8 GPUs: 3,456 padded
#                             tokens each, about the paper's 3k; 1 GPU: 28,544, one batch an update)
#   VARIANT=large-batch       Ott et al. (2018), "Scaling Neural Machine Translation": ~400k target
#                             tokens per update, peak learning rate 1e-3 under the inverse square
#                             root (lr_factor 1.43 base, 2.02 big with warmup 4000), as many tokens
#                             seen as the paper's row (base 6,250 updates, big 18,750)
# Per GPU, max_tokens = 8/7 x the update's target tokens / WORLD (padding and the longer side
# counted: about one batch per GPU and update), rounded down to a multiple of 128, and lowered
# by the trainer to what fits in GPU_MEMORY (default 0.9) of the GPU's memory
# (train.gpu_memory: a probe of the first steps; an 80 GB card holds about 182k tokens of base,
# 108k of big, docs/gpu.md); train.global_tokens makes up the rest by accumulating batches.
# MAX_TOKENS=N overrides the first figure. Fewer than 2,048 tokens a GPU (the paper's update on
# more than 13 GPUs) is an error.
# Opt-in variants, untested on a GPU: COMPILE=1 (train.compile: the update compiled whole, its
# batches padded to 16 bucket shapes fitted to the data), CHECKPOINT_ACTIVATIONS=1
# (train.checkpoint_activations: each layer recomputed in backward, about a third more compute
# for the layers' activations; train.gpu_memory then fits larger batches in the memory it frees).
#
# NMT_DRY_RUN=1 composes and validates every command's config, prints it, and stops before any
# work; it prints the training launch command on stderr (tests/system/test_recipes.py runs this on CPU).
set -euo pipefail

ROW=${1:?usage: wmt14_en_de.sh base|big [WORK_DIR]}
WORK=${2:-work/wmt14_en_de_$ROW}
GPUS=${GPUS:-8}
AMP=${AMP:-bf16}
NNODES=${NNODES:-1}
LAUNCHER=${LAUNCHER:-torchrun}
VARIANT=${VARIANT:-paper}
case "$ROW" in
  base) UPDATES=100000; SAVE_EVERY=1500; LAST=5; LR_1E3=1.43 ;;  # the paper: checkpoints every 10 minutes
  big)  UPDATES=300000; SAVE_EVERY=1000; LAST=20; LR_1E3=2.02 ;;
  *) echo "wmt14_en_de.sh: error: unknown row '$ROW' (base or big)" >&2; exit 2 ;;
esac
case "$VARIANT" in
  paper) GLOBAL=25000; LR=() ;;
  large-batch) GLOBAL=400000; UPDATES=$((UPDATES / 16)); SAVE_EVERY=$((SAVE_EVERY / 8))
    LR=(optim.lr_factor=$LR_1E3) ;;
  *) echo "wmt14_en_de.sh: error: unknown VARIANT '$VARIANT' (paper or large-batch)" >&2; exit 2 ;;
esac
OPTS=()
[ -n "${COMPILE:-}" ] && OPTS+=(train.compile=true)
[ -n "${CHECKPOINT_ACTIVATIONS:-}" ] && OPTS+=(train.checkpoint_activations=true)
WORLD=$((NNODES * GPUS))
FILL=$((GLOBAL * 8 / 7 / WORLD / 128 * 128))
MAX_TOKENS=${MAX_TOKENS:-$FILL}
if [ "$MAX_TOKENS" -lt 2048 ]; then
  echo "wmt14_en_de.sh: error: $GLOBAL target tokens per update over $WORLD GPUs leave" \
    "$MAX_TOKENS tokens a batch, too few to keep a GPU busy (docs/gpu.md); use" \
    "VARIANT=large-batch or at most $((GLOBAL * 8 / 7 / 2048)) GPUs" >&2
  exit 2
fi
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
  hf_name=wmt/wmt14 hf_config=de-en train=hf:train valid=hf:validation test=hf:test \
  out_dir="$DATA" bpe.vocab_size=37000 bpe.joint=true bpe.input_sentence_size=4000000 \
  clean.max_tokens=250 clean.max_ratio=1.5

TRAIN=(nmt-train "+model=$ROW" data_dir="$DATA" run_dir="$RUN"
  train.max_tokens=$MAX_TOKENS train.gpu_memory=${GPU_MEMORY:-0.9} train.global_tokens=$GLOBAL
  train.max_updates=$UPDATES
  train.save_interval_updates=$SAVE_EVERY train.keep_last=$LAST
  train.valid_interval_updates=$SAVE_EVERY train.amp=$AMP train.device=cuda
  ${LR[@]+"${LR[@]}"} ${OPTS[@]+"${OPTS[@]}"})
case "$LAUNCHER" in
  torchrun)
    if [ "$NNODES" = 1 ]; then
      RDZV=(--standalone)
    else
      RDZV=(--nnodes "$NNODES" --rdzv-backend c10d
        --rdzv-endpoint "${RDZV_ENDPOINT:?NNODES=$NNODES needs RDZV_ENDPOINT=host:port of one node}"
        --rdzv-id "${RDZV_ID:-nmt-wmt14-$ROW}")
    fi
    LAUNCH=(torchrun "${RDZV[@]}" --nproc_per_node "$GPUS" --no-python "${TRAIN[@]}") ;;
  slurm)
    SLURM=(hydra/launcher=slurm hydra.launcher.nodes="$NNODES"
      hydra.launcher.tasks_per_node="$GPUS" hydra.launcher.gpus_per_node="$GPUS"
      ${SLURM_PARTITION:+hydra.launcher.partition=$SLURM_PARTITION}
      ${SLURM_ACCOUNT:+hydra.launcher.account=$SLURM_ACCOUNT}
      ${SLURM_TIME:+hydra.launcher.timeout_min=$SLURM_TIME})
    LAUNCH=("${TRAIN[@]}" -m "${SLURM[@]}") ;;
  *) echo "wmt14_en_de.sh: error: unknown LAUNCHER '$LAUNCHER' (torchrun or slurm)" >&2; exit 2 ;;
esac
if [ -n "${NMT_DRY_RUN:-}" ]; then
  echo "launch: ${LAUNCH[*]}" >&2
  if [ "$LAUNCHER" = slurm ]; then  # the job's config, composed with the launcher group
    step train "${TRAIN[@]}" "${SLURM[@]}"
    echo "### launcher"
    "${TRAIN[@]}" "${SLURM[@]}" --cfg hydra --package hydra.launcher
  else
    step train "${TRAIN[@]}"
  fi
else
  step train "${LAUNCH[@]}"
fi

step average nmt-average run_dir="$RUN" last=$LAST output="$RUN/averaged.pt"

step translate nmt-translate checkpoint="$RUN/averaged.pt" \
  input="$DATA/test.clean.en" output="$WORK/newstest2014.hyp.de" ref="$DATA/test.clean.de" \
  search.beam_size=4 search.alpha=0.6 search.max_len_a=1 search.max_len_b=50
