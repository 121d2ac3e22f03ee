"""Keep a vLLM server's weights in step with the trainer without CUDA or NCCL: save the trainer's model to
a directory, then ask the server to reload its weights from there.

vLLM's OpenAI server, started with `VLLM_SERVER_DEV_MODE=1`, has `POST /collective_rpc`; its workers'
`reload_weights(weights_path=DIR)` reads the checkpoint in place (same architecture, new values), and
`POST /reset_prefix_cache` drops the KV states computed with the old weights. This goes through the
disk, so it costs a save and a load per step — fine for small models and for a trainer and a server on one
machine (or a shared volume); a large model on many GPUs wants vLLM's weight-transfer engine (NCCL)
instead, which this does not use.

    policy = VLLMPolicy(tokenizer=..., url=URL, served_model=NAME, sync=ReloadWeights(URL, "runs/rl/sync"))

The server reads the path itself, so `directory` must be visible to it under the same path."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import httpx

from orchard.core.errors import ModelError


class ReloadWeights:
    """`sync(model)`: write `model` to `directory/step-N`, have the server at `url` reload it, and keep only
    the newest checkpoint."""

    def __init__(self, url: str, directory: str | Path, *, timeout_s: float = 600.0) -> None:
        root = url.rstrip("/")
        self.root = root[:-3] if root.endswith("/v1") else root
        self.directory = Path(directory)
        self.timeout_s = timeout_s
        self.syncs = 0
        self._last: Path | None = None

    def __call__(self, model: Any) -> None:
        target = (self.directory / f"step-{self.syncs + 1}").resolve()
        shutil.rmtree(target, ignore_errors=True)
        try:
            model.save_pretrained(str(target), safe_serialization=True)
            with httpx.Client(base_url=self.root, timeout=self.timeout_s) as client:
                self._post(client, "/collective_rpc", {"method": "reload_weights",
                                                       "kwargs": {"weights_path": str(target)}})
                self._post(client, "/reset_prefix_cache", None)
        except BaseException:
            shutil.rmtree(target, ignore_errors=True)
            raise
        if self._last is not None:
            shutil.rmtree(self._last, ignore_errors=True)
        self._last = target
        self.syncs += 1

    def close(self) -> None:
        """Remove the last checkpoint (the server has read it), and the directory if nothing else is in it."""
        if self._last is not None:
            shutil.rmtree(self._last, ignore_errors=True)
            self._last = None
        try:
            self.directory.rmdir()
        except OSError:
            pass  # absent, or holds something not ours

    def _post(self, client: httpx.Client, path: str, body: dict[str, Any] | None) -> None:
        try:
            response = client.post(path, json=body) if body is not None else client.post(path)
        except httpx.HTTPError as exc:
            raise ModelError(f"the vLLM server at {self.root} did not answer {path}: {exc}") from exc
        if response.status_code == 404:
            raise ModelError(f"the vLLM server at {self.root} has no {path}: start it with VLLM_SERVER_DEV_MODE=1 "
                             "to let the trainer reload its weights")
        if response.status_code != 200:
            raise ModelError(f"the vLLM server at {self.root} answered {path} with {response.status_code}: "
                             f"{response.text[:500]}")
