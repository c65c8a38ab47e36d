#!/usr/bin/env bash
# The runs behind results/' finetuning grid (issue 21) and its "What the models know" reports
# (issue 22): the reference pretrainings made again, model by model, each followed by the
# handout's finetune (the grid's full run, seed 0), analyze.py's report with its params, and
# its grid of finetuning methods x 5 seeds; then two more perceiver pretraining seeds.
#
#     setsid nohup nice -n 10 bash results/runs.sh >> longrun/log.txt 2>&1 < /dev/null &
#
# Hours of CPU: start it first thing in a session, and again in the next one. It checks out
# CODE_COMMIT into longrun/code (ignored) with its own virtual environment, writes into
# longrun/out, skips every output that exists and resumes an interrupted training. A model
# whose report and grid runs are published (results/analysis/MODEL.json, its rows in
# results/grid/grid.csv) is skipped, so a new machine goes on where the last one's committed
# results end: publishing is copying longrun/out/grid/grid.{json,csv,md} to results/grid/ and
# longrun/out/analysis/MODEL.json to results/analysis/.
#
# Training is bf16 autocast, the reference run's precision: on an AMD EPYC with avx512_bf16
# these commands give the reference run's params bit for bit (its published losses and
# predictions are compared below), so the reports describe the very models results/ shows.
# A CPU without bf16 instructions emulates it about 20 times slower, so the script stops there.
set -uo pipefail

CODE_COMMIT=2bc3f45
ROOT=$(cd "$(dirname "$0")/.." && pwd)
CODE=$ROOT/longrun/code
OUT=$ROOT/longrun/out
SEEDS=(0 1 2 3 4)

. "$ROOT/results/longrun.sh"
mkdir -p "$OUT/grid" "$OUT/analysis"
# what earlier machines published: the grid's record goes on from it
[ -f "$OUT/grid/grid.json" ] || [ ! -f "$ROOT/results/grid/grid.json" ] \
    || cp "$ROOT/results/grid/grid.json" "$OUT/grid/" || fail "results/grid/grid.json"
for report in "$ROOT"/results/analysis/*.json; do
    [ -f "$OUT/analysis/${report##*/}" ] || cp "$report" "$OUT/analysis/" || fail "$report"
done
grep -qE ' (avx512|amx)_bf16' /proc/cpuinfo || fail "this CPU has no bf16 instructions"

# pretrain MODEL VARIANT [run.py flags]: the handout's pretraining command into OUT
pretrain() {
    local model=$1 variant=$2 params=$OUT/$1.pretrain.params
    shift 2
    [ -f "$params" ] && return
    local resuming=()
    [ -f "$params.resume" ] && resuming=(--resume)
    say "pretrain $model"
    python src/run.py pretrain "$variant" wiki.txt --writing_params_path "$params" \
        --precision bf16 "$@" "${resuming[@]}" || fail "pretrain $model"
}

# grid MODEL METHOD... -- SEED...: finetune and evaluate MODEL's pretrained params
grid() {
    local model=$1 methods=() seeds=()
    shift
    while [ "$1" != -- ]; do methods+=("$1"); shift; done
    shift
    seeds=("$@")
    say "grid $model ${methods[*]} seeds ${seeds[*]}"
    python src/grid.py --pretrained "$OUT/$model.pretrain.params" --methods "${methods[@]}" \
        --seeds "${seeds[@]}" --outdir "$OUT/grid" --precision bf16 >/dev/null \
        || fail "grid $model"
}

# analysis MODEL VARIANT NAME [flags]: analyze.py's report of the handout's finetuned model
analysis() {
    local model=$1 variant=$2 name=$3 report=$OUT/analysis/$1.json
    shift 3
    [ -f "$report" ] && return
    say "analyze $model"
    python src/analyze.py "$OUT/grid/$model.full.s0.dev.predictions" --variant "$variant" \
        --params "$OUT/grid/$model.full.s0.params" --name "$name" --json "$report" "$@" \
        >/dev/null || fail "analyze $model"
}

# same_as_published MODEL: the remade run's dev predictions against the committed ones
same_as_published() {
    if cmp -s "$OUT/grid/$1.full.s0.dev.predictions" "$ROOT/results/$1.pretrain.dev.predictions"
    then say "$1: dev predictions identical to results/$1.pretrain.dev.predictions"
    else say "$1: dev predictions DIFFER from results/$1.pretrain.dev.predictions"
    fi
}

# model MODEL VARIANT NAME METHODS -- PRETRAIN FLAGS: one model's whole share of the queue
model() {
    local model=$1 variant=$2 name=$3 methods=()
    shift 3
    while [ "$1" != -- ]; do methods+=("$1"); shift; done
    shift
    local runs=$((${#methods[@]} * ${#SEEDS[@]})) shape=()
    [ "$variant" = perceiver ] && shape=(--bottleneck_dim 64)
    if [ -f "$ROOT/results/analysis/$model.json" ] \
        && [ "$(grep -c "^$model," "$ROOT/results/grid/grid.csv" 2>/dev/null)" -ge $runs ]; then
        say "$model: published in results/, skipped"
        return
    fi
    pretrain "$model" "$variant" "$@"
    grid "$model" full -- 0
    [ -f "$ROOT/results/$model.pretrain.dev.predictions" ] && same_as_published "$model"
    analysis "$model" "$variant" "$name" "${shape[@]}"
    grid "$model" "${methods[@]}" -- "${SEEDS[@]}"
}

PERCEIVER=(--bottleneck_dim 64 --pretrain_lr 6e-3)  # the 2023 handout's pretraining flags
PEFT=(full lora:1 lora:4 lora:16 adapter)
model vanilla vanilla "vanilla, pretrained" "${PEFT[@]}" --
model rope rope "RoPE, pretrained" "${PEFT[@]}" --
model synthesizer synthesizer "synthesizer, pretrained" full --
model perceiver perceiver "perceiver, pretrained" full -- "${PERCEIVER[@]}"
model perceiver.s1 perceiver "perceiver (seed 1), pretrained" full -- "${PERCEIVER[@]}" --seed 1
model perceiver.s2 perceiver "perceiver (seed 2), pretrained" full -- "${PERCEIVER[@]}" --seed 2

say "tables and pictures"
python src/grid.py --outdir "$OUT/grid" --plot "$OUT/grid.png" >/dev/null || fail "grid table"
python src/analyze.py --coverage_plot "$OUT/coverage.png" "$OUT"/analysis/{vanilla,rope,synthesizer,perceiver}.json \
    "$ROOT/results/analysis/vanilla.nopretrain.fp32.json" > "$OUT/analysis.md" || fail "coverage"
say "done: longrun/out/grid/grid.{md,csv,json}, grid.png, analysis/*.json, analysis.md, coverage.png"
