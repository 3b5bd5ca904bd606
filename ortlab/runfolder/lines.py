"""One metrics line to one record: the careful parse, and a fast path that gives exactly the same records.

Reading a 100,000-step history spent most of its time here: json's Python-level `decode`/`raw_decode` wrappers and
a Python callback for every float (`parse_float`, which keeps `1e999` from becoming `inf`: ~7 calls a step line).
The fast path calls json's C scanner directly with the C float parser, and keeps the promise of the careful one (no
non-finite number in a record) by checking the bytes instead of each float: a JSON number becomes `inf` only when
it is very large, which takes an exponent of three digits or more (`1e999`, `2.5E+308`) or a run of at least 200
digits before it (10^200 times at most 10^99 is below the largest float). `plain_numbers` looks for those two
shapes in a whole read piece at once (a byte translation and two substring searches, C speed); a piece where either
shows up (almost never: ortlab writes `1e-05`) is parsed line by line the careful way. Literal `NaN` and `Infinity`
go through `parse_constant` to None in both paths.

Any line the fast path does not take as the common shape (an object from its first byte to its last) or cannot
parse goes to the careful parse, which says why it is not a record: the two agree on every line by construction,
and a test compares them on odd lines (malformed, huge, not objects, NaN, overflowing numbers, not UTF-8).
"""

from __future__ import annotations

import json
import json.scanner
from typing import Any


def _finite_float(text: str) -> float | None:
    value = float(text)
    return value if value - value == 0.0 else None  # inf - inf and nan - nan are nan


def _no_constant(_name: str) -> None:
    return None


# The careful decoder: non-finite numbers become None (the writer writes null for them; a file from elsewhere may
# not), so a record can be passed on as JSON without a second cleaning pass.
_DECODER = json.JSONDecoder(parse_float=_finite_float, parse_constant=_no_constant)
# The fast one: the same, but floats parsed in C (only used where `plain_numbers` said no float can overflow).
_SCAN = json.scanner.make_scanner(json.JSONDecoder(parse_constant=_no_constant))

# Every digit to b"0", e/E to b"e", signs to b"+", anything else to a space: then an overflowing number's shapes are
# plain substrings.
_SHAPES = bytes(
    ord("0") if chr(b).isdigit() and b < 128 else ord("e") if b in b"eE" else ord("+") if b in b"+-" else ord(" ")
    for b in range(256)
)
_LONG_DIGITS = b"0" * 200


def plain_numbers(data: bytes) -> bool:
    """True when no JSON number in `data` can be too large for a float (then the fast parse is exact)."""
    shapes = data.translate(_SHAPES)
    return b"e000" not in shapes and b"e+000" not in shapes and _LONG_DIGITS not in shapes


def parse_line(line: bytes) -> dict[str, Any] | str:
    """One line's record, or why it is not one (a short reason)."""
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError:
        return "not UTF-8"
    try:
        record = _DECODER.decode(text)
    except (ValueError, RecursionError):  # ValueError: not JSON, or an integer of thousands of digits
        return "not JSON"
    return record if isinstance(record, dict) else "not a JSON object"


def parse_plain(line: bytes) -> dict[str, Any] | str:
    """`parse_line`'s answer for a line from a piece where `plain_numbers` holds, faster for the common shape."""
    if line[:1] == b"{" and line[-1:] == b"}":
        try:
            text = line.decode("utf-8")
            record, end = _SCAN(text, 0)
            if end == len(text):
                return record
        except (ValueError, RecursionError, StopIteration):  # (UnicodeDecodeError is a ValueError)
            pass
    return parse_line(line)
