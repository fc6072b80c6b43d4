"""Unit: hyperparameter decoding in both SDK encodings and the argv they become."""

import json

import pytest

from dtc_entrypoint.errors import ConfigError
from dtc_entrypoint.hyperparameters import format_value, parse_bool, parse_positive_int, to_argv
from dtc_local.job_tree import encode_hyperparameters
from helpers import AWKWARD


def toolkit_decode(raw: str):
    """sagemaker-training's environment.read_hyperparameters rule for one value."""
    try:
        return json.loads(raw)
    except ValueError:
        return raw


@pytest.mark.parametrize("value, expected", [(True, True), (False, False)])
@pytest.mark.parametrize("encoding", ["json", "str"])
def test_booleans_survive_both_sdk_encodings(value, expected, encoding):
    raw = encode_hyperparameters({"flag": value}, encoding)["flag"]   # "true"/"false" or "True"/"False"
    assert parse_bool("flag", toolkit_decode(raw)) is expected


@pytest.mark.parametrize("text", ["False", "false", "FALSE", "0", "no", ""])
def test_false_strings_are_false(text):
    assert parse_bool("sagemaker_mpi_enabled", text) is False


@pytest.mark.parametrize("text", ["True", "true", "1", "yes"])
def test_true_strings_are_true(text):
    assert parse_bool("sagemaker_mpi_enabled", text) is True


def test_bad_boolean_names_the_key():
    with pytest.raises(ConfigError) as caught:
        parse_bool("sagemaker_mpi_enabled", "maybe")
    assert caught.value.key == "sagemaker_mpi_enabled"
    assert str(caught.value).splitlines()[0].startswith("hyperparameter sagemaker_mpi_enabled='maybe'")


@pytest.mark.parametrize("raw, expected", [(4, 4), ("4", 4), (None, None), ("", None)])
def test_positive_ints(raw, expected):
    assert parse_positive_int("n", raw) == expected


@pytest.mark.parametrize("raw", [0, -1, "two", 1.5])
def test_bad_positive_ints_name_the_key(raw):
    with pytest.raises(ConfigError, match="hyperparameter n="):
        parse_positive_int("n", raw)




@pytest.mark.parametrize("encoding", ["json", "str"])
def test_awkward_strings_become_exact_argv(encoding):
    decoded = {k: toolkit_decode(v) for k, v in encode_hyperparameters(AWKWARD, encoding).items()}
    argv = to_argv(decoded)
    assert argv[1::2] == list(AWKWARD.values())
    assert argv[0::2] == [f"--{k}" for k in AWKWARD]


def test_order_is_kept_and_single_letter_keys_get_one_dash():
    assert to_argv({"z": 1, "epochs": 3, "a": "x"}) == ["-z", "1", "--epochs", "3", "-a", "x"]


@pytest.mark.parametrize("value, text", [
    (3, "3"), (0.001, "0.001"), (True, "True"), (False, "False"), (None, ""),
    ([1, "a"], '[1, "a"]'), ({"k": [1, 2]}, '{"k": [1, 2]}'),
])
def test_format_value(value, text):
    assert format_value(value) == text
