"""Look a word up, file a note about it once, answer. See "Your own agent" in the README."""

from pathlib import Path
from typing import Any

from django.conf import settings

from agentrun.agents import (
    Call,
    CallResult,
    Decision,
    InvalidInput,
    StateAgent,
    StepContext,
    register,
)
from agentrun.state import AgentState
from agentrun.tools import ToolContext, tool

GLOSSARY = {"lease": "how long a worker owns a step", "fork": "a run replayed from a snapshot"}


@tool(kind="read")
def define(ctx: ToolContext, word: str) -> dict[str, Any]:
    """The meaning of a word, or null."""
    return {"word": word, "meaning": GLOSSARY.get(word.lower())}


@tool(kind="write", idempotent=True)
def file_note(ctx: ToolContext, text: str) -> dict[str, Any]:
    """Write a note to var/notes/, one file per idempotency key: a retry writes no second one."""
    path = Path(settings.VAR_DIR) / "notes" / (ctx.idempotency_key.replace(":", "_") + ".txt")
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with open(path, "x") as f:  # "x": never overwrites the file of an earlier attempt
            f.write(text)
    except FileExistsError:
        return {"path": str(path), "duplicate": True}
    return {"path": str(path), "duplicate": False}


@register
class Glossary(StateAgent):
    name = "glossary"
    description = "Looks a word up, files a note about it, answers."
    tools = ("define", "file_note")

    def validate_input(self, input: Any) -> None:
        super().validate_input(input)  # a JSON object
        if not isinstance(input.get("word"), str) or not input["word"].strip():
            raise InvalidInput("word must be a non-empty string")

    def decide(self, state: dict[str, Any], ctx: StepContext) -> Decision:
        notes, word = self.load(state).memory["notes"], ctx.input["word"]  # state and input only
        if "meaning" not in notes:
            return Decision(thought=f"Look up {word!r}.", calls=[Call("define", {"word": word})])
        if "note" not in notes:
            text = f"{word}: {notes['meaning']}"
            return Decision(thought="File a note.", calls=[Call("file_note", {"text": text})])
        return Decision(thought="Done.", final=f"{word} means {notes['meaning']} (noted).")

    def observe(
        self, st: AgentState, decision: Decision, results: list[CallResult], ctx: StepContext
    ) -> None:
        for r in results:  # fold the results into memory.notes, whose values are strings
            if r.tool == "define":
                st.memory["notes"]["meaning"] = r.result["meaning"] or "unknown"
            else:  # a sandbox fork skips the write: its result may be null
                st.memory["notes"]["note"] = (r.result or {}).get("path", r.status)
