"""Numbers and names as the pages show them (also the templates' filters of the same names)."""

from __future__ import annotations

from typing import Any


def ms(value: float | None) -> str:
    """Milliseconds, readable: 0.4 ms, 87 ms, 1.24 s, 3 m 05 s."""
    if value is None:
        return "–"
    if value < 1:
        return f"{value:.2f} ms"
    if value < 1000:
        return f"{value:.0f} ms"
    seconds = value / 1000
    if seconds < 60:
        return f"{seconds:.2f} s"
    minutes, seconds = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes} m {seconds:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} m"


def human(value: Any) -> str:
    """awaiting_approval → awaiting approval"""
    return str(value or "").replace("_", " ")


def usd(value: Any) -> str:
    """US dollars, readable: $0.0042, $1.37, $1,204 (– for none)."""
    if value is None:
        return "–"
    value = float(value)
    if value == 0:
        return "$0"
    if value < 0.01:
        return f"${value:.4f}"
    if value < 1000:
        return f"${value:.2f}"
    return f"${value:,.0f}"
