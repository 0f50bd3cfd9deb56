"""How one DAG run's scheduling cost grows with the cases it holds: the measurement behind S.

For each size S, a DAG of the shard shape (a producer of S cases, one mapped task group of
five chained phases) is run with ``airflow dags test`` with every task marked success
instead of executed (``--mark-success-pattern``), so the elapsed time is Airflow's own
work: expanding the groups and the scheduling passes over the run's unfinished task
instances. A run of one case is measured first as the fixed cost (interpreter start,
parsing, the run's own tasks) and subtracted. Reported per size: seconds over the fixed
cost, milliseconds per case, and that per-case cost relative to the smallest size (a
constant cost per case would keep it at 1; a pass over every unfinished task instance
makes it grow with S).

It ends with ``shard_pass: largest_vs_smallest=R ms_per_case=M`` (the per-case cost at the largest
size relative to the smallest, and that cost in milliseconds).

    python bench/shard_pass.py [--sizes 100,250,500,1000,2000]
    python bench/shard_pass.py --quick      # sizes 10,40
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DAG_FILE = """
# airflow DAG of the shard shape, for bench/shard_pass.py
import datetime as dt
from airflow.sdk import DAG, task, task_group
from airflow.providers.standard.operators.empty import EmptyOperator

with DAG("shard_shape", schedule=None, start_date=dt.datetime(2026, 1, 1), catchup=False,
         max_active_tasks=100000):
    @task
    def cases():
        return [{{"case_id": f"case-{{i:05d}}"}} for i in range({size})]

    @task_group
    def family(case):
        prev = None
        for name in ("prepare", "simulate", "evaluate", "render", "report"):
            t = EmptyOperator(task_id=name)
            if prev is not None:
                prev >> t
            prev = t

    family.expand(case=cases())
"""


def run_size(size: int, base: Path) -> float:
    home = base / f"home-{size}"
    dags = base / f"dags-{size}"
    dags.mkdir(parents=True)
    (dags / "shard_shape.py").write_text(DAG_FILE.format(size=size))
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__MAX_MAP_LENGTH": "100000",
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "WARNING",
    }
    airflow = str(Path(sys.executable).with_name("airflow"))
    subprocess.run([airflow, "db", "migrate"], env=env, check=True, capture_output=True)
    subprocess.run([airflow, "dags", "reserialize"], env=env, check=True, capture_output=True)
    t0 = time.perf_counter()
    done = subprocess.run(
        [airflow, "dags", "test", "shard_shape", "--mark-success-pattern", "family.*"],
        env=env,
        capture_output=True,
        text=True,
    )
    elapsed = time.perf_counter() - t0
    if done.returncode != 0:
        raise RuntimeError(done.stdout[-2000:] + done.stderr[-2000:])
    return elapsed


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", help="comma separated (100,250,500,1000,2000; 10,40 --quick)")
    ap.add_argument("--quick", action="store_true", help="small sizes")
    args = ap.parse_args()
    sizes = [int(s) for s in (args.sizes or ("10,40" if args.quick else "100,250,500,1000,2000")).split(",")]
    with tempfile.TemporaryDirectory(prefix="avsim-shard-pass-") as tmp:
        fixed = run_size(1, Path(tmp))
        print(f"fixed cost (a run of one case): {fixed:.1f}s", flush=True)
        base = per_case = None
        for size in sizes:
            work = max(run_size(size, Path(tmp)) - fixed, 1e-6)
            per_case = work / size
            base = base or per_case
            print(
                f"S={size:5d}: {work:7.1f}s over the fixed cost for {size * 5} phase task instances, "
                f"{per_case * 1000:6.1f} ms per case, x{per_case / base:.2f} the per-case cost at S={sizes[0]}",
                flush=True,
            )
    assert base and per_case
    print(f"shard_pass: largest_vs_smallest={per_case / base:.3f} ms_per_case={per_case * 1000:.2f}")


if __name__ == "__main__":
    main()
