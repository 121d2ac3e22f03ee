"""Claw-Eval's `task.yaml` as pydantic models (docs/claw.md, "Claw-Eval tasks"): what a task declares — its
services (a command, a port, a health check, a reset endpoint), its prompt, its tools and the endpoint each
tool calls, and how it is scored (weighted `scoring_components`, `safety_checks`, an LLM judge's
`judge_rubric`). Keys Orchard does not use (`expected_actions`, `reference_solution` — prose, not a command —,
`primary_dimensions`, ...) are kept as they are; a key's wrong type, a check type Orchard cannot evaluate, a
tool endpoint naming no declared tool is an error naming the field."""

from __future__ import annotations

from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

# Check types Orchard evaluates from the agent's final text and the services' audit (eval_grade.py).
TEXT_CHECKS = ("keywords_present", "keywords_absent", "min_length")
AUDIT_CHECKS = ("tool_called", "tool_not_called")
JUDGE_CHECK = "llm_judge"  # scored by the judge model (its weight is the judge's share of the completion)
CHECK_TYPES = TEXT_CHECKS + AUDIT_CHECKS + (JUDGE_CHECK,)
# Tools a task declares without an endpoint that Claw-Eval's own harness runs in its sandbox: in Orchard the
# harness's own shell is that tool.
SANDBOX_TOOLS = ("Bash", "bash", "shell")


class _Open(BaseModel):
    """Claw-Eval adds keys between releases: unknown ones are kept, not refused."""

    model_config = ConfigDict(extra="allow")


def _url(value: str, what: str) -> str:
    parts = urlsplit(value)
    if parts.scheme != "http" or not parts.hostname or parts.port is None:
        raise ValueError(f"{what} must be an http://HOST:PORT/... URL, not {value!r}")
    return value


class Service(_Open):
    name: str = Field(pattern=r"^[A-Za-z][A-Za-z0-9_-]{0,62}$")
    command: str = Field(min_length=1, description="run in the Claw-Eval checkout's root (its mock_services/)")
    port: int = Field(ge=1, le=65535)
    health_check: str | None = None
    health_check_method: Literal["GET", "POST", "get", "post"] = "GET"
    ready_timeout: float = Field(default=30, gt=0)
    reset_endpoint: str | None = None
    env: dict[str, str] = Field(default_factory=dict)

    @field_validator("health_check", "reset_endpoint")
    @classmethod
    def _is_url(cls, value: str | None, info) -> str | None:
        return None if value is None else _url(value, info.field_name)

    @field_validator("env", mode="before")
    @classmethod
    def _env_text(cls, value: Any) -> Any:
        return {str(k): str(v) for k, v in value.items()} if isinstance(value, dict) else value

    def audit_url(self) -> str:
        """Where its audit log is: Claw-Eval's mock services keep it beside their reset endpoint
        (`/todo/reset` -> `/todo/audit`), else beside the health check, else at `/audit`."""
        for url in (self.reset_endpoint, self.health_check):
            if url:
                base = url.rstrip("/").rsplit("/", 1)[0]
                return f"{base}/audit"
        return f"http://127.0.0.1:{self.port}/audit"


class Prompt(_Open):
    text: str = Field(min_length=1)
    language: str = "en"


class Tool(_Open):
    name: str = Field(pattern=r"^[A-Za-z][A-Za-z0-9_.-]{0,63}$")
    description: str = ""
    input_schema: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})


class ToolEndpoint(_Open):
    tool_name: str
    url: str
    method: Literal["GET", "POST", "PUT", "PATCH", "DELETE"] = "POST"

    @field_validator("url")
    @classmethod
    def _is_url(cls, value: str) -> str:
        return _url(value, "url")

    @field_validator("method", mode="before")
    @classmethod
    def _upper(cls, value: Any) -> Any:
        return value.upper() if isinstance(value, str) else value


class Environment(_Open):
    timeout_seconds: float | None = Field(default=None, gt=0)
    max_turns: int | None = Field(default=None, ge=1)


class Check(_Open):
    """One deterministic check: `type` says which, the other keys are its arguments."""

    type: str
    description: str = ""
    keywords: list[str] | None = None
    field: str = "final_text"
    min_length: int | None = Field(default=None, ge=0)
    tool_name: str | None = None
    min_count: int = Field(default=1, ge=1)

    @field_validator("keywords", mode="before")
    @classmethod
    def _keyword_text(cls, value: Any) -> Any:  # YAML reads 2.17 as a number: Claw-Eval means the text
        return [str(k) for k in value] if isinstance(value, list) else value

    @model_validator(mode="after")
    def _arguments(self) -> Check:
        if self.type not in CHECK_TYPES:
            raise ValueError(f"check type {self.type!r} is not one Orchard evaluates; it evaluates "
                             f"{', '.join(CHECK_TYPES)} (a task scored otherwise needs its judge_rubric)")
        if self.type in ("keywords_present", "keywords_absent") and not self.keywords:
            raise ValueError(f"a {self.type} check needs `keywords`, a non-empty list")
        if self.type == "min_length" and self.min_length is None:
            raise ValueError("a min_length check needs `min_length`")
        if self.type in TEXT_CHECKS and self.field != "final_text":
            raise ValueError(f"field {self.field!r}: Orchard reads only final_text (the agent's final answer)")
        if self.type in AUDIT_CHECKS and not self.tool_name:
            raise ValueError(f"a {self.type} check needs `tool_name`")
        return self


class ScoringComponent(_Open):
    name: str = Field(min_length=1)
    weight: float = Field(gt=0)
    check: Check


class SafetyCheck(_Open):
    type: Literal["tool_not_called"]
    tool_name: str
    description: str = ""


class ClawEvalTaskSpec(_Open):
    task_id: str = Field(min_length=1)
    task_name: str = ""
    version: str | None = None
    category: str = ""
    difficulty: str = ""
    tags: list[str] = Field(default_factory=list)
    services: list[Service] = Field(default_factory=list)
    prompt: Prompt
    tools: list[Tool] = Field(default_factory=list)
    tool_endpoints: list[ToolEndpoint] = Field(default_factory=list)
    environment: Environment = Field(default_factory=Environment)
    scoring_components: list[ScoringComponent] = Field(default_factory=list)
    safety_checks: list[SafetyCheck] = Field(default_factory=list)
    judge_rubric: str | None = None
    reference_solution: str | None = None

    @field_validator("version", mode="before")
    @classmethod
    def _version_text(cls, value: Any) -> Any:
        return str(value) if isinstance(value, (int, float)) else value

    @model_validator(mode="after")
    def _consistent(self) -> ClawEvalTaskSpec:
        tools = [tool.name for tool in self.tools]
        if len(set(tools)) != len(tools):
            raise ValueError(f"tools: a tool is declared twice ({', '.join(sorted(tools))})")
        for index, endpoint in enumerate(self.tool_endpoints):
            if endpoint.tool_name not in tools:
                raise ValueError(f"tool_endpoints[{index}]: tool_name {endpoint.tool_name!r} is not a declared tool "
                                 f"(tools: {', '.join(tools) or 'none'})")
        names = [service.name for service in self.services]
        if len(set(names)) != len(names):
            raise ValueError(f"services: a service name is used twice ({', '.join(sorted(names))})")
        ports = {service.port: service.name for service in self.services}
        for index, endpoint in enumerate(self.tool_endpoints):
            if urlsplit(endpoint.url).port not in ports:
                raise ValueError(f"tool_endpoints[{index}]: {endpoint.url} is on no declared service's port "
                                 f"({', '.join(f'{n} {p}' for p, n in ports.items()) or 'no services'})")
        for where, checks in (("scoring_components", [c.check for c in self.scoring_components]),
                              ("safety_checks", self.safety_checks)):
            for index, check in enumerate(checks):
                if check.tool_name is not None and check.tool_name not in tools:
                    raise ValueError(f"{where}[{index}]: tool_name {check.tool_name!r} is not a declared tool")
        if not self.scoring_components and not self.judge_rubric:
            raise ValueError("the task says nothing of how it is scored: neither scoring_components nor "
                             "judge_rubric")
        return self

    @property
    def judge_components(self) -> list[ScoringComponent]:
        return [c for c in self.scoring_components if c.check.type == JUDGE_CHECK]

    @property
    def needs_judge(self) -> bool:
        """Its score has a part only an LLM judge can give (its judge_rubric, or llm_judge components)."""
        return bool(self.judge_rubric and self.judge_rubric.strip()) or bool(self.judge_components)

    def judge_weight(self) -> float:
        """The judge's share of the completion: its llm_judge components' share of the weights; with only a
        judge_rubric, half (task.yaml gives no weight: Orchard's choice); 1 when nothing else scores."""
        total = sum(c.weight for c in self.scoring_components)
        judged = sum(c.weight for c in self.judge_components)
        if judged:
            return judged / total
        return 0.5 if self.scoring_components else 1.0

    def judge_rubric_text(self) -> str:
        """What the judge is asked to score: the rubric and each llm_judge component's description."""
        parts = [self.judge_rubric.strip()] if self.judge_rubric and self.judge_rubric.strip() else []
        parts += [f"- {c.name} (weight {c.weight:g}): {c.check.description}".rstrip(": ")
                  for c in self.judge_components]
        return "\n".join(parts)

    def unserved_tools(self) -> list[str]:
        """Declared tools with no endpoint that no harness shell stands for."""
        mapped = {endpoint.tool_name for endpoint in self.tool_endpoints}
        return [t.name for t in self.tools if t.name not in mapped and t.name not in SANDBOX_TOOLS]

    def service_of(self, endpoint: ToolEndpoint) -> Service:
        port = urlsplit(endpoint.url).port
        return next(service for service in self.services if service.port == port)
