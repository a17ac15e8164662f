"""The figures' old import path: lab/cli.py imports `plot_bench` from here. The figures live in
lab/viz/plots.py."""
from .viz.plots import QUALITY_AXES, plot_bench, plot_by_depth, plot_quality, use_style

__all__ = ["QUALITY_AXES", "plot_bench", "plot_by_depth", "plot_quality", "use_style"]
