"""Moved to :mod:`avsim.links`; kept until the phase operators import it from there."""

from avsim.links import PHASE_LINKS, AvsimArtifactsLink  # noqa: F401
