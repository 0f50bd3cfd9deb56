"""A fake Kubernetes API server for tests: pods run as local processes, faults are scripted.

``FakeKubeAPI`` serves, over plain HTTP on 127.0.0.1, what the ``kubernetes`` and
``kubernetes_asyncio`` clients and the cncf.kubernetes provider call: discovery, core/v1 pods
(with ``log``, ``status`` and ``eviction``), core/v1 events and coordination.k8s.io/v1 leases,
with list/watch semantics (resourceVersion, selectors, bookmarks, 410 Gone) and ``Status``
error bodies shaped like the real API server's. See ``server.py`` for the public API,
``faults.py`` for the fault kinds and ``kubelet.py`` for what is and is not modelled.
"""

from __future__ import annotations

from .faults import FAULT_KINDS, FaultRule
from .objects import ApiError
from .server import Call, FakeKubeAPI

__all__ = ["FAULT_KINDS", "ApiError", "Call", "FakeKubeAPI", "FaultRule"]
