"""Figures shared by the command line and the notebooks (labelled axes, units)."""
from __future__ import annotations

from pathlib import Path

import matplotlib

if not matplotlib.get_backend().lower().startswith(("module://", "nbagg")):
    matplotlib.use("Agg")  # the command line has no display; notebooks keep their inline backend
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import seaborn as sns  # noqa: E402

from ..judge.sweep import DEFAULT_JUDGE, judge_runs


def use_style() -> None:
    """The notebooks' figure style: seaborn's light grid and a colour-blind-safe palette."""
    sns.set_theme(style="whitegrid", context="notebook", palette="colorblind")


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


def plot_n_alpha(panels: dict[str, dict[str, dict]], path: str | Path | None = None, title: str = ""):
    """n-alpha by draft depth with Wilson 95% intervals and each point's count of chains, one panel per
    entry of `panels` (title -> {label: a `lab.train.evaluate` report}); unmeasured depths left out."""
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4.2), sharey=True, squeeze=False)
    for ax, (panel_title, reports) in zip(axes[0], panels.items()):
        for i, (label, report) in enumerate(reports.items()):
            series = report["n_alpha_by_depth"]
            shown = [d for d, (rate, ok) in enumerate(zip(series["rate"], series["measured"]))
                     if ok and rate is not None]
            depth = np.array(shown) + 1 + (i - (len(reports) - 1) / 2) * 0.08  # side by side, not on top
            rate = np.array([series["rate"][d] for d in shown])
            low, high = (np.array([series["ci95"][d][k] for d in shown]) for k in (0, 1))
            ax.errorbar(depth, rate, yerr=[rate - low, high - rate], fmt="o-", color=f"C{i}", capsize=3, label=label)
            for x, y, d in zip(depth, rate, shown):
                ax.annotate(f"{series['chains'][d]:,}", (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8,
                            color=f"C{i}")
        ax.set(xlabel="draft depth n", title=panel_title)
        ax.set_xticks(range(1, 1 + max(len(r["n_alpha_by_depth"]["rate"]) for r in reports.values())))
        ax.legend(fontsize=9)
    axes[0][0].set_ylabel("n-α: accepted at depth n, given depths < n accepted")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=120)
    return fig


QUALITY_AXES = {"tokens_per_forward": "new tokens per target forward",
                "forwards_per_answer": "target forwards per answer (prefill excluded)"}


def plot_quality(runs: dict, heads: list[str], x: str = "tokens_per_forward", title: str = "",
                 path: str | Path | None = None, band: float = 5.0):
    """Notebook 07's quality against speed: the share of answers checked correct against `x` (a key of
    QUALITY_AXES) for Top-K, each of `heads`' threshold sweeps (the shipped head's points marked with
    their delta), the EAGLE-1 chain with the judge, and the lossless runs (the target alone, standard SD,
    the EAGLE-1 chain) as large markers; shaded: within `band` points of the target's accuracy.
    `draft only` makes no target forwards and is left out. `runs`: `lab.judge.sweep.recorded_qualities`."""

    def points(names: list[str]) -> tuple[list[float], list[float]]:
        return [getattr(runs[n], x) for n in names], [runs[n].mean_accuracy for n in names]
    fig, ax = plt.subplots(figsize=(9.5, 4.4))
    target = runs["target only"].mean_accuracy
    if band:
        ax.axhspan(target - band / 100, target, color="grey", alpha=0.15, lw=0,
                   label=f"within {band:g} points of the target")
    topk = [n for n in runs if n.startswith("top-")]
    ax.plot(*points(topk), "s--", label="Top-K, 2-layer draft (K = " + ", ".join(n[4:] for n in topk) + ")")
    for head, marker in zip(heads, ("o-", "v-.", "P-.", "X-", "d-")):
        names = judge_runs(runs, head)
        ax.plot(*points(names), marker, label="judge, 2-layer draft, swept over delta"
                + ("" if head == DEFAULT_JUDGE else f" (head {head})"))
        if head == DEFAULT_JUDGE:
            for name, (px, py) in zip(names, zip(*points(names))):
                ax.annotate(name.split()[1], (px, py), textcoords="offset points", xytext=(4, -9), fontsize=7)
    eagle_judge = [n for n in runs if n.startswith("eagle judge") and "(" not in n]  # the shipped judge head
    if eagle_judge:
        ax.plot(*points(eagle_judge), "^", color="tab:purple", ms=7,
                label="EAGLE-1 chain + judge (delta " + ", ".join(n.split()[-1] for n in eagle_judge) + ")")
    lossless = [("target only", "*", "black", "the target alone"),
                ("standard SD", "D", "dimgrey", "standard SD, 2-layer draft"),
                ("eagle SD", "P", "tab:red", "EAGLE-1 chain, standard verification")]
    for name, marker, colour, label in lossless:
        if name in runs:
            ax.plot(*points([name]), marker, color=colour, ms=12, mec="white", label=f"{label} (lossless)")
    ax.set(xlabel=QUALITY_AXES[x], ylabel="share of answers checked correct", title=title)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1))  # outside: the points fill the axes
    fig.tight_layout()
    if path:
        fig.savefig(path, dpi=120)
    return fig
