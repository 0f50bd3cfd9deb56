"""A phase's arguments are declared once (``PhaseArgs``): both operators take exactly its fields as
keywords, which Airflow's ``partial``/``expand`` check, and build it from them rendered.

Real Airflow (a DAG, ``partial``/``expand``, the operator's constructor); no scheduler.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import pytest
from airflow.sdk import DAG
from tests.support.kube_settings import KUBE

from avsim.attempt.args import OPERATOR_FIELDS, PhaseArgs
from avsim.contracts.case import CaseEntry
from avsim.operators.kubernetes import KubernetesPhaseOperator
from avsim.operators.phase import LocalPhaseOperator
from avsim.phases.policy import Role

RUN = {"run_key": "avsim_weekly__w1", "artifact_root": "file:///tmp/avsim-w1", "image": "img@sha256:0"}
CASE = {"case_id": "c1", "seed": 1}
OPERATORS: list[tuple[type, dict[str, Any]]] = [
    (LocalPhaseOperator, {}),
    (KubernetesPhaseOperator, {"kube": KUBE}),
]


@pytest.mark.parametrize(("cls", "extra"), OPERATORS)
def test_the_operators_take_phase_args_fields_as_keywords(cls: type, extra: dict[str, Any]) -> None:
    params = inspect.signature(cls.__init__).parameters
    names = {f.name for f in OPERATOR_FIELDS}
    assert names == {f.name for f in dataclasses.fields(PhaseArgs)} - {"task_id", "retries"}
    assert names <= params.keys()
    assert all(params[n].kind is inspect.Parameter.KEYWORD_ONLY for n in names)
    assert sorted(n for n in names if params[n].default is inspect.Parameter.empty) == [
        "case",
        "phase",
        "run",
    ]


@pytest.mark.parametrize(("cls", "extra"), OPERATORS)
def test_expand_maps_a_phase_keyword_and_refuses_an_unknown_one(cls: type, extra: dict[str, Any]) -> None:
    with DAG(dag_id=f"probe_{cls.__name__}", schedule=None):
        mapped = cls.partial(
            task_id="simulate", phase="simulate", run=RUN, gpus=1, role="spot", **extra
        ).expand(case=[CASE])
        assert mapped.expand_input.value == {"case": [CASE]}
        with pytest.raises(TypeError, match="cases"):
            cls.partial(task_id="other", phase="simulate", run=RUN, **extra).expand(cases=[CASE])


@pytest.mark.parametrize(("cls", "extra"), OPERATORS)
def test_the_lifecycle_takes_the_rendered_fields_as_phase_args(cls: type, extra: dict[str, Any]) -> None:
    op = cls(
        task_id="standard.simulate",
        phase="simulate",
        case=CASE,
        run=RUN,
        upstream_phases={"prepare": "standard.prepare"},
        role="spot",
        gpus=1,
        retries=4,
        **extra,
    )
    assert op.role is Role.SPOT and op.case == CASE  # the operator keeps its fields as given
    args = op.lifecycle.args
    assert args == PhaseArgs(
        phase="simulate",
        case=CaseEntry.model_validate(CASE),
        run=args.run,
        task_id="standard.simulate",
        upstream_phases={"prepare": ("standard.prepare",)},
        role=Role.SPOT,
        gpus=1,
        retries=4,
    )
    assert args.run is not None and args.run.run_key == RUN["run_key"]
    assert args.node_class == "gpu-spot"
    with pytest.raises(TypeError, match="phase"):
        cls(task_id="t", case=CASE, run=RUN, **extra)
