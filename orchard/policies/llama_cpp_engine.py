"""smollm2's llama_cpp engine: a `llama-server` process (llama_cpp_runtime.py) on the GGUF file itself,
asked through its native `/completion` endpoint with the prompt as token ids (rendered by the same
tokenizer and chat template as the other engines) and answering with the sampled token ids and the logprob
of each (`n_probs`, from the raw distribution: `post_sampling_probs` off).

- For inference only (eval, demos): the server runs the Q4_1 weights as they are, so its logprobs differ
  from the torch engines' (which run the dequantized weights), and it never sees weights a trainer changes.
- One server per process, on a Unix socket in a private temporary directory (no port to race for), one
  thread by default (ggml's threads spin-wait: on a busy 2-core machine two are several times slower than
  one), its own prompt cache (`cache_prompt`: an agent's next prompt reuses the last one's states).
- Flash attention is asked for explicitly (`--flash-attn on`, not left to `auto`): without it a 1345-token
  prefill measured 0.6-0.75x as fast. Even with it, ggml's CPU attention dominates a long prefill: one
  thread reads a 128-token batch at ~680 tokens/s at depth 0 but ~165 at depth 1216 (llama-bench), so
  about 70% of a 1345-token prompt's time is attention, not the weights (those run on AMX tiles through the
  sapphirerapids variant). The batch sizes (-ub 64..1344), a bf16 or q8_0 KV cache (half as fast as f16)
  and a second batch thread on 2 busy cores do not help.
- The server dies with this process: killed by `close()`, at exit, and by the kernel if this process dies
  first (PR_SET_PDEATHSIG). The temporary directory of a process that died without its `close()` (SIGKILL)
  is removed by the next server started on the machine (its name holds the owner's pid)."""

from __future__ import annotations

import atexit
import ctypes
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from orchard.core.errors import ModelError, ModelUnreachable
from orchard.policies.llama_cpp_runtime import LlamaCppRuntime

START_TIMEOUT_S = 120.0
_PR_SET_PDEATHSIG = 1
DIRECTORY_PREFIX = "orchard-llama-"  # then the owner's pid and "-"
_OWNED_DIRECTORY = re.compile(re.escape(DIRECTORY_PREFIX) + r"(\d+)-")


@dataclass
class ServerResult:
    ids: list[int]
    logprobs: list[float]
    top: list[list[tuple[int, float]]]
    hit_limit: bool
    prompt_ms: float
    predicted_ms: float
    cached_tokens: int


def _die_with_parent() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class LlamaServer:
    """A running llama-server for one GGUF file."""

    def __init__(self, runtime: LlamaCppRuntime, gguf: Path, *, threads: int, context: int) -> None:
        remove_stale_directories()
        self._directory = Path(tempfile.mkdtemp(prefix=f"{DIRECTORY_PREFIX}{os.getpid()}-"))
        self.socket = self._directory / "server.sock"
        self._log = open(self._directory / "server.log", "w+b")
        self._lock = threading.Lock()
        argv = runtime.command("-m", str(gguf), "--host", str(self.socket), "-t", str(threads), "-tb",
                               str(threads), "-c", str(context), "--parallel", "1", "--no-webui",
                               "--flash-attn", "on")
        try:
            self.process: subprocess.Popen | None = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
                env={**os.environ, **runtime.environment()}, preexec_fn=_die_with_parent)
        except OSError as exc:
            self.close()
            raise ModelError(f"cannot start llama-server from {runtime.root} ({exc}); remove that directory to "
                             "build it again") from None
        atexit.register(self.close)
        self.client = httpx.Client(transport=httpx.HTTPTransport(uds=str(self.socket)), base_url="http://llama",
                                   timeout=None)
        try:
            self._wait_ready()
        except BaseException:
            self.close()
            raise

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise ModelError(f"llama-server exited with {self.process.returncode} while starting: "
                                 f"{self.log_tail()}")
            if self.socket.exists():
                try:
                    if self.client.get("/health", timeout=5).status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
            time.sleep(0.05)
        raise ModelError(f"llama-server was not ready within {START_TIMEOUT_S:g} s: {self.log_tail()}")

    def log_tail(self) -> str:
        self._log.flush()
        self._log.seek(0)
        return self._log.read().decode(errors="replace").strip()[-1500:]

    def complete(self, prompt: list[int], *, max_new_tokens: int, temperature: float | None, top_k: int,
                 top_p: float | None, seed: int | None, top_logprobs: int, stop: list[str],
                 timeout_s: float | None, cache_prompt: bool = True) -> ServerResult:
        """Generate after `prompt` (greedy unless `temperature` > 0); the ids and raw logprobs. With
        `cache_prompt` the server reuses the states of the longest prefix it still holds."""
        body = {"prompt": prompt, "n_predict": max_new_tokens, "n_probs": max(1, top_logprobs),
                "post_sampling_probs": False, "return_tokens": True, "cache_prompt": cache_prompt, "stop": stop,
                "temperature": temperature or 0.0, "top_k": top_k if temperature else 1,
                "top_p": top_p if (temperature and top_p is not None) else 1.0, "min_p": 0.0,
                "repeat_penalty": 1.0, "seed": seed if seed is not None else -1}
        with self._lock:
            if self.process is None:
                raise ModelError("llama-server was closed")
            response, failure = None, None
            try:
                response = self.client.post("/completion", json=body, timeout=timeout_s)
            except httpx.TimeoutException:
                failure = "timeout"
            except httpx.HTTPError as exc:
                failure = str(exc)
        # raised outside the except blocks: the gateway reads an httpx timeout in an error's context as the
        # network's, and this is the model's own deadline
        if failure == "timeout":
            raise ModelUnreachable(f"smollm2 did not finish within {timeout_s:g} s (prompt of {len(prompt)} "
                                   "tokens, llama_cpp engine); raise the gateway's timeout_s or ask for fewer "
                                   "max_tokens")
        if failure is not None or response is None:
            raise ModelError(f"llama-server did not answer ({failure}): {self.log_tail()}")
        if response.status_code != 200:
            raise ModelError(f"llama-server refused the request ({response.status_code}): {response.text[:500]}")
        data = response.json()
        probabilities = data.get("completion_probabilities") or []
        ids = [int(p["id"]) for p in probabilities]
        if ids != list(data.get("tokens") or []):
            raise ModelError(f"llama-server's tokens and their probabilities disagree ({data.get('tokens')} vs "
                             f"{ids}); this llama.cpp version is not supported")
        top = [[(int(t["id"]), float(t["logprob"])) for t in p.get("top_logprobs", [])[:top_logprobs]]
               for p in probabilities]
        timings = data.get("timings") or {}
        return ServerResult(ids=ids, logprobs=[float(p["logprob"]) for p in probabilities], top=top,
                            hit_limit=data.get("stop_type") == "limit",
                            prompt_ms=float(timings.get("prompt_ms", 0.0)),
                            predicted_ms=float(timings.get("predicted_ms", 0.0)),
                            cached_tokens=int(timings.get("cache_n", 0)))

    def close(self) -> None:
        process, self.process = getattr(self, "process", None), None
        if process is not None and process.poll() is None:
            process.kill()
            process.wait()
        client = getattr(self, "client", None)
        if client is not None:
            client.close()
        if not self._log.closed:
            self._log.close()
        shutil.rmtree(self._directory, ignore_errors=True)
        atexit.unregister(self.close)


def remove_stale_directories(base: Path | None = None) -> list[Path]:
    """Remove the servers' directories (a socket and a log) under `base` (default: the temporary directory)
    whose owner, named by the pid in their name, is no longer running: it was killed before its `close()`.
    Only this user's; a directory whose pid is running (or was reused) is kept. Returns those removed."""
    removed = []
    base = Path(base or tempfile.gettempdir())
    try:
        entries = list(base.iterdir())
    except OSError:
        return removed
    for entry in entries:
        match = _OWNED_DIRECTORY.match(entry.name)
        if match is None or Path(f"/proc/{match.group(1)}").exists():
            continue
        try:
            if entry.is_symlink() or not entry.is_dir() or entry.stat().st_uid != os.getuid():
                continue
        except OSError:
            continue
        shutil.rmtree(entry, ignore_errors=True)
        removed.append(entry)
    return removed
