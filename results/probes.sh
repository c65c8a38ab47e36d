#!/usr/bin/env bash
# Stored, extractable and known (issue 39): the published pretrained models made again and
# asked before finetuning (cloze.py), and so are checkpoints.sh's checkpoints
# (over_pretraining.py); each finetuned as the handout does (full, seed 0: the
# published finetuned model) and probed inside (linear_probes.py); and vanilla and RoPE
# finetuned on known and unknown facts (exposure.py --subsets, grid.py: full and LoRA rank 1,
# 5 seeds each, analyze.py's report of each run, invented people included, and
# known_unknown.py's table).
#
#     setsid nohup nice -n 10 bash results/probes.sh [STEP ...] >> longrun/probes.log 2>&1 < /dev/null &
#
# STEPs, all of them in this order when none is named: vanilla, rope, synthesizer, perceiver
# (each: pretrain, cloze, linear), known (the known/unknown grids of vanilla and RoPE) and
# perceiver-seeds (seeds 1 and 2). The vanilla pretraining is checkpoints.sh's when that has
# finished (its final params are the reference run's), else made here by the same command less
# --save_every; step vanilla also cloze-probes checkpoints.sh's checkpoints, so it needs that
# script's end. About 20 hours of CPU in all: six pretrainings (2-2.5 h each) and about 4 h of
# finetuning and analysis. Start it first thing in a session, and again in the next one: it
# checks out CODE_COMMIT into longrun/probes-code (ignored) with longrun/venv, writes into
# longrun/probes, skips every output that exists and resumes an interrupted training.
# Training is bf16 autocast, the reference runs' precision: on a CPU with avx512_bf16 each
# pretraining's losses must equal the published ones at every logged step; the script says
# whether they do.
set -uo pipefail

CODE_COMMIT=80d19cc  # each person their own document; training as at 8f34f8e, which began it
ROOT=$(cd "$(dirname "$0")/.." && pwd)
CODE=$ROOT/longrun/probes-code
OUT=$ROOT/longrun/probes
SEEDS=(0 1 2 3 4)
SUBSETS=(all seen seen.control often often.control)  # all: the finetuning file as it is

. "$ROOT/results/longrun.sh"
mkdir -p "$OUT/cloze" "$OUT/linear"
grep -qE ' (avx512|amx)_bf16' /proc/cpuinfo || fail "this CPU has no bf16 instructions"

# exposure SEED: exposure.py's report of the pretraining with that seed (and, for seed 0,
# the finetuning file's subsets), made where a step first needs it, after any pretraining
# before it: a new machine starts the hours of pretraining first
exposure() {
    local report=$OUT/exposure.s$1.json subsets=()
    [ "$1" = 0 ] && subsets=(--subsets "$OUT/subsets")
    [ -f "$report" ] && { [ "$1" != 0 ] || [ -d "$OUT/subsets" ]; } && return
    say "exposure, seed $1"
    python src/exposure.py --seed "$1" --json "$report" "${subsets[@]}" >/dev/null \
        || fail "exposure seed $1"
}

# pretrain MODEL VARIANT [run.py flags]: the handout's pretraining command into OUT, and its
# losses against the published run's where results/ has them
pretrain() {
    local model=$1 variant=$2 params=$OUT/$1.pretrain.params
    shift 2
    if [ ! -f "$params" ]; then
        local resuming=()
        [ -f "$params.resume" ] && resuming=(--resume)
        say "pretrain $model"
        python src/run.py pretrain "$variant" wiki.txt --writing_params_path "$params" \
            --precision bf16 "$@" "${resuming[@]}" || fail "pretrain $model"
    fi
    local published=$ROOT/results/$model.pretrain.params.metrics.csv
    [ -f "$published" ] || return 0
    if awk -F, 'NR == FNR { loss[$2] = $3; next }
                FNR > 1 && ($2 in loss) && loss[$2] != $3 { differ = 1 } END { exit differ }' \
        "$params.metrics.csv" "$published"; then
        say "$model: pretraining losses identical to results/${published##*/}"
    else
        say "$model: pretraining losses DIFFER from results/${published##*/}"
    fi
}

# published MODEL: the published finetuned model's dev predictions: results/' file, or for
# the perceiver's seeds 1 and 2, which have none there, the answers in their analyze.py
# report (results/analysis/, whose answers are the prediction files' for the other models)
published() {
    local file=$ROOT/results/$1.pretrain.dev.predictions
    if [ ! -f "$file" ]; then
        file=$OUT/$1.published.dev.predictions
        python -c 'import json, sys; print(*(r["prediction"] for r in json.load(open(sys.argv[1]))["records"]), sep="\n")' \
            "$ROOT/results/analysis/$1.json" > "$file" || return 1
    fi
    echo "$file"
}

# cloze MODEL SEED: cloze.py on the pretrained params, with the finetuned model's answers
cloze() {
    local model=$1 report=$OUT/cloze/$1.json finetuned
    [ -f "$report" ] && return
    exposure "$2"
    finetuned=$(published "$model") || fail "the published answers of $model"
    say "cloze $model"
    python src/cloze.py "$OUT/$model.pretrain.params" --exposure "$OUT/exposure.s$2.json" \
        --finetuned "$finetuned" --json "$report" > "$OUT/cloze/$model.txt" \
        || fail "cloze $model"
}

# checkpoints: cloze.py on each of checkpoints.sh's params files, with its own finetuned
# model's answers, and over_pretraining.py's table and picture of them
checkpoints() {
    local params epoch report
    exposure 0
    for params in "$ROOT"/longrun/ckpt/vanilla.pretrain.epoch*.params; do
        epoch=${params##*.pretrain.}
        epoch=${epoch%.params}
        report=$OUT/cloze/vanilla.$epoch.json
        [ -f "$report" ] && continue
        say "cloze vanilla $epoch"
        python src/cloze.py "$params" --exposure "$OUT/exposure.s0.json" \
            --finetuned "$ROOT/longrun/ckpt/grid/vanilla.pretrain.$epoch.full.s0.dev.predictions" \
            --json "$report" > "${report%.json}.txt" || fail "cloze vanilla $epoch"
    done
    python src/over_pretraining.py "$OUT"/cloze/vanilla.epoch*.json \
        --metrics "$ROOT/longrun/ckpt/vanilla.pretrain.params.metrics.csv" \
        --json "$OUT/over_pretraining.json" --plot "$OUT/over_pretraining.png" \
        > "$OUT/over_pretraining.txt" || fail "over_pretraining"
}

# linear MODEL SEED: the handout's finetune (full, seed 0) and linear_probes.py on it, in a
# grid of its own: known_unknown.py reads every run of the known/unknown grids
linear() {
    local model=$1 report=$OUT/linear/$1.json published
    [ -f "$report" ] && return
    exposure "$2"
    say "linear probes $model"
    python src/grid.py --pretrained "$OUT/$model.pretrain.params" --methods full --seeds 0 \
        --outdir "$OUT/grid-linear" --precision bf16 >/dev/null || fail "finetune $model"
    published=$(published "$model") || fail "the published answers of $model"
    if cmp -s "$OUT/grid-linear/$model.full.s0.dev.predictions" "$published"; then
        say "$model: dev predictions identical to the published ones (${published#"$ROOT"/})"
    else
        say "$model: dev predictions DIFFER from the published ones (${published#"$ROOT"/})"
    fi
    python src/linear_probes.py "$OUT/grid-linear/$model.full.s0.params" \
        --exposure "$OUT/exposure.s$2.json" --json "$report" > "$OUT/linear/$model.txt" \
        || fail "linear probes $model"
}

# known MODEL VARIANT: finetuning on the whole finetuning file and on each subset, full and
# LoRA rank 1, 5 seeds, each run's analyze.py report (confidence on dev and on invented
# people) beside its predictions, and known_unknown.py's table of them
known() {
    local model=$1 variant=$2 subset corpus run grids=()
    exposure 0
    for subset in "${SUBSETS[@]}"; do
        corpus=$OUT/subsets/$subset.tsv
        [ "$subset" = all ] && corpus=birth_places_train.tsv
        grids+=("$OUT/grid-$subset")
        say "known/unknown: $model on $subset"
        python src/grid.py --pretrained "$OUT/$model.pretrain.params" --methods full lora:1 \
            --seeds "${SEEDS[@]}" --finetune_corpus_path "$corpus" \
            --outdir "$OUT/grid-$subset" --precision bf16 >/dev/null || fail "grid $subset"
        for run in "$OUT/grid-$subset/$model".*.params; do
            run=${run%.params}
            [ -f "$run.analysis.json" ] && continue
            python src/analyze.py "$run.dev.predictions" --params "$run.params" \
                --variant "$variant" --exposure "$OUT/exposure.s0.json" \
                --json "$run.analysis.json" >/dev/null || fail "analyze $run"
        done
    done
    python src/known_unknown.py "${grids[@]}" --json "$OUT/known_unknown.json" \
        > "$OUT/known_unknown.md" || fail "known_unknown"
}

# vanilla_params: checkpoints.sh's final params where it has finished, else the same pretraining
vanilla_params() {
    local ckpt=$ROOT/longrun/ckpt/vanilla.pretrain.params
    if [ ! -f "$OUT/vanilla.pretrain.params" ] && [ -f "$ckpt" ]; then
        cp "$ckpt" "$ckpt.metrics.csv" "$OUT/" || fail "copy $ckpt"
    fi
    pretrain vanilla vanilla
}

PERCEIVER=(--bottleneck_dim 64 --pretrain_lr 6e-3)  # the 2023 handout's pretraining flags
STEPS=("$@")
[ ${#STEPS[@]} = 0 ] && STEPS=(vanilla rope synthesizer perceiver known perceiver-seeds)
for step in "${STEPS[@]}"; do
    case $step in
        vanilla | rope | synthesizer | perceiver | known | perceiver-seeds) ;;
        *) fail "no step '$step' (vanilla rope synthesizer perceiver known perceiver-seeds)" ;;
    esac
    [ "$step" != vanilla ] || [ -f "$ROOT/longrun/ckpt/vanilla.pretrain.params" ] \
        || fail "step vanilla cloze-probes checkpoints.sh's checkpoints: run it to its end first"
done
for step in "${STEPS[@]}"; do
    case $step in
        vanilla)
            vanilla_params
            cloze vanilla 0
            checkpoints
            linear vanilla 0
            ;;
        rope | synthesizer)
            pretrain "$step" "$step"
            cloze "$step" 0
            linear "$step" 0
            ;;
        perceiver)
            pretrain perceiver perceiver "${PERCEIVER[@]}"
            cloze perceiver 0
            linear perceiver 0
            ;;
        known)
            vanilla_params
            known vanilla vanilla
            pretrain rope rope
            known rope rope
            ;;
        perceiver-seeds)
            for seed in 1 2; do
                pretrain perceiver.s$seed perceiver "${PERCEIVER[@]}" --seed $seed
                cloze perceiver.s$seed $seed
                linear perceiver.s$seed $seed
            done
            ;;
    esac
done
say "done: ${STEPS[*]} (longrun/probes/)"
