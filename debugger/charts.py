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


@dataclass
class Chart:
    svg: SafeString
    max_value: float
    label: str


def duration_bars(points: Sequence[StepPoint], height: float = 48.0) -> Chart:
    """One bar per step, failed steps in their own colour."""
    top = max((p.duration_ms or 0.0 for p in points), default=0.0) or 1.0
    width = WIDTH / max(len(points), 1)
    gap = width * 0.15 if width > 3 else 0.0
    paths: dict[str, list[str]] = {"ok": [], "failed": []}
    for i, p in enumerate(points):
        if not p.duration_ms:
            continue
        h = max(p.duration_ms / top * height, 0.8)
        x = i * width
        paths["failed" if p.failed else "ok"].append(
            f"M{x:.2f} {height:.2f}h{width - gap:.2f}v{-h:.2f}h{gap - width:.2f}z"
        )
    body = "".join(f'<path class="bar-{name}" d="{"".join(d)}"/>' for name, d in paths.items() if d)
    return Chart(_svg(body, height, "Step durations"), top, "duration")


def size_line(points: Sequence[StepPoint], height: float = 36.0) -> Chart:
    """State size after each step, as a line with a light fill."""
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
