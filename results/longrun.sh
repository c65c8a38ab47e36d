# Sourced by runs.sh, checkpoints.sh and probes.sh, after they set ROOT, CODE and
# CODE_COMMIT: say and fail, then CODE_COMMIT checked out into CODE (ignored; checked out
# again when CODE_COMMIT changes) with the data files, and longrun/venv made (torch as CI's) and
# activated, in CODE.

say() { echo "[$(date -u +%H:%M:%S)] $*"; }
fail() { say "FAILED: $*"; exit 1; }

if [ ! -d "$CODE" ]; then
    git clone -q "$ROOT" "$CODE" || fail "clone"
    cp "$ROOT"/../shared/data/{wiki.txt,birth_places_train.tsv,birth_dev.tsv,birth_test_inputs.tsv} \
        "$CODE/data/" || fail "the data files (../shared/data)"
fi
if [ "$(git -C "$CODE" rev-parse HEAD)" != "$(git -C "$ROOT" rev-parse "$CODE_COMMIT")" ]; then
    git -C "$CODE" fetch -q "$ROOT" && git -C "$CODE" checkout -q "$CODE_COMMIT" || fail "checkout"
fi
if [ ! -x "$ROOT/longrun/venv/bin/python" ]; then
    python3 -m venv "$ROOT/longrun/venv" || fail "venv"
    # CI's torch (the CPU build of 2.13.0), the reference runs' and the one their bit-for-bit
    # losses are checked under; requirements.txt alone takes the newest torch it allows
    "$ROOT/longrun/venv/bin/pip" install -q -r "$CODE/requirements.txt" matplotlib \
        -c "$ROOT/.ci/constraints.txt" || fail "pip"
fi
. "$ROOT/longrun/venv/bin/activate"
cd "$CODE" || exit 1
