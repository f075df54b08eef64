"""``%%distributed --trace``: show the spans every rank recorded during the cell."""

from __future__ import annotations

from collections import defaultdict


def show(spans: list[dict]) -> None:
    """Display the timeline widget (commlab.widgets.show_timeline) or, until it exists,
    a short text summary per rank."""
    try:
        from commlab.widgets import show_timeline
    except ImportError:
        print(summary(spans))
        return
    from IPython.display import display

    display(show_timeline(spans))


def summary(spans: list[dict]) -> str:
    if not spans:
        return "trace: no spans recorded (commlab's collectives record 'comm' spans)"
    per = defaultdict(lambda: defaultdict(lambda: [0, 0.0]))
    for s in spans:
        acc = per[s["rank"]][(s["kind"], s["name"])]
        acc[0] += 1
        acc[1] += s["end_us"] - s["start_us"]
    lines = [f"trace: {len(spans)} spans (install the timeline widget for the picture)"]
    for r in sorted(per):
        items = ", ".join(f"{name} [{kind}] x{n} {us:.0f} us"
                          for (kind, name), (n, us) in sorted(per[r].items()))
        lines.append(f"  rank {r}: {items}")
    return "\n".join(lines)
