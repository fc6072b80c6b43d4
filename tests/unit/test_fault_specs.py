"""DTC_FAULT's specs (dtc_train.fault): what parses, and what is refused naming the variable."""

import pytest

from dtc_train import fault


@pytest.mark.parametrize("text, expected", [
    ("rank=3 step=20", fault.Fault(3, 20)),
    ("rank=0,step=5,signal=segv", fault.Fault(0, 5, fault.signal.SIGSEGV)),
    ("rank=1 step=2 exit=3", fault.Fault(1, 2, None, 3)),
    ("host=algo-2 step=7", fault.Fault(None, 7, host="algo-2")),
    ("rank=3 step=30 stall=3600", fault.Fault(3, 30, None, stall_s=3600.0)),
])
def test_fault_specs_parse(text, expected):
    assert fault.parse(text) == expected


@pytest.mark.parametrize("text", ["rank=1", "step=3", "rank=1 step=0", "rank=x step=2", "rank=1 step=2 signal=NOPE",
                                  "rank=1 step=2 signal=KILL exit=1", "rank=1 step=2 host=algo-2",
                                  "host=algo-2 step=3 signal=TERM", "host=algo-2", "rank=1 step=2 stall=9 exit=1",
                                  "rank=1 step=2 stall=-1", "host=algo-2 step=3 stall=5"])
def test_a_bad_fault_spec_is_refused_naming_the_variable(text):
    with pytest.raises(ValueError, match="^DTC_FAULT="):
        fault.parse(text)
