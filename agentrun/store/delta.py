"""Structural deltas between agent-state snapshots.

Values are JSON-like: dict (str keys), list, str, int, float, bool, None.
``diff(old, new)`` returns a list of JSON-serialisable ops and
``patch(old, ops)`` rebuilds ``new`` from them without touching ``old``:

    ["set", path, value]                       set a dict key / replace the value at path
    ["del", path]                              delete a dict key
    ["splice", path, start, delete_count, items]
                                               lst[start:start + delete_count] = items

A path is a list of dict keys (str) and list indexes (int); ``[]`` is the
whole value. Ops are applied in order, so list indexes in later ops refer
to the list as already changed by earlier ones.

Values are compared by JSON type as well as by value: ``True``, ``1`` and
``1.0`` (and ``0.0`` / ``-0.0``) are all different here although Python
calls them equal, so ``canonical(patch(old, diff(old, new)))`` is always
``canonical(new)``.

Ops hold references to subtrees of ``new`` and ``patch`` results share
every untouched subtree with their input: treat snapshots as immutable
(or serialise the ops) rather than mutating them afterwards.
"""

from __future__ import annotations

import json
from itertools import compress, count, islice, repeat
from math import copysign
from operator import eq, is_, is_not
from typing import Any

from agentrun.store import prefixes

__all__ = ["DeltaError", "canonical", "diff", "json_size", "patch", "state_hash"]


class DeltaError(ValueError):
    """An op that does not fit the value it is applied to, or is malformed."""


# --- JSON kinds ---------------------------------------------------------------

_NULL, _BOOL, _INT, _FLOAT, _STR, _LIST, _DICT = range(7)
_KINDS: dict[type, int] = {
    type(None): _NULL,
    bool: _BOOL,
    int: _INT,
    float: _FLOAT,
    str: _STR,
    list: _LIST,
    tuple: _LIST,
    dict: _DICT,
}


def _kind(x: Any) -> Any:
    """JSON kind of x; unknown types are their own kind (equal only to themselves)."""
    k = _KINDS.get(type(x))
    if k is not None:
        return k
    for base, kind in ((bool, _BOOL), (int, _INT), (float, _FLOAT), (str, _STR), (dict, _DICT)):
        if isinstance(x, base):
            return kind
    if isinstance(x, list | tuple):
        return _LIST
    return type(x)


_PLAIN = frozenset({str, int, bool, type(None)})  # == between two of one type is exact


def _eq(a: Any, b: Any) -> bool:
    """Deep equality that also requires equal JSON kinds all the way down."""
    if a is b:
        return True
    ta = type(a)
    if ta is type(b) and ta in _PLAIN:
        return bool(a == b)
    ka = _kind(a)
    if ka != _kind(b):
        return False
    if ka == _DICT:
        if len(a) != len(b) or (ta is type(b) and a != b):  # fast rejection only:
            return False  # == is too loose to accept (True == 1 == 1.0)
        for key, x in a.items():
            y = b[key]
            if x is y:
                continue
            tx = type(x)
            if tx is type(y) and tx in _PLAIN:
                if x != y:
                    return False
            elif not _eq(x, y):
                return False
        return True
    if ka == _LIST:
        if len(a) != len(b) or (ta is type(b) and a != b):
            return False
        return all(x is y or _eq(x, y) for x, y in zip(a, b, strict=True))
    if ka == _FLOAT:
        return a == b and (a != 0.0 or copysign(1.0, a) == copysign(1.0, b))
    return bool(a == b)


# --- diff ---------------------------------------------------------------------

# After the first mismatch in a list (where the whole middle is searched), a
# realignment only looks this far ahead, so it costs O(_SCAN) C-level steps.
_SCAN = 32
_HITS = 4  # candidate offsets examined per realignment
_CAP = 16  # a candidate's run is measured up to this many items
_MIN_RUN = 3  # shorter runs are accepted only when they reach the end
_MAX_BACKOFF = 64  # most pairs compared without retrying a failed realignment


def diff(old: Any, new: Any) -> list:
    """Return ops turning ``old`` into ``new`` (``[]`` when they are the same)."""
    ops: list = []
    _diff(old, new, [], ops)
    return ops


def _diff(a: Any, b: Any, path: list, ops: list) -> None:
    if a is b:
        return
    ka = _kind(a)
    if ka != _kind(b):
        ops.append(["set", path, b])
    elif ka == _DICT:
        _diff_dict(a, b, path, ops)
    elif ka == _LIST:
        _diff_list(a, b, path, ops)
    elif not _eq(a, b):
        ops.append(["set", path, b])


def _diff_dict(a: dict, b: dict, path: list, ops: list) -> None:
    start = len(ops)
    common = 0
    for key, x in a.items():
        if key in b:
            common += 1
            y = b[key]
            if x is not y:
                _diff(x, y, [*path, key], ops)
        else:
            ops.append(["del", [*path, key]])
    if not common and (a or b):
        # Nothing in common: one replacement beats a del/set per key.
        del ops[start:]
        ops.append(["set", path, b])
        return
    if len(b) > common:
        for key, y in b.items():
            if key not in a:
                ops.append(["set", [*path, key], y])


def _run(a: list, i: int, b: list, j: int, n: int) -> int:
    """Length of the common run of a[i:] and b[j:], looking at most n items."""
    k = 0
    short = min(n, 8)
    while k < short:
        x, y = a[i + k], b[j + k]
        if x is not y and not _eq(x, y):
            return k
        k += 1
    if k == n:
        return n
    if i == j == 0 and n == min(len(a), len(b)):  # a whole-list prefix: plain iterators
        k = 0

        def pairs() -> Any:
            return iter(a), iter(b)
    else:

        def pairs() -> Any:
            return islice(a, i + k, i + n), islice(b, j + k, j + n)

    for d in _non_identical(pairs):
        if not _eq(a[i + k + d], b[j + k + d]):
            return k + d
    return n


def _rrun(a: list, b: list, n: int) -> int:
    """Length of the common suffix of a and b, looking at most n items."""
    la, lb = len(a), len(b)
    k = 0
    short = min(n, 8)
    while k < short:
        x, y = a[la - 1 - k], b[lb - 1 - k]
        if x is not y and not _eq(x, y):
            return k
        k += 1
    if k == n:
        return n
    if n == min(la, lb):
        k = 0

        def pairs() -> Any:
            return reversed(a), reversed(b)
    else:

        def pairs() -> Any:
            return islice(reversed(a), k, n), islice(reversed(b), k, n)

    for d in _non_identical(pairs):
        if not _eq(a[la - 1 - k - d], b[lb - 1 - k - d]):
            return k + d
    return n


def _non_identical(pairs: Any) -> Any:
    """Offsets where the two iterators from pairs() hold different objects.

    Agent states share almost every item between steps, so the common case
    is a single all() sweep at C speed; only when it finds a difference are
    the iterators remade to locate the non-identical pairs.
    """
    if all(map(is_, *pairs())):
        return ()
    return compress(count(), map(is_not, *pairs()))


def _find(seq: list, lo: int, hi: int, target: Any) -> list[int]:
    """A few indexes in seq[lo:hi] holding target: by identity, else by equality."""
    window = seq[lo:hi]
    hits = list(islice(compress(count(lo), map(is_, window, repeat(target))), _HITS))
    if hits:
        return hits
    loose = islice(compress(count(lo), map(eq, window, repeat(target))), _HITS)
    return [q for q in loose if _eq(seq[q], target)]


def _realign(
    a: list, i: int, ea: int, b: list, j: int, eb: int, scan: int
) -> tuple[int, int] | None:
    """Best (dropped, inserted) count to realign a[i:ea] with b[j:eb], or None."""
    best: tuple[int, int, int, int] | None = None  # (run, -k, dropped, inserted)
    for q in _find(a, i + 1, min(ea, i + 1 + scan), b[j]):
        k = q - i
        run = _run(a, q, b, j, min(ea - q, eb - j, _CAP))
        if (run >= _MIN_RUN or q + run == ea or j + run == eb) and (
            best is None or (run, -k) > best[:2]
        ):
            best = (run, -k, k, 0)
    for q in _find(b, j + 1, min(eb, j + 1 + scan), a[i]):
        k = q - j
        run = _run(a, i, b, q, min(ea - i, eb - q, _CAP))
        if (run >= _MIN_RUN or i + run == ea or q + run == eb) and (
            best is None or (run, -k) > best[:2]
        ):
            best = (run, -k, 0, k)
    return None if best is None else (best[2], best[3])


def _diff_list(a: list, b: list, path: list, ops: list) -> None:
    la, lb = len(a), len(b)
    n = min(la, lb)
    # A typed state's log that only grew is known to: no walk over the shared items.
    p = la if prefixes.starts_with(b, a) else _run(a, 0, b, 0, n)
    s = _rrun(a, b, n - p)
    ea, eb = la - s, lb - s
    i = j = p
    rep = -1  # start (in b) of a pending run of one-for-one replacements
    scan = max(ea - i, eb - j)  # the first realignment searches the whole middle
    # Realignment is retried with exponential backoff while it keeps failing, so
    # a list whose items all changed costs about one pairwise pass.
    wait = backoff = 0

    def flush() -> None:
        nonlocal rep
        if rep >= 0:
            if j - rep == 1:
                ops.append(["set", [*path, rep], b[rep]])
            else:
                ops.append(["splice", [*path], rep, j - rep, b[rep:j]])
            rep = -1

    while i < ea and j < eb:
        x, y = a[i], b[j]
        if x is y or _eq(x, y):
            c = 1 + _run(a, i + 1, b, j + 1, min(ea - i, eb - j) - 1)
            flush()
            i += c
            j += c
            wait = backoff = 0
            continue
        if wait:
            step = None
            wait -= 1
        else:
            step = _realign(a, i, ea, b, j, eb, scan)
            scan = _SCAN
            if step is None:
                wait = backoff
                backoff = min(2 * backoff or 1, _MAX_BACKOFF)
        if step is not None:
            flush()
            backoff = 0
            dropped, inserted = step
            ops.append(["splice", [*path], j, dropped, b[j : j + inserted]])
            i += dropped
            j += inserted
            continue
        kx = _kind(x)
        if kx in (_LIST, _DICT) and kx == _kind(y):
            flush()
            _diff(x, y, [*path, j], ops)
        elif rep < 0:
            rep = j
        i += 1
        j += 1
    # Tail: a[i:ea] becomes b[j:eb], merged with any pending replacements.
    start = j if rep < 0 else rep
    dropped = ea - i + (j - start)
    items = b[start:eb]
    if dropped == 1 and len(items) == 1:
        ops.append(["set", [*path, start], items[0]])
    elif dropped or items:
        ops.append(["splice", [*path], start, dropped, items])


# --- patch --------------------------------------------------------------------


def patch(value: Any, ops: list) -> Any:
    """Apply ops to value and return the result; value itself is never modified.

    Copy-on-write: only the containers along each touched path are copied,
    everything else is shared with ``value`` (and with the ops' values).
    Raises DeltaError when an op is malformed or does not fit.
    """
    root = [value]
    owned: dict[int, Any] = {id(root): root}  # containers this call created
    for op in ops:
        _apply(root, owned, op)
    return root[0]


def _is_index(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


_ARITY = {"set": 3, "del": 2, "splice": 5}
_SEQUENCE = (list, tuple)

# The checks below test the exact types first: patches run for every delta of a history.


def _apply(root: list, owned: dict[int, Any], op: Any) -> None:
    if not (type(op) is list or isinstance(op, _SEQUENCE)) or not op:
        raise DeltaError(f"not an op: {op!r}")
    name = op[0]
    arity = _ARITY.get(name) if isinstance(name, str) else None
    if arity is None or len(op) != arity:
        raise DeltaError(f"malformed op: {op!r}")
    path = op[1]
    if not (type(path) is list or isinstance(path, _SEQUENCE)):
        raise DeltaError(f"bad path in op: {op!r}")
    for step in path:  # a loop, not all(...)
        t = type(step)
        if not (t is str or t is int or isinstance(step, str) or _is_index(step)):
            raise DeltaError(f"bad path in op: {op!r}")

    if name == "splice":
        target = _walk(root, owned, path, op)
        if type(target) is not list:
            raise DeltaError(f"splice on a non-list: {op!r}")
        start, dropped, items = op[2], op[3], op[4]
        if not (
            _is_index(start)
            and _is_index(dropped)
            and 0 <= start <= len(target)
            and 0 <= dropped <= len(target) - start
            and (type(items) is list or isinstance(items, _SEQUENCE))
        ):
            raise DeltaError(f"splice does not fit a list of {len(target)}: {op!r}")
        target[start : start + dropped] = items
        return

    if not path:
        if name == "del":
            raise DeltaError(f"cannot delete the whole value: {op!r}")
        root[0] = op[2]
        return
    parent = _walk(root, owned, path[:-1], op)
    key = path[-1]
    if type(parent) is dict:
        if not isinstance(key, str):
            raise DeltaError(f"dict key must be a str: {op!r}")
        if name == "set":
            parent[key] = op[2]
        elif key in parent:
            del parent[key]
        else:
            raise DeltaError(f"no such key to delete: {op!r}")
    elif name == "set" and _is_index(key) and 0 <= key < len(parent):
        parent[key] = op[2]
    else:
        raise DeltaError(f"op does not fit a list of {len(parent)}: {op!r}")


def _walk(root: list, owned: dict[int, Any], path: Any, op: Any) -> Any:
    """The container at path, copied (and re-linked) unless this patch owns it.
    Each container on the way is one this patch owns: a dict or a list."""
    node = root[0]
    if id(node) not in owned:
        node = _own_child(root, 0, owned, op)
    for step in path:
        if type(node) is dict:
            if not isinstance(step, str) or step not in node:
                raise DeltaError(f"no key {step!r} on the path of {op!r}")
        elif not (_is_index(step) and 0 <= step < len(node)):
            raise DeltaError(f"index {step!r} out of range on the path of {op!r}")
        child = node[step]
        node = child if id(child) in owned else _own_child(node, step, owned, op)
    return node


def _own_child(parent: Any, key: Any, owned: dict[int, Any], op: Any) -> Any:
    child = parent[key]
    if id(child) in owned:
        return child
    t = type(child)
    kind = _DICT if t is dict else _LIST if t is list else _kind(child)
    if kind == _DICT:
        copy: Any = dict(child)
    elif kind == _LIST:
        copy = list(child)
    else:
        raise DeltaError(f"path goes through a {type(child).__name__}: {op!r}")
    owned[id(copy)] = copy  # kept alive here, so ids stay unique
    parent[key] = copy
    return copy


# --- hashing and sizes -----------------------------------------------------------


def canonical(value: Any) -> bytes:
    """Canonical JSON bytes: sorted keys, no whitespace, UTF-8."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode(
        "utf-8", "surrogatepass"
    )


def state_hash(value: Any) -> str:
    """The content hash of a JSON value: its Merkle hash (see agentrun.store.hashing)."""
    from agentrun.store.hashing import digest

    return digest(value)


def json_size(value: Any) -> int:
    """Size in UTF-8 bytes of the compact JSON encoding (same as len(canonical(value)))."""
    return len(
        json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode(
            "utf-8", "surrogatepass"
        )
    )
