"""Every harness's tool vocabulary by name: react's and mini-swe-agent's (actions.py), Kimi-CLI's and
OpenHands' (agents.py)."""

from __future__ import annotations

from orchard.recipes.translate.actions import ToolVocabulary, UntranslatableCall, mini_vocabulary, react_vocabulary
from orchard.recipes.translate.agents import AGENT_VOCABULARIES

VOCABULARIES: dict[str, ToolVocabulary] = {
    "react": react_vocabulary,
    "mini-swe-agent": mini_vocabulary,
    **AGENT_VOCABULARIES,
}


def vocabulary(harness: str) -> ToolVocabulary:
    try:
        return VOCABULARIES[harness]
    except KeyError:
        raise UntranslatableCall(f"no tool vocabulary for harness {harness!r}; translation knows "
                                 f"{', '.join(sorted(VOCABULARIES))}") from None
