"""The run descriptor's run class: the RunClass enum in the code, the same string in its JSON."""

from __future__ import annotations

import json

from avsim.contracts import RunDescriptor
from avsim.manifest.models import RunClass


def test_a_descriptor_written_with_a_plain_string_parses_to_the_enum_and_writes_the_same_json() -> None:
    written = {"run_key": "avsim_adhoc__r1", "artifact_root": "file:///a", "run_class": "adhoc"}
    run = RunDescriptor.model_validate(written)
    assert run.run_class is RunClass.ADHOC
    assert run.to_json()["run_class"] == "adhoc" and type(run.to_json()["run_class"]) is str
    assert f"{run.run_class}" == str(run.run_class) == "adhoc"  # as the string read in messages and keys
    assert json.loads(json.dumps(run.to_json())) == {**run.to_json(), "run_class": "adhoc"}
    assert RunDescriptor(run_key="k", artifact_root="file:///a").run_class is RunClass.WEEKLY
