"""Which lists start with another list's very items: a hint for a long run's step.

A typed state's logs (history, tool calls, decisions, failures) only grow from one
step to the next. When `agentrun.state` writes a state dict whose list it knows to be
the previous dict's list plus new items (the same objects, nothing else changed), it
notes it here; validating the new state and diffing it against the previous one then
skip the walk over the shared items, so a step costs what it added, not the run's
length. A list that was noted and then changed in length is no longer vouched for;
the states handed between steps are not changed in place (the engine's and the typed
agents' identity shortcuts rest on that already). Without a note, callers compare
item by item as before.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

# Notes for the states in flight in this process. An entry holds both lists, so
# neither id can be reused while it is here.
MAX = 64

_notes: OrderedDict[int, tuple[list, list, int, int]] = OrderedDict()
_lock = threading.Lock()


def note(old: list, new: list) -> None:
    """`new` starts with `old`'s items, the same objects and in order."""
    with _lock:
        _notes[id(new)] = (new, old, len(old), len(new))
        _notes.move_to_end(id(new))
        while len(_notes) > MAX:
            _notes.popitem(last=False)


def starts_with(new: list, old: list) -> bool:
    """Whether `new` was noted as starting with `old`'s items (False: not known)."""
    with _lock:
        entry = _notes.get(id(new))
    return (
        entry is not None
        and entry[0] is new
        and entry[1] is old
        and entry[2] == len(old)
        and entry[3] == len(new)
    )
