"""QUERY_STRING as stock's get_parameters() reads it."""

from __future__ import annotations

import re

_HEX = re.compile(r"%([0-9a-fA-F]{2})")


def _decode(s: str, plus: bool = True) -> str:
    if plus:
        s = s.replace("+", " ")
    return _HEX.sub(lambda m: m.group(0) if m.group(1) == "00" else chr(int(m.group(1), 16)), s)


def parameters(query: str) -> dict[str, str]:
    """Split on '&'; `+` is a space only in values; a name ends at '&' or '='; a value ends at '&'; the last duplicate wins.

    Stock's quirk: after a name that ends at '&', the next item is taken as its
    value, so `foo&service=x` binds `foo` to `service=x`.
    """
    out: dict[str, str] = {}
    i, n = 0, len(query)
    while i < n:
        j = i
        while j < n and query[j] not in "&=":
            j += 1
        name = _decode(query[i:j], plus=False)
        value = ""
        if j < n:
            k = j + 1
            while k < n and query[k] != "&":
                k += 1
            value = _decode(query[j + 1:k])
            i = k + 1 if k < n else k
        else:
            i = j
        out[name] = value
    return out
