"""Hyperparameter values as the SageMaker Python SDK writes them, and the argv they become.

``hyperparameters.json`` maps every key to a string. Who wrote it decides what the string holds
(aws/sagemaker-python-sdk v2, ``estimator.py``; the toolkit's ``mapping.py`` reads it):

* SDK v2 ``Framework`` estimators (and ``Estimator`` with ``source_dir``) JSON-encode every value:
  ``"a b"`` -> ``"\\"a b\\""``, ``True`` -> ``"true"``, ``[1, 2]`` -> ``"[1, 2]"``.
* The generic ``Estimator`` without ``source_dir`` sends ``str(value)``: ``False`` -> ``"False"``,
  ``{"a": 1}`` -> ``"{'a': 1}"``.

sagemaker-training's ``environment.read_hyperparameters`` JSON-decodes each value and keeps the
raw string when that fails; the values reaching this module have been through that step.
"""

import json
from collections.abc import Mapping

from .errors import ConfigError

_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off", ""}


def parse_bool(key: str, value: object, default: bool = False) -> bool:
    """Reads a boolean in either SDK encoding.

    Args:
        key: the hyperparameter's name, for the error message.
        value: ``True``/``False`` (JSON-decoded), a string such as ``"False"`` or ``"true"``
            (generic Estimator, case-insensitive), ``0``/``1``, or ``None`` (absent).
        default: returned for ``None``.

    Raises:
        ConfigError: for anything else, naming ``key``.
    """
    if value is None:
        return default
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    raise ConfigError(
        f"hyperparameter {key}={value!r} is not a boolean: set it to true or false", key=key
    )


def parse_positive_int(key: str, value: object) -> int | None:
    """Reads a positive integer (``4`` or ``"4"``); ``None`` stays ``None``.

    Raises:
        ConfigError: for zero, negatives, fractions and non-numbers, naming ``key``.
    """
    if value is None or value == "":
        return None
    try:
        number = int(str(value).strip())
    except ValueError:
        number = 0
    if number < 1 or isinstance(value, float) and not value.is_integer():
        raise ConfigError(
            f"hyperparameter {key}={value!r} is not a positive integer: set it to 1 or more",
            key=key,
        )
    return number


def format_value(value: object) -> str:
    """The argv string for one decoded hyperparameter value.

    Strings pass unchanged (spaces, quotes, ``$`` and ``;`` included: no shell ever sees them).
    Numbers and booleans use ``str()`` as sagemaker-training does (``True`` -> ``"True"``), so
    scripts written for AWS's containers parse them the same way. Lists and dicts become JSON,
    which a script can ``json.loads`` (the toolkit's Python repr and ``k=v,...`` forms cannot be
    parsed back reliably). ``None`` (JSON ``null``) becomes ``""``.
    """
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, (list, dict)):
        return json.dumps(value)
    return str(value)


def to_argv(hyperparameters: Mapping[str, object]) -> list[str]:
    """User hyperparameters as command-line arguments, in the order the file lists them.

    ``{"epochs": 3, "model-name": "a b", "x": 1}`` -> ``["--epochs", "3", "--model-name", "a b",
    "-x", "1"]``: ``--key`` for names longer than one character and ``-k`` otherwise, as
    sagemaker-training's ``mapping.to_cmd_args`` does, but without its alphabetical re-ordering
    (aws/sagemaker-training-toolkit#221).
    """
    argv: list[str] = []
    for key, value in hyperparameters.items():
        argv.append(("--" if len(key) > 1 else "-") + key)
        argv.append(format_value(value))
    return argv
