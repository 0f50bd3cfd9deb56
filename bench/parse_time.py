"""Parse time of the weekly DAG file with a 10,000-case week vs a 10-case week (same run).

Each measurement parses ``dags/avsim_weekly.py`` in a fresh interpreter, the way the
dag-processor does (``DagBag`` of that one file), with ``[avsim] default_manifest``
pointing at a manifest of the given size, and reports the time DagBag took to collect
the file (imports of Airflow itself are excluded: they are paid once per processor).

As a reference, the same is done for a naive DAG file that reads the manifest at parse
time (what a home-grown generator typically does); it shows what the design avoids.

It ends with ``parse_time: large_vs_small=R naive_large_vs_small=R``.

    python bench/parse_time.py [--repeats 7] [--cases 10000]
    python bench/parse_time.py --quick      # one parse of each
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PROBE = r"""
import sys, time
from airflow.dag_processing.dagbag import DagBag
import avsim.dagbuild.weekly  # the provider's imports, paid once per dag-processor
t = time.perf_counter()
bag = DagBag(dag_folder=sys.argv[1])
elapsed = time.perf_counter() - t
assert not bag.import_errors, bag.import_errors
assert len(bag.dags) >= 2, list(bag.dags)
print(elapsed)
"""

NAIVE_DAG = """
# airflow DAG reference: reads every case at parse time (what avsim does not do)
import json, os
from pathlib import Path
from avsim.dagbuild.factory import load_weekly_dags
from avsim.manifest.loader import load_manifest
load_manifest(os.environ["AIRFLOW__AVSIM__DEFAULT_MANIFEST"])
globals().update(load_weekly_dags(catalog=Path(__file__).with_name("avsim_graphs.yaml")))
"""


def parse_once(dags: Path, manifest: Path, home: Path) -> float:
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__AVSIM__DEFAULT_MANIFEST": str(manifest),
    }
    out = subprocess.run(
        [sys.executable, "-c", PROBE, str(dags)], env=env, check=True, capture_output=True, text=True
    )
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--cases", type=int, default=10_000, help="the large week")
    ap.add_argument("--quick", action="store_true", help="one parse of each file and size")
    args = ap.parse_args()
    if args.quick:
        args.repeats = 1
    from avsim.manifest.sample import sample_manifest

    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        manifests = {}
        for n in (10, args.cases):
            manifests[n] = base / f"week-{n}.json"
            manifests[n].write_text(json.dumps(sample_manifest(n)))
        naive = base / "naive"
        naive.mkdir()
        (naive / "avsim_naive.py").write_text(NAIVE_DAG)
        (naive / "avsim_graphs.yaml").write_text((ROOT / "dags" / "avsim_graphs.yaml").read_text())
        results: dict[tuple[str, int], float] = {}
        for label, dags in (("avsim", ROOT / "dags"), ("naive reference", naive)):
            for n, path in manifests.items():
                times = [parse_once(dags, path, base / "home") for _ in range(args.repeats)]
                results[(label, n)] = statistics.median(times)
                print(
                    f"{label:16s} {n:6d} cases: median {results[(label, n)]:.3f}s over {args.repeats} parses"
                )
        ratio = results[("avsim", args.cases)] / results[("avsim", 10)]
        naive_ratio = results[("naive reference", args.cases)] / results[("naive reference", 10)]
        print(f"parse time ratio {args.cases:,} / 10 cases (avsim DAG file): {ratio:.3f}  (target <= 1.2)")
        print(f"parse time ratio {args.cases:,} / 10 cases (naive reference): {naive_ratio:.3f}")
        print(f"parse_time: large_vs_small={ratio:.3f} naive_large_vs_small={naive_ratio:.3f}")


if __name__ == "__main__":
    main()
