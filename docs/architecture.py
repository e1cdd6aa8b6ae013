"""Generate docs/architecture.svg from this text description: ``python docs/architecture.py``.

The picture is plain SVG written by this script (no external tools), so it can be
regenerated on any machine and reviewed as text.
"""

from __future__ import annotations

from pathlib import Path

BOXES = {
    # name: (x, y, w, h, title, subtitle)
    "tools": (20, 20, 200, 70, "Tool services", "payments, bookings, email, ..."),
    "agents": (20, 180, 200, 80, "Agent fleets", "SDK: intent -> call -> outcome"),
    "topic": (330, 180, 210, 80, "Kafka topic", "stepledger.events (key = workflow)"),
    "dlq": (20, 350, 200, 60, "Dead-letter topic", "bad input, exhausted steps"),
    "projector": (650, 60, 190, 70, "Projector", "exactly-once: rows + offsets"),
    "recovery": (650, 290, 190, 70, "Recovery daemon", "query, redrive, compensate, escalate"),
    "duckdb": (930, 20, 200, 70, "DuckDB + snapshot", "steps, workflows, views"),
    "analysts": (930, 140, 200, 60, "Analysts", "stepledger query, notebooks"),
    "humans": (930, 290, 200, 70, "Human queue", "escalations, approvals"),
}
# (points of the polyline, label, label x, label y)
ARROWS = [
    ([(220, 220), (330, 220)], "intents, outcomes", 275, 212),
    ([(120, 180), (120, 90)], "call with idempotency key", 190, 140),
    ([(540, 200), (650, 95)], "consume", 585, 140),
    ([(540, 240), (650, 315)], "follow open intents", 615, 265),
    ([(650, 335), (480, 335), (480, 260)], "decisions", 560, 350),
    (
        [(745, 290), (745, 250), (600, 160), (600, 55), (220, 55)],
        "query / redrive / compensate",
        420,
        48,
    ),
    ([(840, 80), (930, 60)], "one txn", 885, 62),
    ([(1030, 90), (1030, 140)], "read-only snapshot", 1085, 120),
    ([(840, 325), (930, 325)], "escalations", 885, 318),
    (
        [(1030, 360), (1030, 440), (400, 440), (400, 260)],
        "verdicts, approvals, clearings",
        715,
        433,
    ),
    (
        [(700, 130), (700, 170), (560, 170), (560, 300), (300, 300), (300, 380), (220, 380)],
        "poison",
        430,
        293,
    ),
    ([(650, 345), (610, 345), (610, 395), (220, 395)], "max attempts", 420, 389),
]


def render() -> str:
    """The SVG document."""
    parts = [
        '<svg xmlns="http://www.w3.org/2000/svg" width="1150" height="460" '
        'font-family="Helvetica, Arial, sans-serif">',
        '<defs><marker id="a" markerWidth="10" markerHeight="7" refX="9" refY="3.5" '
        'orient="auto"><polygon points="0 0, 10 3.5, 0 7" fill="#555"/></marker></defs>',
        '<rect width="100%" height="100%" fill="white"/>',
    ]
    for points, label, lx, ly in ARROWS:
        path = " ".join(f"{x},{y}" for x, y in points)
        parts.append(
            f'<polyline points="{path}" fill="none" stroke="#555" stroke-width="1.4" '
            'marker-end="url(#a)"/>'
        )
        parts.append(
            f'<text x="{lx}" y="{ly}" font-size="11" fill="#333" '
            f'text-anchor="middle">{label}</text>'
        )
    for x, y, w, h, title, subtitle in BOXES.values():
        parts.append(
            f'<rect x="{x}" y="{y}" width="{w}" height="{h}" rx="8" fill="#eef3fb" '
            'stroke="#3a5f9f" stroke-width="1.5"/>'
        )
        parts.append(
            f'<text x="{x + w / 2}" y="{y + h / 2 - 4}" font-size="14" font-weight="bold" '
            f'text-anchor="middle">{title}</text>'
        )
        parts.append(
            f'<text x="{x + w / 2}" y="{y + h / 2 + 14}" font-size="10" fill="#444" '
            f'text-anchor="middle">{subtitle}</text>'
        )
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


if __name__ == "__main__":
    Path(__file__).with_name("architecture.svg").write_text(render())
