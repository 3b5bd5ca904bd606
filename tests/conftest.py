"""Shared test set-up. Tests run offline: nothing may reach the Hugging Face Hub from here."""

from __future__ import annotations

import os
import sys
from pathlib import Path

# Fail at once instead of retrying for ~30 s if anything tries the Hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
