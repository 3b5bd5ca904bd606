"""YAML from files and values ortlab does not control: aliases refused, nesting bounded.

An alias (`*a`) repeats an anchored node (`&a`) by reference, so a few hundred bytes of aliases to aliases describe a
structure of billions of nodes, which any reader that walks it (a validation message's repr, a JSON dump, a copy)
builds in full: a spec.yaml under 500 bytes in a run folder made the sidebar's run-detail request take 21 s, one
level deeper a MemoryError at 3 GiB (issue #48). The file's size bound does not bound that. No file ortlab writes
uses aliases and a spec has no need of them, so they are refused while the document is composed, before any of it
is built; nesting deeper than MAX_DEPTH is refused too (the composer recurses: deep enough, and it would fail with
RecursionError). Without aliases a document is at most as large as its text, which its reader bounds (spec.yaml:
`SPEC_MAX_BYTES`).

Booleans are YAML 1.2's: `true` and `false` (any case). PyYAML follows YAML 1.1, where `yes`, `no`, `on` and `off`
are booleans too: `name: no` was False, and `packing: on` slipped past the spec's strict booleans as True. Here
they stay the words they are, and a boolean field refuses them with what to write.

The pure-Python loader (PyYAML's C loader composes in C, where aliases cannot be refused first): a spec is a few KB.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from ortlab.errors import OrtlabError

MAX_DEPTH = 32


class UnsafeYAML(OrtlabError, yaml.YAMLError):
    """A YAML document ortlab will not build: it uses an alias, or nests too deep. The message says where."""


class _Loader(yaml.SafeLoader):
    def __init__(self, stream: Any):
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            line = self.peek_event().start_mark.line + 1
            raise UnsafeYAML(f"an alias (*name) on line {line}: ortlab does not expand YAML aliases; write it out")
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                line = self.peek_event().start_mark.line + 1
                raise UnsafeYAML(f"nested more than {MAX_DEPTH} levels deep (line {line})")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


_BOOL = "tag:yaml.org,2002:bool"
_Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != _BOOL]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver(_BOOL, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))


def load(text: str | bytes) -> Any:
    """The one YAML document in `text` (None when empty), as `yaml.safe_load` would give it (but for
    YAML 1.1's `yes`/`no`/`on`/`off`, which stay strings); `UnsafeYAML` (a
    `yaml.YAMLError`) for an alias or a nesting deeper than MAX_DEPTH, `yaml.YAMLError` for what is not YAML."""
    return yaml.load(text, Loader=_Loader)  # (a SafeLoader: no Python objects either)
