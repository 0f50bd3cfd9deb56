"""The Kubernetes settings of a deployment with spot, on-demand and CPU node classes and the three
priority classes, as the pod tests build their phases with."""

from __future__ import annotations

from avsim.phases.contract import NODE_CPU, NODE_ON_DEMAND, NODE_SPOT
from avsim.settings import KubernetesSettings

KUBE = KubernetesSettings(
    run_as_user=4242,
    node_classes={
        NODE_SPOT: {
            "node_selector": {"avsim.io/capacity": "spot", "nvidia.com/gpu.present": "true"},
            "tolerations": [
                {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                {"key": "spot", "operator": "Equal", "value": "true", "effect": "NoSchedule"},
            ],
        },
        NODE_ON_DEMAND: {
            "node_selector": {"avsim.io/capacity": "on-demand"},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        },
        NODE_CPU: {"node_selector": {"avsim.io/pool": "cpu"}},
    },
    priority_classes={"canary": "avsim-canary", "weekly": "avsim-weekly", "adhoc": "avsim-adhoc"},
)
