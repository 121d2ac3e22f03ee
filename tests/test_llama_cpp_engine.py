"""smollm2's llama_cpp engine: a real llama-server (Debian forky's llama.cpp, built into the cache on first use
from deb.debian.org, as harness bundles fetch their Debian parts) on the real SmolLM2 GGUF, asked with token
ids. Checks what the policy relies on: the sampled ids and one logprob each come back, they decode to the
text, greedy repeats exactly, the end-of-turn token ends a turn, the server dies with close() and with its
parent, and a missing runtime or bad setting says what to do."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers")

from orchard.core.errors import ModelError, ModelUnreachable  # noqa: E402
from orchard.policies.llama_cpp_engine import DIRECTORY_PREFIX, LlamaServer, remove_stale_directories  # noqa: E402
from orchard.policies.llama_cpp_runtime import (CPU_VARIANTS, LlamaCppRuntime, backend_for_cpu,  # noqa: E402
                                                ensure_runtime)
from orchard.policies.smollm2 import END_OF_TURN, EngineSettings, locate_gguf  # noqa: E402

pytestmark = [pytest.mark.model, pytest.mark.slow]
LOGPROB_TOLERANCE = 0.75  # measured: mean 0.04, max 0.25 over these 3 prompts x 24 tokens


@pytest.fixture(scope="module")
def runtime() -> LlamaCppRuntime:
    return ensure_runtime()


@pytest.fixture(scope="module")
def tokenizer():
    gguf = locate_gguf()
    return transformers.AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name, local_files_only=True)


@pytest.fixture(scope="module")
def server(runtime):
    started = LlamaServer(runtime, locate_gguf(), threads=1, context=4096)
    yield started
    started.close()


def chat_ids(tokenizer, text: str) -> list[int]:
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                             tokenize=False)
    return tokenizer(rendered, add_special_tokens=False)["input_ids"]


def greedy(server, prompt, **overrides):
    options = dict(max_new_tokens=48, temperature=None, top_k=50, top_p=None, seed=None, top_logprobs=2, stop=[],
                   timeout_s=60)
    return server.complete(prompt, **{**options, **overrides})


def test_ids_and_logprobs_come_back_and_greedy_repeats(server, tokenizer):
    prompt = chat_ids(tokenizer, "Say hello in one short sentence.")
    first = greedy(server, prompt)
    assert first.ids and len(first.logprobs) == len(first.ids) == len(first.top)
    assert all(logprob <= 0.0 for logprob in first.logprobs)
    # greedy: each sampled token is the most likely one, reported with its own logprob
    assert all(top[0] == (token, logprob) for token, logprob, top in zip(first.ids, first.logprobs, first.top))
    assert tokenizer.decode(first.ids).strip()
    if not first.hit_limit:
        assert first.ids[-1] == tokenizer.convert_tokens_to_ids(END_OF_TURN)
    again = greedy(server, prompt)
    assert again.ids == first.ids
    assert again.logprobs == pytest.approx(first.logprobs, abs=1e-3)
    assert again.cached_tokens > 0  # the server reused the prompt's states


def test_max_tokens_and_sampling_with_a_seed(server, tokenizer):
    prompt = chat_ids(tokenizer, "Write a long story about a dragon.")
    limited = greedy(server, prompt, max_new_tokens=5)
    assert len(limited.ids) == 5 and limited.hit_limit
    sampled = [greedy(server, prompt, max_new_tokens=12, temperature=1.0, top_p=0.95, seed=7) for _ in range(2)]
    assert sampled[0].ids == sampled[1].ids and all(lp <= 0.0 for lp in sampled[0].logprobs)


def test_close_ends_the_server_and_removes_its_socket(runtime):
    started = LlamaServer(runtime, locate_gguf(), threads=1, context=512)
    process, socket = started.process, started.socket
    assert process is not None and process.poll() is None and socket.exists()
    started.close()
    assert process.poll() is not None and not socket.parent.exists()
    with pytest.raises(ModelError, match="closed"):
        greedy(started, [1, 2, 3])


def test_the_server_dies_with_its_parent(runtime):
    """SIGKILL the process that started a server (no close, no atexit): the kernel kills the server, and the
    directory it leaves is removed by the next server's start (`remove_stale_directories`), while that of a
    live owner stays."""
    script = ("import sys; from pathlib import Path; from orchard.policies.llama_cpp_engine import LlamaServer; "
              "from orchard.policies.llama_cpp_runtime import find_runtime; "
              "from orchard.policies.smollm2 import locate_gguf; "
              "s = LlamaServer(find_runtime(), locate_gguf(), threads=1, context=512); "
              "print(s.process.pid, s.socket.parent, flush=True); sys.stdin.read()")
    parent = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    directory = None
    try:
        pid, directory = parent.stdout.readline().split()
        server_pid = int(pid)
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
        for _ in range(200):
            if not Path(f"/proc/{server_pid}").exists() or _is_zombie(server_pid):
                break
            time.sleep(0.05)
        assert not Path(f"/proc/{server_pid}").exists() or _is_zombie(server_pid)
        live = Path(tempfile.mkdtemp(prefix=f"{DIRECTORY_PREFIX}{os.getpid()}-"))
        try:
            assert Path(directory) in remove_stale_directories()
            assert not Path(directory).exists() and live.is_dir()
        finally:
            live.rmdir()
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        if directory:  # its socket and log: the killed parent could not remove them
            shutil.rmtree(directory, ignore_errors=True)


def _is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z")
    except (OSError, IndexError):
        return True


def test_a_missing_runtime_says_how_to_rebuild(tmp_path):
    broken = LlamaCppRuntime(root=tmp_path / "gone", suite="forky", packages={})
    with pytest.raises(ModelError, match="remove that directory"):
        LlamaServer(broken, locate_gguf(), threads=1, context=512)


def test_engine_setting_and_cpu_variant():
    assert EngineSettings.model_validate({"engine": "llama_cpp"}).engine == "llama_cpp"
    with pytest.raises(Exception):
        EngineSettings.model_validate({"engine": "llamacpp"})
    assert backend_for_cpu(set()) == "x64"
    assert backend_for_cpu({"avx", "avx2", "fma", "f16c", "bmi2", "sse4_2"}) == "haswell"
    assert backend_for_cpu() in {name for name, _ in CPU_VARIANTS}


def test_the_policy_returns_the_servers_ids_and_logprobs(runtime):
    """smollm2 end to end with ORCHARD_SMOLLM2_ENGINE=llama_cpp, in a fresh process (the model is one per process)."""
    script = ("import json; from orchard.policies import smollm2\n"
              "c = smollm2.complete([{'role': 'user', 'content': 'What is 2 + 2?'}], None, {'max_tokens': 24})\n"
              "m = smollm2.get_model()\n"
              "print(json.dumps({'ids': c.completion_token_ids, 'logprobs': [t.logprob for t in c.logprobs],\n"
              "  'token_ids': [t.token_id for t in c.logprobs], 'content': c.message['content'],\n"
              "  'text': m.tokenizer.decode(c.completion_token_ids, skip_special_tokens=True),\n"
              "  'prompt': len(c.prompt_token_ids), 'server': m.llama_server.process.pid}))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=240,
                          env={**os.environ, "ORCHARD_SMOLLM2_ENGINE": "llama_cpp", "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    import json

    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["ids"] and got["ids"] == got["token_ids"] and got["prompt"] > 0
    assert all(lp <= 0.0 for lp in got["logprobs"])
    assert got["content"].strip() and got["text"].strip().startswith(got["content"].strip()[:10])
    assert not Path(f"/proc/{got['server']}").exists() or _is_zombie(got["server"])  # gone at exit


def test_logprobs_are_the_quantized_models_close_to_the_torch_models(server, tokenizer):
    """The server's logprob of each id it sampled against the float32 model's (the same GGUF dequantized) read
    teacher-forced: close, not equal (Q4_1 kernels, 8-bit activations). docs/models.md states the gap."""
    torch = pytest.importorskip("torch")
    from orchard.policies.smollm2.checkpoints import load_model

    _, model = load_model(transformers, torch, locate_gguf())
    gaps = []
    for question in ("What is the capital of France?", "List three colours.", "Write a Python hello world."):
        prompt = chat_ids(tokenizer, question)
        got = greedy(server, prompt, max_new_tokens=24)
        with torch.inference_mode():
            logits = model(input_ids=torch.tensor([prompt + got.ids])).logits[0, len(prompt) - 1:-1].float()
        expected = torch.log_softmax(logits, -1).gather(1, torch.tensor(got.ids)[:, None])[:, 0].tolist()
        gaps += [abs(a - b) for a, b in zip(got.logprobs, expected)]
    assert max(gaps) < LOGPROB_TOLERANCE, (sum(gaps) / len(gaps), sorted(gaps)[-5:])



def test_a_call_past_its_timeout_fails_as_the_models_and_the_server_goes_on(server, tokenizer):
    prompt = chat_ids(tokenizer, "Write a long story about a cat.")
    with pytest.raises(ModelUnreachable, match="smollm2 did not finish within 0.05 s") as failure:
        greedy(server, prompt, max_new_tokens=400, timeout_s=0.05)
    assert failure.value.__context__ is None  # not an httpx timeout: the gateway would call it the network's
    assert greedy(server, prompt, max_new_tokens=4).ids
