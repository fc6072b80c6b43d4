"""``DTC_*`` settings read from the environment when they are used (timeouts, grace periods)."""

import os

from .errors import ConfigError


def seconds(name: str, default: float) -> float:
    """``$name`` as seconds (float), or ``default`` when unset or empty.

    Raises:
        ConfigError: the value is not a number, naming the variable.
    """
    raw = os.environ.get(name, "")
    try:
        return float(raw) if raw else default
    except ValueError as error:
        raise ConfigError(f"{name}={raw!r} is not a number of seconds", key=name) from error
