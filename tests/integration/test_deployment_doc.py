"""docs/deployment.md's first weekly run, as written, on docker-compose.yml's topology as processes.

Each command of the doc's "Start it" and "A first weekly run" blocks runs in order
(:mod:`tests.support.deployment_doc`): ``docker/new-env.sh`` writes the secrets, the distributed
stack starts with them, compose's one worker and compose's capacity file, and each
``docker compose exec`` runs on the stack with its service's environment. The week the doc
triggers must end in success, its manifest and report in the bucket.

Mocked: nothing (the phases are the fake simulator's real processes); Docker itself is not run.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from tests.support.airflow_run import query
from tests.support.deployment_doc import DocRunner, first_run_steps

# 267 s on 2 cores (stack start, 20-case week): under the suite's 900 s per test, so in `make test`.
# Long: a distributed stack and a whole first week, about 4 minutes on 2 cores.
pytestmark = [pytest.mark.integration, pytest.mark.distributed, pytest.mark.long]


def test_the_first_weekly_run_works_as_the_deployment_doc_says(tmp_path: Path) -> None:
    steps = first_run_steps()
    runner = DocRunner(tmp_path)
    started = time.monotonic()
    try:
        for step in steps:
            runner.run(step)
        stack = runner.stack
        assert stack is not None
        run_id = runner.triggered_run_id()
        keys = [o["Key"] for o in stack.s3().list_objects_v2(Bucket=stack.bucket).get("Contents", [])]
        assert "manifests/first-week.yaml" in keys
        assert any(k.startswith(f"avsim/runs/avsim_weekly__{run_id}/") and "report" in k for k in keys), keys[
            :50
        ]
        pools = dict(query(stack, "SELECT pool, slots FROM slot_pool"))  # type: ignore[arg-type]
        assert {k: pools.get(k) for k in ("avsim_gpu_spot", "avsim_gpu_on_demand", "avsim_cpu")} == {
            "avsim_gpu_spot": 6,
            "avsim_gpu_on_demand": 2,
            "avsim_cpu": 4,
        }, pools
    finally:
        runner.close()
    print(f"\nthe doc's {len(steps)} steps to a finished week: {time.monotonic() - started:.0f} s")
