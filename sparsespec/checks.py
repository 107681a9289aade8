"""Range checks that name the key: what the settings' and parts' `__post_init__` raise with."""

from __future__ import annotations

import difflib
import math
from typing import Any

DTYPES = ("auto", "float32", "bfloat16", "float16")  # model.dtype, drafter.dtype, teacher.dtype (auto: models.device)


class ConfigError(ValueError):
    """A config key that cannot work: the message names the key and what it accepts."""


class SettingError(ConfigError):
    """A bad setting as data: its key, its value and the reason. A part knows its own field
    (`ratio`); whoever holds the part knows where the user set it (`method.drafter.policy`), so it
    re-raises `err.at("method.drafter.policy")` and the message names the key as typed."""

    def __init__(self, key: str, value: Any, reason: str) -> None:
        self.key, self.value, self.reason = key, value, reason
        super().__init__(f"{key}={value!r} {reason}")

    def at(self, prefix: str) -> SettingError:
        """The same error (of the same class: a subclass takes the same three fields) with its key
        under `prefix`."""
        return type(self)(f"{prefix}.{self.key}" if prefix else self.key, self.value, self.reason)

    def __reduce__(self) -> tuple:  # pickled by its fields (a worker process's error reaches its parent)
        return type(self), (self.key, self.value, self.reason)


def close(word: str, allowed: list[str]) -> str:
    near = difflib.get_close_matches(str(word), [str(a) for a in allowed], n=1)
    return f" (did you mean {near[0]}?)" if near else ""


def number(key: str, value: Any, kind: type = float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or (kind is int and not isinstance(value, int)):
        raise SettingError(key, value, f"has the wrong type: expected {'an integer' if kind is int else 'a number'}")
    if isinstance(value, float) and math.isnan(value):
        raise SettingError(key, value, "is not a number")
    return value


def require(ok: bool, key: str, value: Any, allowed: str) -> None:
    if not ok:
        raise SettingError(key, value, f"is out of range: allowed {allowed}")


def positive(key: str, value: Any, kind: type = int) -> None:
    require(number(key, value, kind) > 0, key, value, "values > 0")


def non_negative(key: str, value: Any, kind: type = float) -> None:
    require(number(key, value, kind) >= 0, key, value, "values >= 0")


def choice(key: str, value: Any, allowed: tuple | list) -> None:
    if value not in allowed:
        raise SettingError(key, value, f"is not allowed{close(str(value), list(allowed))}: "
                                       f"use one of {', '.join(map(str, allowed))}")
