"""ortlab's jupyter_server extension: a small authenticated REST API over the runs folder, for the sidebar.

Enabled by installing ortlab (the wheel ships `etc/jupyter/jupyter_server_config.d/ortlab.json`); check with
`jupyter server extension list`, turn off with `jupyter server extension disable ortlab`.

    GET  /ortlab/api/runs                    every run, newest first
    POST /ortlab/api/runs                    launch a RunSpec (JSON)
    GET  /ortlab/api/runs/<id>               one run: status, spec, what applied, result
    GET  /ortlab/api/runs/<id>/metrics       ?offset=N: records written after byte N
    POST /ortlab/api/runs/<id>/stop          graceful stop
    POST /ortlab/api/runs/<id>/resume        continue from the last checkpoint
    GET  /ortlab/api/doctor                  the doctor's cached report
    GET  /ortlab/api/spec                    RunSpec's JSON schema, defaults and acceleration toggles (the New run form)
                                             and what each metrics record holds (`runfolder.records`)

The one setting is the runs root, `c.Ortlab.runs_root` (default: $ORTLAB_RUNS, else `ortlab-runs` in the
server's root folder). The server never imports torch: views read run folders, a spec parses without it, and a
launch checks the spec against the doctor's cached report (`ortlab.server.actions`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from traitlets import Unicode
from traitlets.config import Configurable

from ortlab._version import __version__
from ortlab.runner import DEFAULT_ROOT
from ortlab.server.runindex import RunIndex


class Ortlab(Configurable):
    """ortlab's server settings (`c.Ortlab.*` in jupyter_server_config.py, or `--Ortlab.runs_root=...`)."""

    runs_root = Unicode(
        "",
        help=(
            "Folder holding ortlab's run folders, which the sidebar lists and where it launches runs. A relative "
            "path is relative to the server's root_dir. Default: $ORTLAB_RUNS, else 'ortlab-runs' in root_dir."
        ),
    ).tag(config=True)


def runs_root_for(setting: str, root_dir: str | os.PathLike) -> Path:
    """The absolute runs root: the setting, else $ORTLAB_RUNS, else <root_dir>/ortlab-runs."""

    chosen = setting or os.environ.get("ORTLAB_RUNS") or DEFAULT_ROOT
    path = Path(chosen).expanduser()
    return (path if path.is_absolute() else Path(root_dir).expanduser() / path).resolve()


@dataclass
class ServerState:
    """What the handlers share: the runs root, where runs start (the server's root_dir), the run index."""

    root: Path
    cwd: Path
    index: RunIndex = field(init=False)

    def __post_init__(self) -> None:
        self.index = RunIndex(self.root)


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": "ortlab.server"}]


def _load_jupyter_server_extension(serverapp: Any) -> None:
    """Called by jupyter_server at start-up: read the setting, add the routes under the server's base_url."""
    from jupyter_server.utils import url_path_join

    from ortlab.server.handlers import handlers

    settings = Ortlab(config=serverapp.config)
    root_dir = getattr(serverapp, "root_dir", None) or os.getcwd()
    state = ServerState(root=runs_root_for(settings.runs_root, root_dir), cwd=Path(root_dir).expanduser())
    web_app = serverapp.web_app
    web_app.settings["ortlab"] = state
    base_url = web_app.settings["base_url"]
    web_app.add_handlers(".*$", [(url_path_join(base_url, pattern), handler) for pattern, handler in handlers()])
    serverapp.log.info("ortlab %s: run API at %sortlab/api, runs root %s", __version__, base_url, state.root)
