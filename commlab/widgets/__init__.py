"""Widgets for notebooks (ipywidgets 8 + plotly FigureWidget): the topology explorer,
the linkbench view and the overlap timeline. Their data models are plain Python objects
(``TopologyGraph``, ``LinkBenchResult``, ``TimelineModel``), tested without a browser;
live updates go through one pump, at most ~10 redraws a second. ``Progress``: the line
long work shows after ~2 s (magics, the engine's hang wait). ``WaitGraphView`` /
``show_wait_graph``: the wait-for graph of a WaitTimeoutError or a hang report.
``DistWatchView``: ``%dist_watch``'s live view of the call records."""

from commlab.widgets._distwatch import DistWatchModel, DistWatchView
from commlab.widgets._linkbench import LinkBenchView
from commlab.widgets._progress import Progress
from commlab.widgets._pump import PUMP, Pump
from commlab.widgets._style import byte_axis, fmt_binary, impl_colors, style_figure
from commlab.widgets._timeline import TimelineModel, TimelineView, show_timeline
from commlab.widgets._topology import TopologyExplorer, TopologyGraph
from commlab.widgets._waitgraph import WaitGraphModel, WaitGraphView, show_wait_graph

__all__ = ["DistWatchModel", "DistWatchView", "LinkBenchView", "PUMP", "Progress", "Pump",
           "TimelineModel", "TimelineView",
           "TopologyExplorer", "TopologyGraph", "byte_axis", "fmt_binary", "impl_colors",
           "WaitGraphModel", "WaitGraphView", "show_timeline", "show_wait_graph",
           "style_figure"]
