"""The weekly run's deadline: an Airflow Deadline Alert, and a tracker that re-estimates the finish and acts.

:mod:`.alert` (the weekly DAG's ``deadline=``, with :mod:`.reference`), :mod:`.sensor` and :mod:`.trigger`
(the tracker), :mod:`.estimate` (the estimate, pure functions), :mod:`.actions` (raising the GPU pool and
the EKS node group, within bounds). Submodules are imported where used, so importing this package
imports no Airflow. docs/design.md, "The deadline".
"""
