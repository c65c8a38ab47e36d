#!/usr/bin/env bash
# The small world with more finetuning people (issue 92). One world of 240 people (180
# finetuning, 60 held out; 16 documents each cycling through 4 paraphrases), one RoPE
# pretraining (seed 0, 80 epochs, params every 20); its last checkpoint and the untrained model
# finetuned on the first 30, 60, 120 and all 180 finetuning people, at the handout's learning
# rate (6e-4) for 30 epochs with three seeds and at the frontier's 3e-3 for 120 epochs; every
# checkpoint finetuned on all 180 at 6e-4; each asked the same 60 held-out people. Then the
# cloze probe of each checkpoint and over_pretraining.py's figure. Then the same world
# pretrained more ways (at batch 16, at the handout's batch 128, and with pretraining seeds 1
# to 4), each checkpoint finetuned on all 180 at 6e-4 and probed; and the same people with
# one biography each (people240_one, pretraining seeds 0 to 4), pretrained and probed
# alike; and the same number of people with 4 to 28 documents each (people240_docs4-28,
# pretraining seeds 0 to 4, the untrained model finetuned alike as the floor), whose
# held-out people reached_by_documents.py counts by documents per person; and the paraphrased
# world pretrained by the three other variants (vanilla, the synthesizer, the perceiver),
# pretraining seeds 0 to 4 each beside the variant's floor, which reached_by_variant.py sets
# beside RoPE's. About 11h40m of the 2-core CPU before the three variants (9h10m of it
# pretraining), and about 40 minutes a variant's seed.
#
#     setsid nohup nice bash results/small_world/more_people.sh >> longrun/more_people.log 2>&1 < /dev/null &
#
# It writes into longrun/more_people (ignored), then copies what results/README.md's table is
# computed from into results/small_world/people240/rope/ (tests/test_published.py recomputes it).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-$ROOT/longrun/more_people}
cd "$ROOT"
py=${PYTHON:-python}
V=rope W=$OUT/people240

$py research/small_world.py --seed 0 --outdir "$W" --people 240 --documents 16 --paraphrases 4 \
    --attributes 0 --finetune_share 0.75
for k in 30 60 120; do head -n $k "$W/finetune.tsv" > "$W/finetune$k.tsv"; done
cp "$W/finetune.tsv" "$W/finetune180.tsv"

finetuned() {  # PEOPLE GRID_FOLDER PARAMS... [grid.py flags]: finetune on the first PEOPLE, ask the held-out
    local k=$1 G=$2; shift 2
    $py research/grid.py --pretrain_corpus_path "$W/world.txt" --finetune_corpus_path "$W/finetune$k.tsv" \
        --eval_corpus_path "$W/heldout.tsv" --test_corpus_path "$W/test_inputs.tsv" \
        --batch_size 16 --outdir "$G" "$@"
}

probed() {  # FOLDER: the exposure of FOLDER's pretraining and the cloze probes of its checkpoints
    local B=$1
    $py research/exposure.py --params "$B/$V.pretrain.params" --pretrain_corpus_path "$W/world.txt" \
        --people "$W/finetune.tsv" "$W/heldout.tsv" --finetune_corpus_path "$W/finetune.tsv" \
        --json "$B/$V.exposure.json"
    for c in "$B/$V".pretrain.epoch*.params; do
        m=$(basename "${c%.params}")
        $py research/cloze.py "$c" --eval_corpus_path "$W/heldout.tsv" --pretrain_corpus_path "$W/world.txt" \
            --finetune_corpus_path "$W/finetune.tsv" --exposure "$B/$V.exposure.json" \
            --finetuned "$B/grid_180_30_epochs_lr_6e-4/$m.full.s0.dev.predictions" --json "${c%.params}.cloze.json"
    done
}

published() {  # FOLDER DEST: what the table is computed from, FOLDER's pretraining and grids, into DEST
    local B=$1 b=$2 g
    mkdir -p "$b"
    cp "$B/$V".pretrain.epoch*.cloze.json "$b/"
    cp "$B/$V.pretrain.params.metrics.csv" "$b/pretrain.metrics.csv"
    for g in "$B"/grid_*/; do
        g=${g%/}; mkdir -p "$b/${g##*grid_}"
        cp "$g"/grid.{json,md,csv} "$g"/*.dev.predictions "$b/${g##*grid_}/"
    done
}

pretrained() {  # PARAMS [run.py flags]: V pretrained on the world into PARAMS where it is not yet
    # an interrupted pretraining goes on from its saved state; one that stops again stops the script
    local P=$1 resume=()
    shift
    [ -f "$P" ] && return
    [ -f "$P.resume" ] && resume=(--resume)
    $py src/run.py pretrain $V "$W/world.txt" --writing_params_path "$P" "$@" "${resume[@]}" || exit
}

pretrained "$W/$V.pretrain.params" --max_epochs 80 --batch_size 32 --save_every 20 --edition 2021 --seed 0
$py research/untrained.py $V "$W/world.txt" --seed 0 --edition 2021 --writing_params_path "$W/$V.untrained.params"

last=$W/$V.pretrain.epoch80.params
floor=$W/$V.untrained.params
# the frontier's finetuning (120 epochs at 3e-3), then the handout's learning rate for 30 epochs
finetuned 180 "$W/grid_180" --pretrained "$last" "$floor" --max_epochs 120 --finetune_lr 3e-3
for k in 180 30 60 120; do
    finetuned $k "$W/grid_${k}_30_epochs_lr_6e-4" --pretrained "$last" "$floor" --max_epochs 30 --seeds 0 1 2
done
finetuned 180 "$W/grid_180_30_epochs_lr_6e-4" --pretrained "$W/$V".pretrain.epoch[246]0.params --max_epochs 30
for k in 30 60 120; do
    finetuned $k "$W/grid_$k" --pretrained "$last" "$floor" --max_epochs 120 --finetune_lr 3e-3
done

# the cloze probes of each checkpoint beside what the handout's finetuning on all 180 reached
probed "$W"
$py research/over_pretraining.py "$W/$V".pretrain.epoch*.cloze.json \
    --metrics "$W/$V.pretrain.params.metrics.csv" --plot "$W/$V.knowledge.png"

# what the table is computed from
d=results/small_world/people240
published "$W" "$d/$V"
cp "$W"/{world.json,finetune.tsv,heldout.tsv} "$d/"
cp "$W/$V.knowledge.png" "$d/$V/knowledge.png"

# the same world pretrained otherwise, each checkpoint finetuned on all 180 at 6e-4 and probed
pretrained_otherwise() {  # NAME BATCH EPOCHS SAVE_EVERY SEED [run.py flags]
    local name=$1 B=$W/$1 batch=$2 epochs=$3 every=$4 seed=$5
    shift 5
    mkdir -p "$B"
    pretrained "$B/$V.pretrain.params" --batch_size "$batch" --max_epochs "$epochs" --save_every "$every" \
        --edition 2021 --seed "$seed" "$@"
    finetuned 180 "$B/grid_180_30_epochs_lr_6e-4" --pretrained "$B/$V".pretrain.epoch*.params --max_epochs 30 || exit
    probed "$B"
    published "$B" "$d/$name"
}
pretrained_otherwise ${V}_batch16 16 20 5 0     # 1.2x the steps a minute, 0.6x the epochs
pretrained_otherwise ${V}_batch128 128 60 10 0  # the handout's batch: 2.2x the epochs a minute
pretrained_otherwise ${V}_seed1 32 40 20 1      # the first 40 epochs again, another seed
pretrained_otherwise ${V}_seed2 32 40 20 2      # and a third
pretrained_otherwise ${V}_seed3 32 40 20 3      # a fourth
pretrained_otherwise ${V}_seed4 32 40 20 4      # and a fifth

# the same people with one biography each (16 copies of it), pretrained as seed 0's first 40 epochs
W=$OUT/people240_one d=results/small_world/people240_one
$py research/small_world.py --seed 0 --outdir "$W" --people 240 --documents 16 --paraphrases 1 \
    --attributes 0 --finetune_share 0.75
cp "$W/finetune.tsv" "$W/finetune180.tsv"
pretrained_otherwise $V 32 40 20 0
for seed in 1 2 3 4; do pretrained_otherwise ${V}_seed$seed 32 40 20 $seed; done
cp "$W"/{world.json,finetune.tsv,heldout.tsv} "$d/"

# the exposure curve: as many people, each with 4 to 28 documents (16 on average, as many
# documents in all), the floor first, then pretraining seeds 0 to 4 as above
W=$OUT/people240_docs4-28 d=results/small_world/people240_docs4-28
$py research/small_world.py --seed 0 --outdir "$W" --people 240 --documents 4-28 --paraphrases 4 \
    --attributes 0 --finetune_share 0.75
cp "$W/finetune.tsv" "$W/finetune180.tsv"
$py research/untrained.py $V "$W/world.txt" --seed 0 --edition 2021 --writing_params_path "$W/$V.untrained.params"
finetuned 180 "$W/$V/grid_180_30_epochs_lr_6e-4" --pretrained "$W/$V.untrained.params" --max_epochs 30 --seeds 0 1 2
pretrained_otherwise $V 32 40 20 0
for seed in 1 2 3 4; do pretrained_otherwise ${V}_seed$seed 32 40 20 $seed; done
cp "$W"/{world.json,finetune.tsv,heldout.tsv} "$d/"
$py research/reached_by_documents.py "$d/$V" "$d/${V}"_seed* --plot "$d/by_documents.png"

# the four variants on one world: vanilla, the synthesizer and the perceiver (the 2023
# handout's bottleneck, 64) on the paraphrased world, each beside its own floor (its untrained
# model finetuned alike) and pretrained as RoPE's seeds 0 to 4 were
W=$OUT/people240 d=results/small_world/people240
for V in vanilla synthesizer perceiver; do
    flags=
    [ $V = perceiver ] && flags='--bottleneck_dim 64'
    $py research/untrained.py $V "$W/world.txt" --seed 0 --edition 2021 $flags \
        --writing_params_path "$W/$V.untrained.params"
    finetuned 180 "$W/$V/grid_180_30_epochs_lr_6e-4" --pretrained "$W/$V.untrained.params" --max_epochs 30 --seeds 0 1 2
    pretrained_otherwise $V 32 40 20 0 $flags
    for seed in 1 2 3 4; do pretrained_otherwise ${V}_seed$seed 32 40 20 $seed $flags; done
done
V=rope
$py research/reached_by_variant.py "$d"/{vanilla,synthesizer,perceiver,rope}{,_seed?} --plot "$d/by_variant.png"
