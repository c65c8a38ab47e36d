#!/usr/bin/env bash
# Knowledge over pretraining (issue 39): the reference vanilla pretraining made again with its
# params written every 50 epochs, then each of those files finetuned (the handout's full
# finetune, seed 0) and evaluated on dev by grid.py.
#
#     setsid nohup nice -n 10 bash results/checkpoints.sh >> longrun/checkpoints.log 2>&1 < /dev/null &
#
# About 2h of CPU for the pretraining, then about a minute a checkpoint: start it first thing in
# a session, and again in the next one. It checks out CODE_COMMIT into longrun/ckpt-code
# (ignored) with longrun/venv, writes into longrun/ckpt, skips every output that exists and
# resumes an interrupted training. Training is bf16 autocast, the reference run's precision: on
# a CPU with avx512_bf16 the pretraining's losses must equal the published ones at every logged
# step, and its final params' dev predictions results/vanilla.pretrain.dev.predictions; the
# script says whether they do.
set -uo pipefail

CODE_COMMIT=1060378
ROOT=$(cd "$(dirname "$0")/.." && pwd)
CODE=$ROOT/longrun/ckpt-code
OUT=$ROOT/longrun/ckpt

. "$ROOT/results/longrun.sh"
mkdir -p "$OUT"
grep -qE ' (avx512|amx)_bf16' /proc/cpuinfo || fail "this CPU has no bf16 instructions"

params=$OUT/vanilla.pretrain.params
if [ ! -f "$params" ]; then
    resuming=()
    [ -f "$params.resume" ] && resuming=(--resume)
    say "pretrain vanilla, params every 50 epochs"
    python src/run.py pretrain vanilla wiki.txt --writing_params_path "$params" \
        --precision bf16 --save_every 50 "${resuming[@]}" || fail "pretrain"
fi
# the loss at every step the published run logged (every 10th), against its figure
if awk -F, 'NR == FNR { loss[$2] = $3; next }
            FNR > 1 && loss[$2] != $3 { differ = 1 } END { exit differ }' \
    "$params.metrics.csv" "$ROOT/results/vanilla.pretrain.params.metrics.csv"; then
    say "pretraining losses identical to results/vanilla.pretrain.params.metrics.csv"
else
    say "pretraining losses DIFFER from results/vanilla.pretrain.params.metrics.csv"
fi

say "finetune and evaluate every checkpoint"
python src/grid.py --pretrained "$OUT"/vanilla.pretrain.epoch*.params --methods full --seeds 0 \
    --outdir "$OUT/grid" --precision bf16 >/dev/null || fail "grid"
if cmp -s "$OUT/grid/vanilla.pretrain.epoch650.full.s0.dev.predictions" \
    "$ROOT/results/vanilla.pretrain.dev.predictions"; then
    say "epoch 650: dev predictions identical to results/vanilla.pretrain.dev.predictions"
else
    say "epoch 650: dev predictions DIFFER from results/vanilla.pretrain.dev.predictions"
fi
say "done: longrun/ckpt/grid/grid.{md,csv,json}"
