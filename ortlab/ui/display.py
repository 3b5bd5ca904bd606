"""Keeping a run view's saved output true to the run, after the run has moved on.

A widget's output holds two things: the live view (a widget model id, which only a running kernel can draw) and
a static one (`text/html`: the curves as SVG and the runs table) for every reader without that kernel: an
executed notebook (papermill), its HTML (nbconvert), GitHub's viewer, the same notebook opened tomorrow. The
static part is computed once, when the cell displays the widget. For a run launched in that cell, that is the
moment it says "pending, step 0", and that is what an executed notebook would keep.

So ortlab's run views display themselves with a display id and, after each later cell the user runs, re-publish
their output when a run's state changed since (pending -> running -> completed): `run.wait()` in the next cell
ends with the finished curve and status in the earlier cell's saved output. This is the hook matplotlib's inline
backend uses to show figures (IPython's `post_run_cell` event), and the re-publication is a standard
`update_display_data`, which papermill, nbclient and JupyterLab all apply to the earlier output.

Both widget generations: ipywidgets 8 gives a widget's output as `_repr_mimebundle_`; ipywidgets 7 (Colab's) has
none and displays through `_ipython_display_`, which this mixin replaces. So the live part of the bundle is asked of
the widget class where it has the method, and built as ipywidgets 7 builds it (the same widget-view mimetype, the
same version 2.0) where not: one bundle, one display path, on both (`_repr_mimebundle_` below).

Why not refresh from the thread that follows the run, when it ends? A message from a background thread belongs
to the cell that started the thread; papermill, executing a later cell by then, drops it. And why not on every
cell? Re-publishing redraws the live widget in JupyterLab: a state change is rare (three per run), new points are
not. The hook removes itself once every run it shows has ended and that was published.
"""

from __future__ import annotations

import logging
import uuid
import weakref
from typing import Any

log = logging.getLogger(__name__)


WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def widget_view_bundle(widget: Any) -> dict[str, Any]:
    """A widget's display bundle built as ipywidgets 7 builds it in `Widget._ipython_display_` (it has no
    `_repr_mimebundle_`): the plain-text repr and, for a widget with a view, the view's mimetype with its model id.
    ipywidgets 8's `_repr_mimebundle_` returns the same."""
    plaintext = repr(widget)
    bundle: dict[str, Any] = {"text/plain": plaintext[:110] + "…" if len(plaintext) > 110 else plaintext}
    if getattr(widget, "_view_name", None) is not None:
        bundle[WIDGET_VIEW] = {"version_major": 2, "version_minor": 0, "model_id": widget.model_id}
    return bundle


class RefreshedDisplay:
    """Mixin for an ipywidgets view of runs. The class provides `_repr_mimebundle_` (the widget's view plus the
    static one) and `_shown_runs()` (the `Run`s whose states decide when to re-publish)."""

    _display_id: str | None = None
    _published: tuple[tuple[str, str], ...] | None = None
    _hook: Any = None

    def _shown_runs(self) -> list[Any]:  # pragma: no cover - every user overrides it
        raise NotImplementedError

    def _states(self) -> tuple[tuple[str, str], ...]:
        states = []
        for run in self._shown_runs():
            try:
                states.append((run.id, str(run.state)))
            except Exception:  # a folder removed under us: a state like any other, never an error in a cell
                states.append((run.id, "missing"))
        return tuple(states)

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any]:
        """The widget's live view (its model id): the widget class's own bundle on ipywidgets 8, the one ipywidgets
        7's `_ipython_display_` would send where the class has no `_repr_mimebundle_`. Views add their static
        summary on top (`super()._repr_mimebundle_()`)."""
        parent = getattr(super(), "_repr_mimebundle_", None)
        if parent is not None:
            return parent(**kwargs) or {}
        return widget_view_bundle(self)

    def _ipython_display_(self, **kwargs: Any) -> None:
        """Display with a display id (so that the output can be updated later), and watch for state changes."""
        from IPython.display import display

        if self._display_id is None:
            self._display_id = f"ortlab-{uuid.uuid4().hex}"
        self._published = self._states()
        display(self._repr_mimebundle_(), raw=True, display_id=self._display_id)
        if getattr(super(), "_repr_mimebundle_", None) is None and hasattr(self, "_handle_displayed"):
            self._handle_displayed(**kwargs)  # ipywidgets 7: its `on_displayed` callbacks, as its own display does
        self._watch()

    def _watch(self) -> None:
        from IPython import get_ipython

        shell = get_ipython()
        if shell is None or self._hook is not None:
            return
        # The hook holds the view weakly: a view the user dropped is not kept alive by IPython's event list.
        ref = weakref.ref(self)

        def after_cell(*_args: Any) -> None:
            view = ref()
            if view is None or getattr(view, "comm", None) is None:  # dropped, or closed (`widget.close()`)
                shell.events.unregister("post_run_cell", after_cell)
                return
            view.refresh_display()

        self._hook = after_cell
        shell.events.register("post_run_cell", after_cell)

    def refresh_display(self, force: bool = False) -> bool:
        """Re-publish this view's output if a run's state changed since it was last published (or `force`);
        returns whether it did. Never raises: it runs after the user's cells, where a traceback would be ortlab's
        noise in their output."""
        try:
            from IPython.display import update_display

            states = self._states()
            if self._display_id is None or (states == self._published and not force):
                return False
            self._published = states
            update_display(self._repr_mimebundle_(), raw=True, display_id=self._display_id)
            return True
        except Exception:
            log.debug("could not refresh an ortlab view's output", exc_info=True)
            return False
