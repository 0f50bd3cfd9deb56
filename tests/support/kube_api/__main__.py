"""``python -m tests.support.kube_api --port N --workdir DIR``: run the fake API server by hand.

Prints the URL and the kubeconfig path, then serves until SIGINT/SIGTERM. Faults can be
loaded at start (``--faults FILE``) or posted later to ``/_fake/faults``.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path

from .server import FakeKubeAPI


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.support.kube_api", description=__doc__)
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (0: any free port)")
    parser.add_argument(
        "--workdir", type=Path, required=True, help="pod working dirs and the kubeconfig go here"
    )
    parser.add_argument("--token", default=None, help="bearer token (default: random)")
    parser.add_argument("--namespace", default="default", help="the kubeconfig context's namespace")
    parser.add_argument("--faults", type=Path, default=None, help="JSON file of fault rules to load")
    parser.add_argument(
        "--start-delay", type=float, default=0.05, help="seconds a pod stays ContainerCreating"
    )
    parser.add_argument("--history-size", type=int, default=10_000, help="watch events kept for resuming")
    args = parser.parse_args(argv)

    api = FakeKubeAPI(
        port=args.port,
        token=args.token,
        workdir=args.workdir,
        start_delay=args.start_delay,
        history_size=args.history_size,
    )
    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    with api:
        if args.faults is not None:
            api.load_faults(args.faults)
        kubeconfig = api.write_kubeconfig(args.workdir / "kubeconfig", namespace=args.namespace)
        print(api.url, flush=True)
        print(f"kubeconfig: {kubeconfig}", file=sys.stderr, flush=True)
        done.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
