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
    """The notebooks' figure style: seaborn's light grid (values are easier to read off a slide
    than on a blank background) and a colour-blind-safe palette."""
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


def plot_by_depth(reports: dict[str, dict], path: str | Path | None = None, title: str = ""):
    """Held-out top-1 agreement and n-alpha by draft depth with their Wilson 95% intervals, one
    line per head. `reports` maps a label to a `lab.train.evaluate` report; labels containing
    "shipped" are drawn dashed; n-alpha where too few chains remain is left out."""
    fig, ax = plt.subplots(1, 2, figsize=(11, 4), sharex=True)
    for i, (label, r) in enumerate(reports.items()):
        style = "o--" if "shipped" in label else "o-"
        for panel, series in zip(ax, (r["top1_by_depth"], r["n_alpha_by_depth"])):
            d = np.arange(1, len(series["rate"]) + 1)
            rate = np.array([np.nan if x is None else x for x in series["rate"]])
            low = np.array([np.nan if c is None else c[0] for c in series["ci95"]])
            high = np.array([np.nan if c is None else c[1] for c in series["ci95"]])
            panel.errorbar(d, rate, yerr=[rate - low, high - rate], fmt=style, color=f"C{i}", capsize=3, label=label)
            panel.set_xticks(d)
    ax[0].set(xlabel="draft depth d", ylabel="top-1 agreement with the target",
              title="Accuracy after d-1 of the head's own states")
    ax[1].set(xlabel="draft depth n", ylabel="n-α  (acceptance given depths < n accepted)",
              title="EAGLE's n-α (shown where at least 30 chains remain)")
    ax[0].legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=120)
    return fig


QUALITY_AXES = {"tokens_per_forward": "new tokens per target forward",
                "forwards_per_answer": "target forwards per answer (prefill excluded)"}


def plot_quality(runs: dict, heads: list[str], x: str = "tokens_per_forward", title: str = "",
                 path: str | Path | None = None):
    """Notebook 07's quality against speed: the share of answers checked correct against `x`, a
    `lab.judge.sweep.Quality` measure named in QUALITY_AXES, for Top-K, each of `heads`' threshold
    sweeps, the EAGLE-1 chain (standard and with the shipped judge head) and, as single points,
    the target alone, standard SD and (against tokens per forward only: it makes no target
    forwards) the draft alone. `runs`: a sweep's runs of every judge head
    (`lab.judge.sweep.recorded_qualities`)."""

    def points(names: list[str]) -> tuple[list[float], list[float]]:
        return [getattr(runs[n], x) for n in names], [runs[n].mean_accuracy for n in names]
    fig, ax = plt.subplots(figsize=(9.5, 4))
    topk = [n for n in runs if n.startswith("top-")]
    ax.plot(*points(topk), "s--", label="Top-K (K = " + ", ".join(n[4:] for n in topk) + ")")
    for head, marker in zip(heads, ("o-", "v-.", "P-.", "X-", "d-")):
        ax.plot(*points(judge_runs(runs, head)), marker,
                label="judge, swept over delta" + ("" if head == DEFAULT_JUDGE else f" (head {head})"))
    eagle = [n for n in runs if n.startswith("eagle ") and "(" not in n]  # with the shipped judge head
    ax.plot(*points(eagle), "^:", label="EAGLE-1 chain: " + ", ".join(n[6:] for n in eagle))
    singles = [("target only", "k*"), ("standard SD", "kD")] + [("draft only", "rx")] * (x == "tokens_per_forward")
    for name, marker in singles:
        ax.plot(*points([name]), marker, label=name)
    ax.set(xlabel=QUALITY_AXES[x], ylabel="share of answers checked correct", title=title)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1))  # outside: the points fill the axes
    fig.tight_layout()
    if path:
        fig.savefig(path, dpi=120)
    return fig
