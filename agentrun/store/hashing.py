"""Content hashes and sizes of JSON states, updated from deltas.

A state's hash is a Merkle hash of its JSON tree: a scalar hashes its
canonical JSON, a list the concatenated digests of its items, an object its
sorted keys with their values' digests. Equal states have equal hashes however
they were built. The engine keeps the tree of digests (a `Node`) beside the
state it caches; `apply(node, ops)` replays a step's delta ops on that tree, so
hashing the next state costs what changed, not the state's size. The canonical
JSON size falls out of the same tree: no step serialises a 2.5 MB state.
"""

from __future__ import annotations

import json
from functools import lru_cache
from hashlib import sha256
from typing import Any

_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode


class Node:
    """Digest and canonical-JSON size of a value, with its children's nodes.

    For a list, `digests` mirrors `kids` so the list digest is one C-level join,
    and `total` is the sum of the children's sizes.
    """

    # A long list also keeps `running`, the sha256 state over its digests[:run_n], so an
    # append hashes only the new items (a step's cost must not grow with the run).
    # A running hasher is never updated in place: it is copied first, so nodes share it.
    # A list node's items are kids[:n] (and digests[:n]): a copy shares the two buffers
    # (`shared`), an append extends them in place when no other node has extended them
    # past its own n, and any other change first takes a copy of its n items. So the
    # node of a state whose logs grew costs what was appended, and the node it came
    # from still reads its own items.
    __slots__ = ("digest", "size", "kids", "digests", "total", "running", "run_n", "n", "shared")

    def __init__(
        self, digest: bytes, size: int, kids: Any = None, digests: Any = None, total: int = 0
    ):
        self.digest, self.size, self.kids, self.digests, self.total = (
            digest,
            size,
            kids,
            digests,
            total,
        )
        self.running: Any = None
        self.run_n = 0
        self.n = len(kids) if digests is not None else 0
        self.shared = False

    @property
    def hex(self) -> str:
        return self.digest.hex()

    def copy(self) -> Node:
        if self.digests is not None:  # a list: share the buffers
            node = Node(self.digest, self.size, self.kids, self.digests, self.total)
            node.n = self.n
            node.shared = self.shared = True
        else:
            kids = dict(self.kids) if self.kids is not None else None
            node = Node(self.digest, self.size, kids, None, self.total)
        node.running, node.run_n = self.running, self.run_n
        return node

    def own(self) -> None:
        """Make a list node's buffers its own before changing them other than by appending."""
        if self.shared:
            self.kids, self.digests = self.kids[: self.n], self.digests[: self.n]
            self.shared = False

    def append(self, new: list[Node]) -> None:
        """Append child nodes to a list node (in place in shared buffers when no other
        node has extended them past this node's items)."""
        if len(self.kids) != self.n:
            self.own()
        self.kids.extend(new)
        self.digests.extend(k.digest for k in new)
        self.n += len(new)


@lru_cache(maxsize=8192)
def _key(key: str) -> tuple[bytes, int]:
    """Digest and JSON size of an object key (states repeat the same few keys)."""
    kb = _dumps(key).encode("utf-8", "surrogatepass")
    return sha256(kb).digest(), len(kb)


def _seal_dict(node: Node) -> Node:
    h = sha256(b"d")
    kids = node.kids
    size = 2 + max(len(kids) - 1, 0)
    for key in sorted(kids):
        kd, kl = _key(key)
        kid = kids[key]
        h.update(kd)
        h.update(kid.digest)
        size += kl + 1 + kid.size
    node.digest, node.size = h.digest(), size
    return node


#: Lists at least this long keep a running hasher (shorter ones rehash in no time).
RUNNING_MIN = 64


def _seal_list(node: Node) -> Node:
    digests, n = node.digests, node.n
    if node.running is not None and node.run_n <= n:
        h = node.running.copy()
        h.update(b"".join(digests[node.run_n : n]))
    else:
        h = sha256(b"l")
        h.update(b"".join(digests if len(digests) == n else digests[:n]))
    node.digest = h.digest()
    if n >= RUNNING_MIN:
        node.running, node.run_n = h, n
    else:
        node.running, node.run_n = None, 0
    node.size = 2 + max(n - 1, 0) + node.total
    return node


def _touch(node: Node, index: int) -> None:
    """Item `index` of a list node changes: its running hasher no longer covers a prefix
    that stays the same, unless the change is after it."""
    if index < node.run_n:
        node.running, node.run_n = None, 0


def build(value: Any) -> Node:
    """The node of a whole value (visits all of it)."""
    if isinstance(value, dict):
        return _seal_dict(Node(b"", 0, {k: build(v) for k, v in value.items()}))
    if isinstance(value, list):
        kids = [build(v) for v in value]
        return _seal_list(Node(b"", 0, kids, [k.digest for k in kids], sum(k.size for k in kids)))
    blob = _dumps(value).encode("utf-8", "surrogatepass")
    return Node(sha256(b"s" + blob).digest(), len(blob))


def digest(value: Any) -> str:
    """The content hash of a JSON value (hex)."""
    return build(value).hex


def apply(node: Node, ops: list) -> Node:
    """The node of `patch(value, ops)` given the node of `value`; `node` is not changed."""
    root = [node]
    owned: set[int] = set()
    dirty: list[tuple[int, Node]] = []  # (depth, node): resealed deepest first
    through: set[int] = set()  # lists with an edited child
    for op in ops:
        name, path = op[0], op[1]
        if name == "splice":
            target = _own_path(root, owned, dirty, through, path)
            start, count, items = op[2], op[3], op[4]
            _touch(target, start)
            new = [build(v) for v in items]
            if start == target.n and not count:  # an append: what a log does
                target.total += sum(k.size for k in new)
                target.append(new)
                continue
            target.own()
            target.total += sum(k.size for k in new) - sum(
                k.size for k in target.kids[start : start + count]
            )
            target.kids[start : start + count] = new
            target.digests[start : start + count] = [k.digest for k in new]
            target.n = len(target.kids)
            continue
        if not path:
            root[0] = build(op[2]) if name == "set" else root[0]
            owned.clear()
            dirty.clear()
            through.clear()
            continue
        parent = _own_path(root, owned, dirty, through, path[:-1])
        key = path[-1]
        if isinstance(parent.kids, dict):
            if name == "set":
                parent.kids[key] = build(op[2])
            else:
                del parent.kids[key]
        else:
            _touch(parent, key)
            parent.own()
            new = build(op[2])
            parent.total += new.size - parent.kids[key].size
            parent.kids[key] = new
            parent.digests[key] = new.digest
    for _, n in sorted(dirty, key=lambda d: -d[0]):
        if isinstance(n.kids, dict):
            _seal_dict(n)
        else:
            if id(n) in through:
                # A child was edited in place; later splices may have moved it.
                n.own()
                n.digests = [k.digest for k in n.kids]
                n.total = sum(k.size for k in n.kids)
            _seal_list(n)
    return root[0]


def _own_path(root: list, owned: set[int], dirty: list, through: set[int], path: list) -> Node:
    """The node at `path`, with it and its ancestors copied (once) and marked for resealing."""
    if id(root[0]) not in owned:
        root[0] = root[0].copy()
        owned.add(id(root[0]))
        dirty.append((0, root[0]))
    node = root[0]
    for depth, key in enumerate(path, start=1):
        kid = node.kids[key]
        if id(kid) not in owned:
            kid = kid.copy()
            owned.add(id(kid))
            dirty.append((depth, kid))
            if node.digests is not None:
                node.own()
            node.kids[key] = kid
            if node.digests is not None:
                through.add(id(node))
                _touch(node, key)
        node = kid
    return node
