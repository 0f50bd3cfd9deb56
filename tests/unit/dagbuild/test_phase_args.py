"""One builder of a phase task's arguments for the case phases and the run-level phases, and a DAG
builder whose modules import one another without a circle."""

from __future__ import annotations

import ast
import datetime as dt
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

import yaml

from avsim.dagbuild.factory import load_weekly_dags
from avsim.dagbuild.phase_args import phase_task_kwargs, run_phase_task_kwargs
from avsim.manifest.models import RunClass
from avsim.phases.policy import Role
from avsim.plan.build import build_plan
from avsim.plan.catalog import load_catalog
from avsim.settings import AvsimSettings

ROOT = Path(__file__).resolve().parents[3]
CATALOG = ROOT / "dags" / "avsim_graphs.yaml"
DAGBUILD = ROOT / "provider" / "avsim" / "dagbuild"


def _imports_within_dagbuild() -> dict[str, set[str]]:
    """module -> the dagbuild modules it imports, anywhere in the file (deferred imports too)."""
    graph: dict[str, set[str]] = {}
    for path in DAGBUILD.glob("*.py"):
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module == "avsim.dagbuild":
                found |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("avsim.dagbuild."):
                found.add((node.module or "").split(".")[2])
            elif isinstance(node, ast.Import):
                found |= {a.name.split(".")[2] for a in node.names if a.name.startswith("avsim.dagbuild.")}
        graph[path.stem] = found - {path.stem}
    return graph


def test_the_dag_builder_has_no_circle() -> None:
    graph = _imports_within_dagbuild()
    assert "phase_args" in graph["shard_dag"] and "phase_args" in graph["weekly"]
    try:
        order = list(TopologicalSorter(graph).static_order())
    except CycleError as exc:
        raise AssertionError(f"dagbuild modules import each other in a circle: {exc.args[1]}") from None
    # The DAG files' entry builds both DAGs; neither DAG's module reaches back to it.
    assert order.index("factory") > max(order.index("weekly"), order.index("shard_dag"))


def test_case_and_run_level_phases_take_their_arguments_from_one_builder(tmp_path: Path) -> None:
    doc = yaml.safe_load(CATALOG.read_text())
    name = next(iter(doc["run_phases"]))
    doc["run_phases"][name]["retry"] = {
        "infrastructure": 1,
        "delay_seconds": 7,
        "backoff": 3.0,
        "max_delay_seconds": 900,
    }
    catalog = tmp_path / "avsim_graphs.yaml"
    catalog.write_text(yaml.safe_dump(doc))
    plan = build_plan(load_catalog(catalog), AvsimSettings(), RunClass.ADHOC)
    rp = plan.run_phases[0]
    kwargs = run_phase_task_kwargs(rp, plan.run_class)
    case = phase_task_kwargs(plan.families[0].phases[0], Role.REGULAR, plan.run_class)
    assert set(kwargs) == set(case)  # the same arguments, one builder
    assert kwargs["retry_exponential_backoff"] == 3.0
    assert kwargs["max_retry_delay"] == dt.timedelta(seconds=900)
    assert kwargs["retries"] == rp.retries == 1 + 3  # the preemption budget's default of 3 too
    assert type(kwargs["weight_rule"]).__name__ == "AdhocCriticalPathPriority"
    # ...and so does the task the weekly DAG builds.
    dag = load_weekly_dags(catalog=catalog, settings=AvsimSettings(), part="parent")["avsim_weekly"]
    task = dag.task_dict[f"run_phases.{name}"]
    assert (task.retries, task.retry_exponential_backoff) == (4, 3.0)
    assert (task.retry_delay, task.max_retry_delay) == (dt.timedelta(seconds=7), dt.timedelta(seconds=900))
    assert task.pool == rp.pool and task.pool_slots == rp.pool_slots and task.priority_weight == 1
