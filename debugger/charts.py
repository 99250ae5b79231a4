"""Small inline SVG charts drawn on the server: no JS library, numbers only.

Only numbers computed here go into the markup, so nothing needs escaping;
labels are rendered by the template around the SVG.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from django.utils.safestring import SafeString, mark_safe

WIDTH = 1000.0


@dataclass
class StepPoint:
    number: int
    duration_ms: float | None
    state_size: int | None
    failed: bool = False
    # Wall time of the step besides its work (duration_ms): retry backoff (tool retries,
    # rate limits, crashes) and the rest (approval, an operator, the queue).
    backoff_ms: float = 0.0
    wait_ms: float = 0.0

    @property
    def total_ms(self) -> float:
        return (self.duration_ms or 0.0) + self.backoff_ms + self.wait_ms


@dataclass
class Chart:
    svg: SafeString
    max_value: float
    label: str


COLUMNS = 300  # bars at most: a longer run draws the slowest step of each group of steps
SEGMENTS = (("work", "duration_ms"), ("backoff", "backoff_ms"), ("wait", "wait_ms"))


def columns(points: Sequence[StepPoint]) -> list[StepPoint]:
    """At most COLUMNS points: each group of consecutive steps by its slowest step
    (marked failed when any step of the group failed)."""
    size = max(1, -(-len(points) // COLUMNS))
    if size == 1:
        return list(points)
    out = []
    for i in range(0, len(points), size):
        group = points[i : i + size]
        slowest = max(group, key=lambda p: p.total_ms)
        failed = any(p.failed for p in group)
        out.append(
            StepPoint(
                slowest.number,
                slowest.duration_ms,
                group[-1].state_size,
                failed,
                slowest.backoff_ms,
                slowest.wait_ms,
            )
        )
    return out


def duration_bars(points: Sequence[StepPoint], height: float = 48.0) -> Chart:
    """One stacked bar per step (or per group of steps, see columns): the work, then the
    backoff and the waits on top, so a step that waited 7 s shows 7 s, not its 3 ms of
    work. Failed steps' work in its own colour."""
    points = columns(points)
    top = max((p.total_ms for p in points), default=0.0) or 1.0
    width = WIDTH / max(len(points), 1)
    gap = width * 0.15 if width > 3 else 0.0
    paths: dict[str, list[str]] = {"ok": [], "failed": [], "backoff": [], "wait": []}
    for i, p in enumerate(points):
        if not p.total_ms:
            continue
        x, y = i * width, height
        for name, attr in SEGMENTS:
            value = getattr(p, attr) or 0.0
            if not value:
                continue
            h = max(value / top * height, 0.8)
            if name == "work":
                name = "failed" if p.failed else "ok"
            paths[name].append(f"M{x:.2f} {y:.2f}h{width - gap:.2f}v{-h:.2f}h{gap - width:.2f}z")
            y -= h
    body = "".join(f'<path class="bar-{name}" d="{"".join(d)}"/>' for name, d in paths.items() if d)
    return Chart(_svg(body, height, "Step durations"), top, "duration")


def size_line(points: Sequence[StepPoint], height: float = 36.0) -> Chart:
    """State size after each step, as a line with a light fill."""
    points = columns(points)
    sizes = [(i, p.state_size) for i, p in enumerate(points) if p.state_size is not None]
    top = float(max((s for _, s in sizes), default=0)) or 1.0
    width = WIDTH / max(len(points), 1)
    coords = [(i * width + width / 2, height - s / top * (height - 2)) for i, s in sizes]
    if not coords:
        return Chart(_svg("", height, "State size"), top, "size")
    if len(coords) == 1:  # one point: draw it across its slot so it shows
        x, y = coords[0]
        coords = [(x - width / 2, y), (x + width / 2, y)]
    line = "M" + "L".join(f"{x:.2f} {y:.2f}" for x, y in coords)
    area = f"{line}L{coords[-1][0]:.2f} {height:.2f}L{coords[0][0]:.2f} {height:.2f}z"
    body = (
        f'<path class="area" d="{area}"/>'
        f'<path class="line" d="{line}" vector-effect="non-scaling-stroke"/>'
    )
    return Chart(_svg(body, height, "State size"), top, "size")


def _svg(body: str, height: float, title: str) -> SafeString:
    return mark_safe(  # noqa: S308 - numbers and constants only
        f'<svg class="chart" viewBox="0 0 {WIDTH:.0f} {height:.0f}" preserveAspectRatio="none" '
        f'role="img" aria-label="{title}"><title>{title}</title>{body}</svg>'
    )
