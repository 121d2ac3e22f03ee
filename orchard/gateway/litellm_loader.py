"""litellm, imported on first use (it takes seconds to import): `import orchard.gateway` stays cheap.

Its own module because both ways of calling a model need it: provider.py calls through litellm, and
direct.py (the fast path) reads litellm's price table and parameter names to decide when it may skip it."""

from __future__ import annotations

import functools
import os
from types import ModuleType


@functools.cache
def load_litellm() -> ModuleType:
    # Without this litellm downloads its model price map at import; the copy it ships is used instead
    # (set LITELLM_LOCAL_MODEL_COST_MAP=False to fetch current prices).
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm

    litellm.suppress_debug_info = True  # else it prints provider-list banners on stdout for unpriced models
    from orchard.policies.litellm_provider import register

    register(litellm)  # Orchard's own models (oracle, smollm2) as the litellm provider `orchard`
    return litellm
