"""The committing trigger's old classpath: deferred tasks of a running deployment reference it."""

from avsim.triggers.pass_commit import PassCommitTrigger  # the triggerer stores classpaths in its DB

__all__ = ["PassCommitTrigger"]
