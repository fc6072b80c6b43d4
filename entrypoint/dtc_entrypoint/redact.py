"""Masks secret-looking values before a command line is logged or printed.

Hyperparameters reach the training program as ``--name value`` (hyperparameters.to_cli_args),
and the "running:" log line goes to CloudWatch, where anyone with log access reads it. A value
is masked when its name looks secret: it contains password, passwd, passphrase, token, secret,
key or credential, in any case (``--db_password``, ``--api-key=...``, ``HF_TOKEN=...``). The
program itself still receives the real value; only what is logged changes.
"""

import json
import re
from collections.abc import Mapping, Sequence

MASK = "****"
SECRET_NAME = re.compile(r"passw(?:or)?d|passphrase|token|secret|key|credential", re.IGNORECASE)
_ASSIGNMENT = re.compile(r"^(-{0,2})([A-Za-z_][\w.-]*)=(.*)$", re.DOTALL)


def looks_secret(name: str) -> bool:
    """Whether a hyperparameter or variable called ``name`` probably holds a credential."""
    return bool(SECRET_NAME.search(name))


def redact_argv(argv: Sequence[str]) -> list[str]:
    """``argv`` with the value of every secret-looking option or assignment replaced by ``MASK``.

    Handles ``--name value``, ``-name value``, ``--name=value`` and ``NAME=value`` (``env`` style).
    A ``--name`` followed by another option (a flag with no value) masks nothing.
    """
    out: list[str] = []
    mask_next = False
    for token in argv:
        if mask_next and not token.startswith("--"):
            out.append(MASK)
            mask_next = False
            continue
        mask_next = False
        assignment = _ASSIGNMENT.match(token)
        if assignment and looks_secret(assignment.group(2)):
            out.append(f"{assignment.group(1)}{assignment.group(2)}={MASK}")
        elif token.startswith("-") and len(token) > 1 and looks_secret(token.lstrip("-")):
            out.append(token)
            mask_next = True
        else:
            out.append(token)
    return out


def redact_command(argv: Sequence[str]) -> str:
    """``redact_argv`` joined with spaces, for a log line."""
    return " ".join(redact_argv(argv))


def redact_value(value):
    """A JSON-like value with the values under secret-looking keys masked, at any depth."""
    if isinstance(value, Mapping):
        return {k: MASK if looks_secret(str(k)) and not isinstance(v, (Mapping, list)) else redact_value(v)
                for k, v in value.items()}
    if isinstance(value, list):
        return [redact_value(v) for v in value]
    return value


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    """Environment variables for display: secret-looking names masked (``SM_HP_DB_PASSWORD``,
    ``AWS_SECRET_ACCESS_KEY``); JSON values (``SM_HPS``, ``SM_TRAINING_ENV``) masked inside;
    ``SM_USER_ARGS`` (an argv as JSON) through ``redact_argv``."""
    shown = {}
    for name, value in env.items():
        if looks_secret(name):
            shown[name] = MASK
            continue
        try:
            decoded = json.loads(value)
        except (TypeError, ValueError):
            shown[name] = value
            continue
        if isinstance(decoded, list) and all(isinstance(v, str) for v in decoded):
            shown[name] = json.dumps(redact_argv(decoded))
        elif isinstance(decoded, (Mapping, list)):
            shown[name] = json.dumps(redact_value(decoded))
        else:
            shown[name] = value
    return shown


def redact_plan(plan: Mapping) -> dict:
    """A ``LaunchPlan.to_dict()`` (or anything with ``argv``, ``env`` and ``services`` of the same
    shape) ready to print."""
    shown = dict(plan)
    if "argv" in shown:
        shown["argv"] = redact_argv(shown["argv"])
    if "env" in shown:
        shown["env"] = redact_env(shown["env"])
    if "services" in shown:
        shown["services"] = [redact_plan(s) for s in shown["services"]]
    return shown
