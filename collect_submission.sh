#!/usr/bin/env bash
# Packs src/ and the assignment's nine results into assignment5.zip, for Gradescope.
# Run from the repo root after the handout's commands have produced the results.
set -euo pipefail
cd "$(dirname "$0")"

results=(
    vanilla.model.params vanilla.nopretrain.dev.predictions vanilla.nopretrain.test.predictions
    vanilla.finetune.params vanilla.pretrain.dev.predictions vanilla.pretrain.test.predictions
    synthesizer.finetune.params synthesizer.pretrain.dev.predictions synthesizer.pretrain.test.predictions
)
for f in "${results[@]}"; do
    if [ ! -f "$f" ]; then
        echo "error: $f is missing; run the handout's commands that produce it first" >&2
        exit 1
    fi
done

rm -f assignment5.zip
zip -q -r assignment5.zip src/ "${results[@]}" -x '*__pycache__*' '*.pyc'
echo "wrote assignment5.zip: src/ and ${#results[@]} results"
