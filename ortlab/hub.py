"""Talking to the Hugging Face Hub without hanging: offline answers at once, online calls time out fast.

`huggingface_hub` retries for ~30 s before giving up on an unreachable Hub, and some of its network errors are
not `OSError`s. A notebook user who typed a Hub id on a plane deserves an answer in a second, so every Hub call
in ortlab goes through here.
"""

from __future__ import annotations

import os

from ortlab.errors import OrtlabError

TIMEOUT_S = 10.0


class HubUnavailable(OrtlabError, ConnectionError):
    """The Hub cannot be reached (offline mode, no network, or it timed out)."""


def hub_offline() -> bool:
    """True when the user (or the environment) switched the Hub off: HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE."""
    return any(
        os.environ.get(v, "").lower() in ("1", "true", "yes", "on") for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    )


def hub_repo_exists(repo_id: str, repo_type: str = "model") -> bool:
    """Does `repo_id` exist on the Hub? Raises HubUnavailable instead of retrying when it cannot tell."""
    if hub_offline():
        raise HubUnavailable("offline mode is on (HF_HUB_OFFLINE=1)")
    from huggingface_hub import HfApi
    from huggingface_hub.errors import RepositoryNotFoundError

    api = HfApi()
    info = api.dataset_info if repo_type == "dataset" else api.model_info
    try:
        info(repo_id, timeout=TIMEOUT_S)
        return True
    except RepositoryNotFoundError:
        return False
    except Exception as e:  # httpx, requests and OS errors alike: the Hub could not answer
        raise HubUnavailable(f"{type(e).__name__}: {str(e).strip()[:200]}") from None
