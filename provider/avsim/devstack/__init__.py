"""For laptops and CI, not for production: the demo, the local stack runner and the fake simulator.

:mod:`.demo` (``avsim demo``), :mod:`.stack` and :mod:`.procwatch` (Airflow's components as local
processes that all stop), :mod:`.fakesim` (``avsim-fakesim``, a deterministic stand-in for the
simulator). No runtime module imports this package, and this ``__init__`` imports nothing, so
``avsim-fakesim`` starts with the standard library only. docs/design.md, "The local stack and the fake
simulator".
"""
