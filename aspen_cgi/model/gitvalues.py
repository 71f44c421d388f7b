"""git's syntax for configuration values: booleans and sizes with k/m/g
units, with git's own rules. Imports nothing: the CGI program's first steps
parse settings with it."""

from __future__ import annotations

TYPE_CHECKING = False   # typing itself costs a CGI start-up milliseconds
if TYPE_CHECKING:
    from typing import Optional

_TRUE = {"true", "yes", "on", "1", ""}
_FALSE = {"false", "no", "off", "0"}
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


class ConfigError(ValueError):
    pass


def parse_bool(value: Optional[str]) -> bool:
    if value is None:
        return True
    v = value.strip().lower()
    if v in _TRUE:
        return True
    if v in _FALSE:
        return False
    try:
        return int(v) != 0
    except ValueError:
        raise ConfigError(f"bad boolean config value '{value}'") from None


def parse_size(value: str) -> int:
    """git_parse_ulong: a number with an optional k/m/g suffix."""
    v = value.strip().lower()
    unit = v[-1:] if v[-1:] in ("k", "m", "g") else ""
    digits = v[:-1] if unit else v
    if not digits or not digits.isdigit():
        raise ConfigError(f"bad numeric config value '{value}'")
    return int(digits) * _UNITS[unit]
