#!/usr/bin/env bash
# Builds Craftax's texture caches (kept inside the installed craftax package), once per
# install. Craftax builds them on a pixel renderer's first use, unannounced in the time it takes
# (2026-11-27, one core of a 2-core Intel Xeon: 81 s the full game's, 16 s Classic's), and a
# second process starting meanwhile builds them again. Here both are built at once, each in
# its own process; a cache already there is read, not rebuilt.
#   bash scripts/craftax_textures.sh      (with the project's Python active)
set -euo pipefail
PY=${PYTHON:-python}
"$PY" -c "import craftax" 2>/dev/null \
    || { echo "error: $PY cannot import craftax: activate the project's venv (pip install -e .) or set PYTHON"; exit 1; }
for game in craftax craftax_classic; do
    "$PY" -c "from craftax.$game.constants import load_all_textures; load_all_textures()" \
        >/dev/null &
done
for job in $(jobs -p); do wait "$job"; done
echo "Craftax texture caches ready"
