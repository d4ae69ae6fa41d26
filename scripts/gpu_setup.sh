# Source at the start of a device-machine command (a lent GPU, no network): installs the wheels
# carried in .whl/ (the project's dependencies its image lacks: craftax, tyro, zarr, ...) into
# /tmp/site, puts them and the checkout on PYTHONPATH, and prints what the run has.
set -o pipefail
export PYTHONUNBUFFERED=1 WANDB_MODE=disabled JAX_COMPILATION_CACHE_DIR=/tmp/jax_cache
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || return 1
export PYTHONPATH=/tmp/site:$PWD
if [ -d .whl/textures ]; then  # Craftax's texture caches, carried as numpy (gpu_prepare.sh)
    python3 - <<'PYEOF' || echo "warning: the carried texture caches did not load; Craftax builds its own"
import bz2, glob, os, pickle
import jax.numpy as jnp
import craftax
to_jnp = lambda v: ([to_jnp(x) for x in v] if isinstance(v, list) else
                    {k: to_jnp(x) for k, x in v.items()} if isinstance(v, dict) else jnp.asarray(v))
for src in glob.glob(".whl/textures/*.pbz2"):
    with bz2.BZ2File(src) as f:
        cache = to_jnp(pickle.load(f))
    dst = os.path.join(os.path.dirname(craftax.__file__), *os.path.basename(src).split("+"))
    with bz2.BZ2File(dst + ".tmp", "w") as f:  # whole or not at all: Craftax reads what is there
        pickle.dump(cache, f)
    os.replace(dst + ".tmp", dst)
PYEOF
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import jax, jaxlib, flax, torch, transformers; print('jax', jax.__version__, jax.devices(), 'flax', flax.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__)"
