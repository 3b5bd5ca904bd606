"""Publish a finished run: model, tokenizer, ONNX files and a model card, to the Hub, a folder or a git remote.

What is published is staged first in a temporary folder that holds only what should leave the machine: the
model and tokenizer files, `onnx/` if the run was exported, and a README.md model card that states the base
model, the data, the task, the accelerations that really applied, the throughput measured and the eval
results. Tokens, optimizer states and checkpoints are never included unless asked for (`include_checkpoints`).

- `push_to_hub(run, "user/name")`: the token comes from the usual Hugging Face places (HF_TOKEN, the token saved
  by `hf auth login`) or the `token` argument; offline mode and a missing token fail at once, before any upload.
- `push_to_folder(run, path)`: the same files, for users without the Hub.
- `push_to_git(run, remote)`: the same files committed with git-lfs (weights as LFS objects) and pushed.

A LoRA run (`adapter.kind: lora`) publishes its adapter by default (adapter_model.safetensors, adapter_config.json,
the tokenizer: a few MB that need the base model), or with `merged=True` the merged model (the adapter folded into
the base weights: a plain transformers model); the card says which, and names the base model.

    ortlab.publish.card   the model card (`model_card`, `card_text`)
    ortlab.publish.push   staging, `push_to_hub`, `push_to_folder`, `push_to_git`
"""

from __future__ import annotations

from ortlab.publish.card import card_text, front_matter, model_card
from ortlab.publish.push import PublishError, PublishWarning, push_to_folder, push_to_git, push_to_hub, staged

__all__ = [
    "PublishError",
    "PublishWarning",
    "card_text",
    "front_matter",
    "model_card",
    "push_to_folder",
    "push_to_git",
    "push_to_hub",
    "staged",
]
