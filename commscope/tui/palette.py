"""Colours and glyphs of the timeline: restrained, one hue per kind of traffic."""

from __future__ import annotations

from rich.style import Style

# Cell categories, lowest priority first (a cell shows the highest one that covers it).
IDLE, PENDING, COLL, FR, P2P, VARLEN, WAIT, WARN, ERROR, SELECTED = range(10)

GLYPH = {IDLE: " ", PENDING: "╌", COLL: "█", FR: "█", P2P: "█", VARLEN: "█", WAIT: "█", WARN: "█",
         ERROR: "█", SELECTED: "█"}

STYLE = {
    IDLE: Style(),
    PENDING: Style(color="grey50"),
    COLL: Style(color="#4f8fd6"),
    FR: Style(color="#7f6fc4"),
    P2P: Style(color="#3fa58f"),
    VARLEN: Style(color="#3aa7c9"),
    WAIT: Style(color="#8c8259"),
    WARN: Style(color="#e0a030"),
    ERROR: Style(color="#e05050"),
    SELECTED: Style(color="#ffffff"),
}

LABEL_STYLE = {
    COLL: Style(color="white", bgcolor="#4f8fd6"),
    FR: Style(color="white", bgcolor="#7f6fc4"),
    P2P: Style(color="white", bgcolor="#3fa58f"),
    VARLEN: Style(color="black", bgcolor="#3aa7c9"),
    WAIT: Style(color="white", bgcolor="#8c8259"),
    WARN: Style(color="black", bgcolor="#e0a030"),
    ERROR: Style(color="white", bgcolor="#e05050", bold=True),
    SELECTED: Style(color="black", bgcolor="#ffffff", bold=True),
}

LEGEND = [(COLL, "collective"), (P2P, "p2p"), (VARLEN, "varlen"), (FR, "C++ (Flight Recorder)"),
          (PENDING, "async issued"), (WAIT, "wait()"), (WARN, "slow"), (ERROR, "past hang_after")]

STATE_STYLE = {"blocked": Style(color="#e0a030"), "running": Style(color="#4f8fd6"),
               "idle": Style(color="grey62"), "exited": Style(color="grey42"), "dead": Style(color="#e05050"),
               "crashed": Style(color="#e05050"), "unknown": Style(color="grey42")}
#: A foreign stream's row (``TraceModel.foreign_streams``): read, but no rank of the job's
FOREIGN_STYLE = Style(color="grey42", italic=True)
STATE_DOT = {"blocked": "●", "running": "●", "idle": "○", "exited": "·", "dead": "✖", "crashed": "✖", "unknown": "?"}

SEVERITY_STYLE = {"error": Style(color="#e05050", bold=True), "warning": Style(color="#e0a030")}
SEVERITY_ICON = {"error": "✖", "warning": "▲"}

SPARK = " ▁▂▃▄▅▆▇█"
SHADES = " ░▒▓█"

#: The heatmap's cell colours by how many of a block's ranks are busy (level 0: none .. 4: all),
#: from the collective hue; a block with a rank slow or past hang_after takes WARN's or ERROR's.
HEAT = ["#1c1c1c", "#1d3a5c", "#2b5688", "#3d74b3", "#5f9be0"]
#: A heatmap cell's colour from the moment every rank of its block had exited, and from the
#: moment one of them died or crashed (over all else: the rank that went is what matters)
HEAT_EXITED = "#5c5c5c"
HEAT_DOWN = "#c25fc2"
#: The heatmap's colours past its busy shades, with their legend (in the painter's order of them)
HEAT_LEGEND = [(STYLE[WARN].color.name, "slow"), (STYLE[ERROR].color.name, "past hang_after"),
               (HEAT_EXITED, "exited"), (HEAT_DOWN, "dead/crashed")]
