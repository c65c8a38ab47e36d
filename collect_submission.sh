#!/usr/bin/env bash
# Packs src/ and the assignment's results for Gradescope, for the handout edition given
# (default 2021). Run from the repo root after the handout's commands have produced them.
#   bash collect_submission.sh         2021: assignment5.zip, vanilla and synthesizer
#   bash collect_submission.sh 2023    assignment5.zip, vanilla and perceiver
#   bash collect_submission.sh 2024    assignment4_submission.zip, vanilla and rope, and
#                                      london_baseline_accuracy.txt (python london_baseline.py); 2025 the same
set -euo pipefail
cd "$(dirname "$0")"

edition="${1:-2021}"
case "$edition" in
    2021) variant=synthesizer; zipfile=assignment5.zip; extra=() ;;
    2023) variant=perceiver; zipfile=assignment5.zip; extra=() ;;
    2024|2025) variant=rope; zipfile=assignment4_submission.zip; extra=(london_baseline_accuracy.txt) ;;
    *) echo "error: unknown edition '$edition' (2021, 2023, 2024 or 2025)" >&2; exit 2 ;;
esac

results=(
    vanilla.model.params vanilla.nopretrain.dev.predictions vanilla.nopretrain.test.predictions
    vanilla.finetune.params vanilla.pretrain.dev.predictions vanilla.pretrain.test.predictions
    "$variant.finetune.params" "$variant.pretrain.dev.predictions" "$variant.pretrain.test.predictions"
    ${extra[@]+"${extra[@]}"}
)
for f in london_baseline.py "${results[@]}"; do
    if [ ! -f "$f" ]; then
        echo "error: $f is missing; run the handout's commands that produce it first" >&2
        exit 1
    fi
done

if ! command -v zip >/dev/null; then
    # Git Bash on Windows, and some images, have no zip: Python's zipfile makes the same archive
    echo "error: zip is not installed; make the archive with: python -m zipfile -c $zipfile src london_baseline.py ${results[*]}" >&2
    exit 1
fi

rm -f "$zipfile"
# london_baseline.py too: the local grader (grading/grade.py) runs it
zip -q -r "$zipfile" src/ london_baseline.py "${results[@]}" -x '*__pycache__*' '*.pyc'
echo "wrote $zipfile: src/, london_baseline.py and ${#results[@]} results"
