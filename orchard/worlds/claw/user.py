"""The user: the person the assistant works for, as a service, for multi-turn tasks. The agent talks to them
only through `message_user` (MCP tool and HTTP action); each message gets the user's reply. Its state:

    {"messages": [{"id", "role": "agent" | "user", "text", "at"}], "done": bool}

so a grader checks what the agent told the user (`in: messages`, `role: agent`) as it checks any state.

Who answers (docs/claw.md, "Multi-turn tasks"):
- **a model**, when the run gives one (`orchard eval run --user-model NAME`): the evaluator hands this
  service the model through the run's gateway as USER_MODEL_ENV (base URL, API key and name), under a rollout
  key of its own, so its calls are recorded apart from the agent's. The seed's `persona` is its system prompt;
- **the script** otherwise (tests, the oracle): each agent message takes the first unused reply whose `when`
  matches it (a claw query matcher on the text; no `when` matches anything). A script spent, the user says
  `stop` and is done.

The user ends the conversation by saying `stop` (tau2-bench's ###STOP###): `done` is true from then on, and
further messages are refused. A model call that fails is a 502 the agent sees; the evaluator finds the
failed call in the gateway's records and makes the rollout a model_error, not the agent's failure.
Standard library only (it runs inside the sandbox)."""

from __future__ import annotations

import json

from .base import ActionError, Fields, SeedError, Service, action, string
from .http_client import HttpError, request
from .query import QueryError, check_matcher, matches

STOP = "###STOP###"
USER_MODEL_ENV = ("ORCHARD_USER_MODEL_URL", "ORCHARD_USER_MODEL_KEY", "ORCHARD_USER_MODEL")
RULES = (
    "You are playing a user who talks to an AI assistant, one message at a time. Stay in your role: say only "
    "what this user would say, in their words; give what you know only when it is asked for or needed; never "
    "invent facts that are not in your instructions; do not act as the assistant. When what you wanted is done, "
    "or cannot be done, end the conversation: your whole reply is then {stop}.\n\nYour instructions:\n{persona}")


class User(Service):
    name = "user"
    description = "The user you work for: message_user sends them a message and returns their reply."

    def __init__(self, seed: dict, **kwargs) -> None:
        self.model: tuple | None = None  # (url, key, name), set by `serve` from the environment
        super().__init__(seed, **kwargs)

    def state_from_seed(self, seed: dict) -> dict:
        f = Fields(seed, "user seed", ("persona", "script", "stop", "messages"))
        self.persona = f.text("persona")
        self.stop = f.text("stop", STOP) or STOP
        self.script = []
        for index, raw in enumerate(f.items("script")):
            where = f"user seed.script[{index}]"
            line = Fields(raw, where, ("reply", "when"))
            when = line.data.get("when")
            if when is not None:
                try:
                    check_matcher(when, f"{where}.when")
                except QueryError as exc:
                    raise SeedError(str(exc)) from None
            self.script.append({"reply": line.required("reply"), "when": when})
        self.script_given = bool(self.script)
        if not self.persona and not self.script:
            raise SeedError("user seed needs a persona (for a user model), a script (for a scripted user), or both")
        messages = []
        for index, raw in enumerate(f.items("messages")):  # an earlier conversation the task starts from
            m = Fields(raw, f"user seed.messages[{index}]", ("role", "text"))
            role = m.required("role")
            if role not in ("agent", "user"):
                raise SeedError(f"user seed.messages[{index}].role must be agent or user, not {role!r}")
            messages.append({"id": f"u{index + 1}", "role": role, "text": m.text("text"), "at": "seed"})
        return {"messages": messages, "done": False}

    def use_model(self, environ) -> None:
        """Answer with the model the evaluator handed over in `environ`, when it did."""
        url, key, name = (environ.get(variable) for variable in USER_MODEL_ENV)
        self.model = (url, key, name) if url and name else None

    @action("Send the user a message (a question, a proposal, a report of what you did) and get their reply. "
            "`done` says the user has ended the conversation.",
            {"text": string("what you say to the user")}, ("text",))
    def message_user(self, text: str):
        if self.state["done"]:
            raise ActionError(409, "the user has ended the conversation; finish your work without them")
        self._say("agent", text)
        reply = self._model_reply() if self.model else self._scripted_reply(text)
        done = reply.strip() == self.stop or reply.rstrip().endswith(self.stop)
        shown = reply.replace(self.stop, "").strip() or "(the user has nothing more to say)"
        self._say("user", reply.strip())
        self.state["done"] = done
        return {"reply": shown, "done": done}

    def _say(self, role: str, text: str) -> None:
        self.state["messages"].append({"id": self.new_id("u"), "role": role, "text": text, "at": self.now()})

    def _scripted_reply(self, text: str) -> str:
        if not self.script_given:
            raise ActionError(503, "this task's user is played by a model and the run gave none: run it with "
                                   "--user-model NAME")
        for line in self.script:
            if line["when"] is None or matches(text, line["when"]):
                self.script.remove(line)
                return line["reply"]
        return self.stop

    def _model_reply(self) -> str:
        url, key, name = self.model
        system = RULES.format(stop=self.stop, persona=self.persona)
        # The user model sees the conversation from the user's side: the agent's messages are what it is told.
        turns = [{"role": "user" if m["role"] == "agent" else "assistant", "content": m["text"]}
                 for m in self.state["messages"]]
        body = {"model": name, "messages": [{"role": "system", "content": system}, *turns]}
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        try:
            status, answer = request(url.rstrip("/") + "/chat/completions", "POST", body, headers, timeout=300)
        except HttpError as exc:
            raise ActionError(502, f"the user simulator could not reach its model: {exc}") from None
        if status != 200:
            raise ActionError(502, f"the user simulator's model answered {status}: {json.dumps(answer)[:300]}")
        try:
            content = answer["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError):
            raise ActionError(502, f"the user simulator's model gave no message: {json.dumps(answer)[:300]}") from None
        return content if isinstance(content, str) and content.strip() else self.stop
