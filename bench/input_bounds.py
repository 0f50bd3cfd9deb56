"""Bad input costs at most its size: peak memory and time of validating each bad-input shape at
growing sizes (issue 28).

Each measurement validates one manifest file in a fresh interpreter, the way
``avsim manifest validate`` and the weekly run's ``prepare`` do (:func:`load_manifest_bounded`:
the bytes read here, parsed and validated in a bounded child process; the default limits), and
takes the peak RSS of either process (``VmHWM``, ``ru_maxrss``) and the CPU time of the load (both
processes: what ``RLIMIT_CPU`` caps, and not stretched by other work on the machine as wall time
is) beyond the fixed cost of a child that validates a tiny manifest. For every shape and size:

* the memory ratio: peak RSS / (``MEMORY_BASE`` + input bytes x ``MEMORY_PER_BYTE`` of its format),
  the bound docs/security.md states (:mod:`avsim.manifest.bounded`); at most 1 when it holds;
* the time exponent: the slope of log(time) against log(bytes) over the shape's sizes (1: linear).

Each size is measured ``--repeats`` times, 3 (the least time, the largest RSS). It prints one line per
size, then ``input_bounds: worst_memory_ratio=R worst_time_exponent=E``.
Every child runs under ``RLIMIT_AS`` of 3 GiB, so a regression cannot take the machine with it
(a child killed by it counts as a ratio of 99).

    python bench/input_bounds.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GOOD = ROOT / "tests" / "unit" / "corpus" / "good_minimal.yaml"
CEILING = 3 * 2**30

PROBE = r"""
import json, resource, sys
from avsim.errors import ManifestError
from avsim.manifest.bounded import load_manifest_bounded
from avsim.manifest.policy import ManifestPolicy


def cpu():
    # CPU seconds of this process and its finished children: what the bound caps (RLIMIT_CPU), and
    # unlike wall time not stretched by other work on a shared machine.
    return sum(r.ru_utime + r.ru_stime for r in map(resource.getrusage, (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)))


policy = ManifestPolicy()
fixed = []
for _ in range(3):  # the fixed cost: a child validating a tiny manifest (the least of three)
    t = cpu()
    load_manifest_bounded(sys.argv[2], policy)
    fixed.append(cpu() - t)
t = cpu()
try:
    load_manifest_bounded(sys.argv[1], policy)
    what = "valid"
except ManifestError as exc:
    what = str(exc.problems[0])[:100]
seconds = max(cpu() - t - min(fixed), 0.0)
# This process's VmHWM (ru_maxrss would carry the parent's over exec) and the children's peak.
hwm = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:"))
rss = max(hwm, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
print(json.dumps({"seconds": seconds, "rss": rss * 1024, "what": what}))
"""


def _good() -> dict:
    import yaml

    doc = yaml.safe_load(GOOD.read_text())
    doc["run"]["deadline"] = "2026-12-06T18:00:00Z"
    return doc


def _json_with_parameters(params_json: str) -> str:
    doc = _good()
    doc["cases"][0]["parameters"] = "@PARAMS@"
    return json.dumps(doc, separators=(",", ":")).replace('"@PARAMS@"', params_json)


def _yaml_with_parameters(params_flow: str) -> str:
    return GOOD.read_text().replace("{ego_speed_kph: 114, weather: overcast}", params_flow, 1)


def json_depth_map(n: int) -> str:
    return _json_with_parameters('{"a":' * n + "1" + "}" * n)


def json_depth_list(n: int) -> str:
    return _json_with_parameters('{"a":' + "[" * n + "]" * n + "}")


def yaml_depth_map(n: int) -> str:
    return _yaml_with_parameters("{a: " * n + "1" + "}" * n)


def yaml_depth_list(n: int) -> str:
    return _yaml_with_parameters("{a: " + "[" * n + "]" * n + "}")


def json_width_map(n: int) -> str:
    return _json_with_parameters("{" + ",".join(f'"k{i}":{i}' for i in range(n)) + "}")


def json_width_list(n: int) -> str:
    return _json_with_parameters('{"a":[' + ",".join("0" for _ in range(n)) + "]}")


def yaml_width_list(n: int) -> str:
    return _yaml_with_parameters("{a: [" + ", ".join("0" for _ in range(n)) + "]}")


def json_tags_list(n: int) -> str:
    """A typed list (tags: strings) of n items of the wrong type: one error per item."""
    doc = _good()
    doc["cases"][0]["tags"] = "@TAGS@"
    return json.dumps(doc, separators=(",", ":")).replace(
        '"@TAGS@"', "[" + ",".join("0" for _ in range(n)) + "]"
    )


def long_string(n: int) -> str:
    return _json_with_parameters(json.dumps({"s": "x" * n}))


def long_key(n: int) -> str:
    return _json_with_parameters(json.dumps({"k" * n: 1}))


def many_cases(n: int) -> str:
    doc = _good()
    case = doc["cases"][0]
    doc["cases"] = [{**case, "id": f"case-{i:07d}"} for i in range(n)]
    return json.dumps(doc, separators=(",", ":"))


def yaml_aliases(n: int) -> str:
    """n aliases of one anchored mapping of 10 keys in a case's parameters (within the expansion bound
    up to 10^5 aliases, refused by it beyond)."""
    anchor = "&p {" + ", ".join(f"k{i}: {i}" for i in range(10)) + "}"
    return _yaml_with_parameters("{a: " + anchor + ", b: [" + ", ".join("*p" for _ in range(n)) + "]}")


def json_duplicate_keys(n: int) -> str:
    return _json_with_parameters("{" + ",".join('"k":1' for _ in range(n)) + "}")


def yaml_duplicate_keys(n: int) -> str:
    return _yaml_with_parameters("{" + ", ".join("k: 1" for _ in range(n)) + "}")


def huge_numbers(n: int) -> str:
    """n numbers of 4,000 digits (just under Python's int conversion limit) and one of 5,000."""
    big = "9" * 4000
    return _json_with_parameters('{"a":[' + ",".join(big for _ in range(n)) + "," + "9" * 5000 + "]}")


#: shape -> (generator, sizes of the full run, sizes of --quick)
SHAPES: dict[str, tuple[Callable[[int], str], list[int], list[int]]] = {
    "json_depth_map": (json_depth_map, [2_000, 20_000, 100_000, 400_000], [2_000, 20_000, 100_000]),
    "json_depth_list": (json_depth_list, [2_000, 20_000, 100_000, 400_000], [2_000, 20_000, 100_000]),
    "yaml_depth_map": (yaml_depth_map, [2_000, 20_000, 100_000, 400_000], [2_000, 20_000, 100_000]),
    "yaml_depth_list": (yaml_depth_list, [2_000, 20_000, 100_000, 400_000], [2_000, 20_000, 100_000]),
    "json_width_map": (json_width_map, [10_000, 100_000, 1_000_000], [10_000, 100_000, 300_000]),
    "json_width_list": (json_width_list, [10_000, 100_000, 1_000_000], [10_000, 100_000, 300_000]),
    "yaml_width_list": (yaml_width_list, [10_000, 100_000, 1_000_000], [10_000, 100_000, 300_000]),
    "json_tags_list": (json_tags_list, [10_000, 100_000, 1_000_000], [10_000, 100_000, 300_000]),
    "long_string": (long_string, [10**5, 10**6, 10**7, 6 * 10**7], [10**5, 10**6, 10**7]),
    "long_key": (long_key, [10**5, 10**6, 10**7, 6 * 10**7], [10**5, 10**6, 10**7]),
    "many_cases": (many_cases, [2_000, 20_000, 100_001, 200_001], [2_000, 20_000, 100_001]),
    "yaml_aliases": (yaml_aliases, [10_000, 100_000, 1_000_000], [10_000, 100_000, 300_000]),
    "json_duplicate_keys": (json_duplicate_keys, [10_000, 100_000, 1_000_000], [10_000, 100_000, 300_000]),
    "yaml_duplicate_keys": (yaml_duplicate_keys, [10_000, 100_000, 1_000_000], [10_000, 100_000, 300_000]),
    "huge_numbers": (huge_numbers, [10, 100, 1_000, 10_000], [10, 100, 1_000]),
}


def _limit() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (CEILING, CEILING))


def measure(path: Path) -> tuple[float, int, str]:
    """(seconds of the load, peak RSS in bytes, what it said) of validating ``path`` in a fresh process."""
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, str(path), str(GOOD)],
        capture_output=True,
        text=True,
        preexec_fn=_limit,
        check=False,
    )
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["?"])[-1]
        return math.nan, CEILING, f"died ({proc.returncode}): {last[:120]}"
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    return result["seconds"], result["rss"], result["what"]


def slope(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of log(y) against log(x)."""
    lx, ly = [math.log(x) for x in xs], [math.log(y) for y in ys]
    mx, my = sum(lx) / len(lx), sum(ly) / len(ly)
    den = sum((x - mx) ** 2 for x in lx)
    return sum((x - mx) * (y - my) for x, y in zip(lx, ly, strict=True)) / den if den else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes (about a minute)")
    parser.add_argument("--shape", action="append", help="only these shapes")
    parser.add_argument("--repeats", type=int, default=3, help="measurements of each size")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT / "provider"))
    from avsim.manifest.bounded import memory_bound

    worst_ratio, worst_exponent = 0.0, 0.0
    with tempfile.TemporaryDirectory(prefix="avsim-input-bounds-") as tmp:
        for shape, (make, full, quick) in SHAPES.items():
            if args.shape and shape not in args.shape:
                continue
            sizes, times = [], []
            for n in quick if args.quick else full:
                suffix = ".yaml" if shape.startswith("yaml") else ".json"
                path = Path(tmp) / f"{shape}_{n}{suffix}"
                path.write_text(make(n))
                size = path.stat().st_size
                t0 = time.perf_counter()
                # Each size --repeats times: the least CPU time (cache misses from other work only add)
                # and the largest RSS.
                runs = [measure(path) for _ in range(max(1, args.repeats))]
                seconds = min(r[0] for r in runs)
                rss = max(r[1] for r in runs)
                what = runs[0][2]
                path.unlink()
                ratio = rss / memory_bound(size, suffix[1:]) if not math.isnan(seconds) else 99.0
                worst_ratio = max(worst_ratio, ratio)
                print(
                    f"{shape:20s} n={n:<9d} bytes={size:<10d} cpu={seconds:7.3f}s rss={rss / 2**20:7.1f}MiB "
                    f"ratio={ratio:.3f} wall={time.perf_counter() - t0:5.1f}s  {what}",
                    flush=True,
                )
                if not math.isnan(seconds):
                    sizes.append(size)
                    times.append(max(seconds, 1e-4))
            # The exponent over the sizes whose load takes long enough to time (>= 0.2 s of CPU beyond
            # the fixed cost of a child).
            timed = [(s, t) for s, t in zip(sizes, times, strict=True) if t >= 0.2]
            if len(timed) >= 2:
                e = slope([s for s, _ in timed], [t for _, t in timed])
                worst_exponent = max(worst_exponent, e)
                print(f"{shape:20s} time exponent {e:.2f}", flush=True)
    print(f"input_bounds: worst_memory_ratio={worst_ratio:.2f} worst_time_exponent={worst_exponent:.2f}")


if __name__ == "__main__":
    main()
