"""Client for a vLLM server: `/pooling` (per-token hidden states) and `/v1/completions` (generated
token ids). No JAX here.

Serve a model with `vllm serve DIR --runner pooling --convert embed --pooler-config
'{"task":"token_embed"}' --dtype float32`; its states are post-final-norm, so compare with our
`post_norm=True` (truncate the checkpoint with `python -m llm_jax truncate` for inner layers).
Failures raise `VLLMError` naming the server and the fix; zeros are never returned instead.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import numpy as np
import requests
from requests.adapters import HTTPAdapter
from urllib3.util.retry import Retry


class VLLMError(RuntimeError):
    """The server is unreachable, serves another model, or answered something malformed."""


class VLLMClient:
    """Retries (connection failures, 5xx answers) are urllib3's `Retry` with exponential backoff,
    mounted on a requests session; what still fails after them raises `VLLMError`."""

    def __init__(self, url: str, model: str | None = None, timeout: float = 120.0,
                 retries: int = 3, backoff: float = 0.5):
        self.url = url.rstrip("/")
        self.model = model
        self.timeout = timeout
        self.retries = retries
        self.session = requests.Session()
        retry = Retry(total=retries, backoff_factor=backoff, status_forcelist=(500, 502, 503, 504),
                      allowed_methods=None, raise_on_status=False)
        self.session.mount("http://", HTTPAdapter(max_retries=retry))
        self.session.mount("https://", HTTPAdapter(max_retries=retry))

    def _request(self, method: str, path: str, **kw) -> dict:
        tries = f"after {self.retries + 1} tries"
        try:
            r = self.session.request(method, self.url + path, timeout=self.timeout, **kw)
        except requests.Timeout:
            raise VLLMError(f"vLLM server at {self.url} gave no answer within {self.timeout}s "
                            f"{tries}; is it overloaded? raise the client timeout") from None
        except requests.ConnectionError as e:
            raise VLLMError(f"vLLM server at {self.url} unreachable {tries} "
                            f"({type(e).__name__}); start it (see scripts/vllm_server.sh) or fix "
                            "--llm.url") from None
        if r.status_code >= 400:
            raise VLLMError(f"{self.url}{path} answered {r.status_code}"
                            f"{' ' + tries if r.status_code >= 500 else ''}: {r.text[:300]}")
        try:
            return r.json()
        except ValueError:
            raise VLLMError(f"{self.url}{path} answered non-JSON: {r.text[:200]!r}") from None

    def health(self) -> list[str]:
        """Check the server answers and serves `model` (if set); returns the served model ids."""
        data = self._request("GET", "/v1/models")
        try:
            ids = [m["id"] for m in data["data"]]
        except (KeyError, TypeError):
            raise VLLMError(f"{self.url}/v1/models answered malformed JSON: {str(data)[:200]}")
        if self.model is not None and self.model not in ids:
            raise VLLMError(f"vLLM at {self.url} serves {ids}, not {self.model!r}; start it with "
                            "that model or pass the served name")
        if self.model is None:
            self.model = ids[0]
        return ids

    def token_states(self, token_ids: list[list[int]]) -> list[np.ndarray]:
        """Per-token post-norm hidden states, one float32 array [T_i, H] per input sequence."""
        if self.model is None:
            self.health()
        body = {"model": self.model, "input": [list(map(int, t)) for t in token_ids],
                "task": "token_embed", "use_activation": False}
        data = self._request("POST", "/pooling", json=body)
        try:
            items = sorted(data["data"], key=lambda d: d["index"])
            out = [np.asarray(d["data"], np.float32) for d in items]
        except (KeyError, TypeError, ValueError) as e:
            raise VLLMError(f"{self.url}/pooling answered malformed data ({e}): {str(data)[:200]}")
        if len(out) != len(token_ids):
            raise VLLMError(f"{self.url}/pooling returned {len(out)} results for "
                            f"{len(token_ids)} inputs")
        for ids, arr in zip(token_ids, out):
            if arr.ndim != 2 or arr.shape[0] != len(ids) or not np.isfinite(arr).all():
                raise VLLMError(f"{self.url}/pooling returned shape {arr.shape} (or non-finite "
                                f"values) for {len(ids)} tokens; is the server started with "
                                "--pooler-config '{\"task\":\"token_embed\"}'?")
        return out

    def generate_tokens(self, token_ids: list[list[int]], max_tokens: int,
                        temperature: float = 0.0, ignore_eos: bool = True) -> list[list[int]]:
        """Generated token ids per prompt (prompts given as token ids) from a generation server
        (`scripts/vllm_server.sh serve-generate`): `/v1/completions` with `return_token_ids`."""
        if self.model is None:
            self.health()
        body = {"model": self.model, "prompt": [list(map(int, t)) for t in token_ids],
                "max_tokens": max_tokens, "temperature": temperature, "ignore_eos": ignore_eos,
                "return_token_ids": True, "skip_special_tokens": False}
        data = self._request("POST", "/v1/completions", json=body)
        try:
            items = sorted(data["choices"], key=lambda d: d["index"])
            out = [list(map(int, c["token_ids"])) for c in items]
        except (KeyError, TypeError, ValueError) as e:
            raise VLLMError(f"{self.url}/v1/completions answered malformed data ({e}): "
                            f"{str(data)[:200]}; is it a generation server (serve-generate)?")
        if len(out) != len(token_ids):
            raise VLLMError(f"{self.url}/v1/completions returned {len(out)} results for "
                            f"{len(token_ids)} prompts")
        return out


def launch_server(script: str | Path, model_dir: str | Path, port: int,
                  timeout: float = 600.0, mode: str = "serve"
                  ) -> tuple[subprocess.Popen, VLLMClient]:
    """Start `script MODE MODEL_DIR PORT` (scripts/vllm_server.sh; mode `serve` for pooling,
    `serve-generate` for generation) in its own session, logging to
    MODEL_DIR/server.log, and wait until it answers. Returns (process, client); the caller stops
    it with os.killpg(proc.pid, ...). Raises VLLMError with the log's tail if it never comes up."""
    model_dir = Path(model_dir)
    log_path = model_dir / "server.log"
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "PYTHONPATH")}
    with open(log_path, "w") as log:
        # cwd: the model folder, not a source tree whose packages would shadow the server's own
        # (transformers probes an optional package named `kernels`, as is ours)
        proc = subprocess.Popen(["bash", str(Path(script).resolve()), mode,
                                 str(model_dir.resolve()), str(port)], stdout=log,
                                stderr=subprocess.STDOUT, env=env, cwd=model_dir,
                                start_new_session=True)
    client = VLLMClient(f"http://127.0.0.1:{port}", retries=0, timeout=5)
    deadline = time.time() + timeout
    while True:
        try:
            client.health()
            return proc, client
        except VLLMError:
            if proc.poll() is not None or time.time() > deadline:
                if proc.poll() is None:
                    os.killpg(proc.pid, 9)
                raise VLLMError("vLLM server did not start:\n"
                                + log_path.read_text()[-3000:]) from None
            time.sleep(0.25)  # (a refused connection costs nothing)
