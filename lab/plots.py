"""Figures shared by the command line and the notebooks (labelled axes, units)."""
from __future__ import annotations

from pathlib import Path

import matplotlib

if not matplotlib.get_backend().lower().startswith(("module://", "nbagg")):
    matplotlib.use("Agg")  # the command line has no display; notebooks keep their inline backend
import matplotlib.pyplot as plt  # noqa: E402


def plot_bench(result: dict, path: str | Path | None = None):
    """Two panels: tokens per second (with speed-up labels) and tau per method."""
    names = list(result["methods"])
    speed = [result["methods"][m]["tokens_per_s"] for m in names]
    tau = [result["methods"][m]["tau"] for m in names]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.6))
    bars = a.bar(names, speed, color="tab:blue")
    for bar, m in zip(bars, names):
        s = result["methods"][m].get("speedup")
        if s:
            a.annotate(f"{s:.2f}x", (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom")
    a.set_ylabel("new tokens per second (tok/s)")
    a.set_title("decoding speed")
    b.bar(names, tau, color="tab:green")
    b.set_ylabel("tau (tokens per target forward)")
    b.set_title("mean accepted length")
    cfg, mach = result["config"], result["machine"]
    fig.suptitle(f"{cfg.get('dataset')} x{cfg.get('limit')}, {cfg.get('max_new_tokens')} new tokens, "
                 f"T={cfg.get('temperature')} | {mach['cpu']} ({mach['cores']} cores)", fontsize=9)
    fig.tight_layout()
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=120)
    return fig
