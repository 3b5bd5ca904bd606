"""Notebook views (ipywidgets + plotly): the Workbench, live run charts and the chat playground.

Needs `pip install 'ortlab[ui]'` (the playground also `ortlab[serve]`)."""

from __future__ import annotations

try:
    import ipywidgets  # noqa: F401
    import plotly  # noqa: F401
except ImportError as e:  # name the missing piece and the fix, not just the module
    raise ImportError(
        f"ortlab's notebook views need ipywidgets, plotly and anywidget ({e.name} is missing): pip install 'ortlab[ui]'"
    ) from e

from ortlab.ui.charts import RunMonitor
from ortlab.ui.playground import Playground
from ortlab.ui.workbench import Workbench

__all__ = ["Playground", "RunMonitor", "Workbench"]
