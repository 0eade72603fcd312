"""A metric's samples over time, one colour per consensus value in effect, so that a
stage's values can be compared with the baseline's by eye (``metrics show --plot``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from kistexp.errors import KistexpError
from kistexp.metrics import catalogue
from kistexp.metrics.series import Sample


def plot_samples(metric: str, samples: Sequence[Sample], path: Path, *, title: str = "") -> Path:
    """Write a PNG (or any format matplotlib knows by suffix) of ``samples`` over time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    info = catalogue.get(metric)
    if not samples:
        raise KistexpError(f"{path}: no samples of {metric} to plot")
    groups: dict[str, list[Sample]] = {}
    for s in samples:
        groups.setdefault("unknown" if s.param_value is None else str(s.param_value), []).append(s)
    # in the display unit every table and plot uses (CPU in % of one core), not the stored one
    unit, factor = catalogue.display(metric)
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for key in sorted(groups, key=lambda k: (k == "unknown", k)):
        ss = groups[key]
        ax.plot([s.time for s in ss], [s.value * factor for s in ss], ".", markersize=3, alpha=0.7,
                color="0.6" if key == "unknown" else None, label=f"value in effect: {key} ({len(ss)})")
    ax.set_ylabel(f"{metric} ({unit or '?'})")
    ax.set_xlabel("time (UTC)")
    ax.set_title(title or (info.meaning if info else metric))
    ax.legend(loc="best", fontsize=8)
    fig.autofmt_xdate()
    fig.tight_layout()
    try:
        import io

        from kistexp.safeio import check_output_path, write_atomic

        check_output_path(path, "the plot", KistexpError)
        buf = io.BytesIO()  # drawn in memory, then written only to a regular file or a new name
        fig.savefig(buf, format=Path(path).suffix[1:].lower() or None, dpi=110)
        write_atomic(path, buf.getvalue(), "the plot", KistexpError)
    except (OSError, ValueError) as exc:
        raise KistexpError(f"{path}: cannot write the plot: {exc}") from None
    finally:
        plt.close(fig)
    return path
