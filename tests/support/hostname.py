"""``[core] hostname_callable`` of the distributed stack's components: each names itself as its
container would be named (``AVSIM_COMPONENT_HOSTNAME``), although all of them run on this machine,
so a task instance's ``hostname`` says which worker ran it."""

from __future__ import annotations

import os


def component() -> str:
    return os.environ["AVSIM_COMPONENT_HOSTNAME"]
