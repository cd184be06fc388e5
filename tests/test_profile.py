"""``profile.steps=A-B`` writes a trace of those updates that TensorBoard and Perfetto read."""

from __future__ import annotations

import gzip
import json

import pytest
from conftest import tiny_config

from jaxnet import config
from jaxnet.errors import UserError
from jaxnet.train import train


@pytest.mark.parametrize(
    "steps, per_call",
    [("3-5", {}), ("4-5", {"steps_per_call": 2, "log_every": 4})],  # calls of 2 end at 3 and 5 for the trace
)
def test_profile_steps_write_a_trace(tmp_path, quadrants, capsys, steps, per_call):
    train(tiny_config(profile={"steps": steps}, train=per_call), tmp_path / "run", dataset=quadrants)
    traces = list((tmp_path / "run" / "profile").glob("plugins/profile/*/perfetto_trace.json.gz"))
    assert len(traces) == 1 and list(traces[0].parent.glob("*.xplane.pb"))
    events = json.loads(gzip.decompress(traces[0].read_bytes()))
    names = {e.get("name", "") for e in (events["traceEvents"] if isinstance(events, dict) else events)}
    assert any("train_step" in n for n in names)  # the compiled step ran inside the trace
    assert f"trace of updates {steps} written" in capsys.readouterr().out


@pytest.mark.parametrize(
    "value, message",
    [("5-3", "needs 1 <= A <= B"), ("0-2", "needs 1 <= A <= B"), ("10", "expected A-B"), ("1-999", "train.steps=12")],
)
def test_bad_profile_steps_are_one_line_errors(value, message):
    with pytest.raises(UserError, match=message):
        config.validate(tiny_config(profile={"steps": value}))
