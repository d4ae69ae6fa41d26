# Source at the start of a device-machine command (a lent GPU, no network): installs the wheels
# carried in .whl/ (the project's dependencies its image lacks: craftax, tyro, zarr, ...) into
# /tmp/site, puts them and the checkout on PYTHONPATH, and prints what the run has.
set -o pipefail
export PYTHONUNBUFFERED=1 WANDB_MODE=disabled JAX_COMPILATION_CACHE_DIR=/tmp/jax_cache
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || return 1
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import jax, jaxlib, flax, torch, transformers; print('jax', jax.__version__, jax.devices(), 'flax', flax.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__)"
