#!/usr/bin/env bash
# The small world's frontier (issue 92): one pretraining seed per world and variant, its params
# written every 20 epochs; each checkpoint, and the untrained model as the floor, finetuned on
# the world's finetuning people and evaluated on its held-out people by grid.py, the same
# finetuned params asked the finetuning people again (recall), and the cloze probe of the
# held-out people on each checkpoint before finetuning, with over_pretraining.py's figure of
# it. Then three other finetunings of the last vanilla checkpoint of the paraphrased world,
# and every checkpoint finetuned at the handout's learning rate (6e-4) for 30 epochs.
# About 25 minutes of the 2-core CPU per pretraining with its evaluations.
#
#     setsid nohup nice bash results/small_world/frontier.sh >> longrun/small_world.log 2>&1 < /dev/null &
#
# It writes into longrun/small_world (ignored), then copies what results/README.md's tables
# are computed from into results/small_world/ (tests/test_published.py recomputes them).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-$ROOT/longrun/small_world}
cd "$ROOT"
py=${PYTHON:-python}

# p4: 16 documents per person cycling through 4 paraphrases; p1: the same biography 16 times
for p in 4 1; do
    $py research/small_world.py --seed 0 --outdir "$OUT/p$p" --people 60 --documents 16 \
        --paraphrases $p --attributes 0
done

finetuned() {  # WORLD GRID_FOLDER PARAMS... [grid.py flags]: finetune, evaluate held-out
    local W=$1 G=$2; shift 2
    $py research/grid.py --pretrain_corpus_path "$W/world.txt" --finetune_corpus_path "$W/finetune.tsv" \
        --eval_corpus_path "$W/heldout.tsv" --test_corpus_path "$W/test_inputs.tsv" \
        --batch_size 16 --outdir "$G" "$@"
}

recall() {  # VARIANT WORLD FINETUNED_PARAMS: the finetuning people asked again
    $py src/run.py evaluate "$1" "$2/world.txt" --reading_params_path "$3" \
        --eval_corpus_path "$2/finetune.tsv" --outputs_path "${3%.params}.recall.predictions"
}

frontier() {  # VARIANT WORLD
    local V=$1 W=$OUT/$2
    $py src/run.py pretrain "$V" "$W/world.txt" --writing_params_path "$W/$V.pretrain.params" \
        --max_epochs 100 --batch_size 32 --save_every 20 --edition 2021 --seed 0
    local ckpts=("$W/$V".pretrain.epoch*.params)
    finetuned "$W" "$W/grid_$V" --pretrained "${ckpts[@]}" --max_epochs 120 --finetune_lr 3e-3
    $py research/exposure.py --params "$W/$V.pretrain.params" --pretrain_corpus_path "$W/world.txt" \
        --people "$W/finetune.tsv" "$W/heldout.tsv" --finetune_corpus_path "$W/finetune.tsv" \
        --json "$W/$V.exposure.json"
    for c in "${ckpts[@]}"; do
        local m; m=$(basename "${c%.params}")
        $py research/cloze.py "$c" --eval_corpus_path "$W/heldout.tsv" --pretrain_corpus_path \
            "$W/world.txt" --finetune_corpus_path "$W/finetune.tsv" --exposure "$W/$V.exposure.json" \
            --finetuned "$W/grid_$V/$m.full.s0.dev.predictions" --json "${c%.params}.cloze.json"
    done
    $py research/over_pretraining.py "$W/$V".pretrain.epoch*.cloze.json \
        --metrics "$W/$V.pretrain.params.metrics.csv" --plot "$W/$V.knowledge.png"
    $py research/untrained.py "$V" "$W/world.txt" --seed 0 --edition 2021 \
        --writing_params_path "$W/$V.untrained.params"
    finetuned "$W" "$W/grid_$V" --pretrained "$W/$V.untrained.params" --max_epochs 120 --finetune_lr 3e-3
    for p in "$W/grid_$V"/*.full.s0.params; do recall "$V" "$W" "$p"; done
}

frontier vanilla p4
frontier rope p4
frontier vanilla p1

# other finetunings of vanilla's last checkpoint in p4: each method at its default learning
# rate (full 6e-4, lora and adapter 6e-3) for 120 epochs; full for 20 epochs at 3e-3; full for
# 30 epochs at 6e-4
W=$OUT/p4; C=$W/vanilla.pretrain.epoch100.params
finetuned "$W" "$W/ft_vanilla_120_epochs_each_default_lr" --pretrained "$C" --methods full lora adapter --max_epochs 120
finetuned "$W" "$W/ft_vanilla_20_epochs_lr_3e-3" --pretrained "$C" --max_epochs 20 --finetune_lr 3e-3
finetuned "$W" "$W/ft_vanilla_30_epochs_lr_6e-4" --pretrained "$C" --max_epochs 30

# every checkpoint and the floor finetuned at the handout's learning rate (6e-4) for 30 epochs,
# the last checkpoint and the floor with three finetuning seeds: the finetuning that reached the
# held-out people of a larger world (more_people.sh)
for run in "rope p4" "vanilla p1" "vanilla p4"; do
    set -- $run; V=$1 W=$OUT/$2
    finetuned "$W" "$W/handout_lr_$V" --pretrained "$W/$V.pretrain.epoch100.params" "$W/$V.untrained.params" \
        --max_epochs 30 --seeds 0 1 2
    finetuned "$W" "$W/handout_lr_$V" --pretrained "$W/$V".pretrain.epoch0[2468]0.params --max_epochs 30
done

# what the tables are computed from
for world in p4 p1; do
    mkdir -p "results/small_world/$world"
    cp "$OUT/$world"/{world.json,finetune.tsv,heldout.tsv} "results/small_world/$world/"
    for g in "$OUT/$world"/grid_*/; do
        g=${g%/}; v=${g##*grid_}; d=results/small_world/$world/$v
        mkdir -p "$d"
        cp "$g"/grid.{json,md,csv} "$g"/*.dev.predictions "$g"/*.recall.predictions "$d/"
        cp "$OUT/$world/$v".pretrain.epoch*.cloze.json "$d/"
        cp "$OUT/$world/$v.pretrain.params.metrics.csv" "$d/pretrain.metrics.csv"
        cp "$OUT/$world/$v.knowledge.png" "$d/knowledge.png"
    done
done
for g in "$OUT"/p4/ft_vanilla_*/; do
    g=${g%/}; d=results/small_world/p4/finetuning/${g##*ft_vanilla_}; mkdir -p "$d"
    cp "$g"/grid.{json,md,csv} "$g"/*.dev.predictions "$d/"
done
for g in "$OUT"/p[14]/handout_lr_*/; do
    g=${g%/}; w=${g%/*}; d=results/small_world/${w##*/}/${g##*handout_lr_}/30_epochs_lr_6e-4
    mkdir -p "$d"
    cp "$g"/grid.{json,md,csv} "$g"/*.dev.predictions "$d/"
done
