"""The picture `decider eval` writes: one PNG with the reliability diagram and the
coverage/error curve, each before calibration and, when given, after it.

matplotlib is imported only here, when a picture is drawn, and draws with its Agg
backend straight onto a Figure (no pyplot: no global state, no display needed).
"""

from __future__ import annotations

import math
from pathlib import Path

from .metrics import ERROR_BUDGETS, coverage_at, ece_of, reliability, risk_coverage

COLORS = {"before": "tab:red", "after": "tab:blue"}
LINES = {"before": "-", "after": "--"}  # after may lie on before: calibration keeps the order


def write_report_png(path: Path | str, title: str, before: tuple, after: tuple | None = None,
                     bins: int = 15) -> Path:
    """Draw `before` = (p, y) and, when given, `after` = (p, y) (the same items'
    calibrated probabilities) into a PNG at path, titled with the dataset or question."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    series = {"before": before} if after is None else {"before": before, "after": after}
    figure = Figure(figsize=(12, 5.4), dpi=100, layout="constrained")
    FigureCanvasAgg(figure)
    diagram, curve = figure.subplots(1, 2)
    _reliability_diagram(diagram, series, bins)
    _coverage_curve(curve, series)
    figure.suptitle(title)
    path = Path(path)
    figure.savefig(path, format="png")
    return path


def _reliability_diagram(axes, series: dict, bins: int) -> None:
    # the top label's probability is at least 1/K: start there, not at 0
    classes = max(len(p[0]) for p, _ in series.values())
    low = math.floor(10 / classes) / 10
    axes.plot([low, 1], [low, 1], linestyle="--", color="grey", linewidth=1,
              label="perfectly calibrated")
    for offset, (name, (p, y)) in zip((7, -13), series.items()):
        table = reliability(p, y, bins)
        x = [row["confidence"] for row in table]
        accuracy = [row["accuracy"] for row in table]
        axes.plot(x, accuracy, marker="o", color=COLORS[name], linestyle=LINES[name],
                  label=f"{name} (ECE {ece_of(table):.3f})")
        # each point's item count, above the points before, below those after
        for row in table:
            axes.annotate(str(row["count"]), (row["confidence"], row["accuracy"]),
                          textcoords="offset points", xytext=(0, offset), ha="center",
                          fontsize=6, color=COLORS[name])
    axes.set(xlim=(low, 1), ylim=(0, 1.05), xlabel="mean confidence (top label's probability)",
             ylabel="accuracy", title="Reliability (equal-mass bins; numbers: items in a bin)")
    axes.legend(loc="upper left", fontsize=8)


def _coverage_curve(axes, series: dict) -> None:
    top = 1.5 * max(ERROR_BUDGETS)
    for name, (p, y) in series.items():
        _, coverage, error = risk_coverage(p, y)
        at = {row["error_budget"]: row["coverage"] for row in coverage_at(p, y)}
        shown = ", ".join(f"{at[b]:.0%} at {b:.0%}" for b in ERROR_BUDGETS)
        axes.plot(coverage, error, drawstyle="steps-post", color=COLORS[name],
                  linestyle=LINES[name], label=f"{name} (decided alone: {shown})")
        # the first few items' error rate swings from 0 to 1: scale to the rest
        top = max(top, 1.2 * error[-1])
    for budget in ERROR_BUDGETS:
        axes.axhline(budget, linestyle=":", color="grey", linewidth=1)
        axes.annotate(f"{budget:.0%}", (1.0, budget), textcoords="offset points",
                      xytext=(-4, 2), ha="right", fontsize=7, color="grey")
    axes.set(xlim=(0, 1), ylim=(0, min(1.0, top)), xlabel="coverage (share decided, most confident "
                                                  "first)",
             ylabel="error rate of those decided", title="Coverage and error")
    axes.legend(loc="upper left", fontsize=8)
