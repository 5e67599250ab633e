"""What every figure of minigate.plots shares: the colour of each variant, tick and legend conventions, and wrapped
labels."""

from __future__ import annotations

import math
import textwrap

from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter

from ..presets import NAMES

# a model's colour in every figure, by its variant's name (presets.NAMES: baseline, headwise, elementwise)
COLORS = dict(zip(NAMES.values(), ("tab:red", "tab:blue", "tab:green"), strict=True))


def _color(name: str, i: int):
    return COLORS.get(name, f"C{i}")


def _integer_ticks(ax, x: bool = True, y: bool = False):
    """Layers and heads are whole numbers: no ticks at 0.5."""
    if x:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if y:
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))


def _finish(fig, legend_ax=None):
    """The figure, laid out tight, with a small-type legend on `legend_ax` when given."""
    if legend_ax is not None:
        legend_ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def _plain(value: float, _pos=None) -> str:
    """A log axis's tick label as a plain number (150, 2,000), or 1e+06 once it gets long."""
    return f"{value:,.6g}" if 1e-3 <= value < 1e5 else f"{value:.0e}"


def log_ticks(ax, axis: str = "y"):
    """Readable ticks on a log axis (call after plotting): plain numbers, and within three decades the
    1-2-5 steps (100, 200, 500; finer within one decade) instead of bare powers of ten."""
    a = ax.yaxis if axis == "y" else ax.xaxis
    lo, hi = ax.get_ylim() if axis == "y" else ax.get_xlim()
    decades = math.log10(hi / lo) if lo > 0 else math.inf
    subs = ((1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 7, 8) if decades <= 0.5 else (1, 1.5, 2, 3, 4, 5, 7) if decades <= 1
            else (1, 2, 5) if decades <= 3 else (1,))
    a.set_major_locator(LogLocator(base=10, subs=subs, numticks=12))
    a.set_major_formatter(FuncFormatter(_plain))
    a.set_minor_formatter(NullFormatter())


def _wrap(text: str, width: int = 28) -> list[str]:
    """`text` in lines of at most `width` characters: as few lines as that takes, as even as they can be, broken
    after a comma where the comma-separated parts fit ("code-baseline, layer 0, head 2" -> 2 lines)."""
    def even(t):
        n = len(textwrap.wrap(t, width))
        return next((lines for w in range(1, width + 1) if len(lines := textwrap.wrap(t, w)) <= n), None) or [t]

    parts = text.split(", ")
    if len(parts) > 1 and len(text) > width and max(map(len, parts)) < width:  # keep each part whole
        return [line.replace("\0", " ") for line in even(", ".join(p.replace(" ", "\0") for p in parts))]
    return even(text)
