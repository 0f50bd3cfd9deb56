"""For laptops and CI, not for production: the demo, the local stack runner and the fake simulator.

- :mod:`avsim.devstack.demo`: ``avsim demo``, a whole weekly run on this machine.
- :mod:`avsim.devstack.stack` and :mod:`avsim.devstack.procwatch`: start Airflow's components as
  local processes (the demo, the integration tests, the benches) and make sure they all stop.
- :mod:`avsim.devstack.fakesim`: ``avsim-fakesim``, a deterministic stand-in for the simulator that
  follows the phase contract (the sample manifest's phases run it).

No module of the runtime package imports this one (the ``avsim demo`` command loads it when it is
run). This ``__init__`` imports nothing, so ``avsim-fakesim`` starts with the standard library only.
"""
