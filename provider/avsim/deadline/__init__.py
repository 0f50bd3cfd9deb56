"""The weekly run's deadline: an Airflow Deadline Alert, and a tracker that re-estimates the finish and acts.

- :func:`avsim.deadline.alert.deadline_alert` - the weekly DAG's ``deadline=`` (reference:
  :class:`avsim.deadline.reference.AvsimRunDeadline`, registered by the avsim plugin);
- :func:`avsim.deadline.sensor.deadline_tracker` - the tracker task of the weekly DAG
  (:class:`~avsim.deadline.sensor.DeadlineTrackerSensor`, trigger
  :class:`~avsim.deadline.trigger.DeadlineTrackerTrigger`);
- :mod:`avsim.deadline.estimate` - the estimate itself, pure functions;
- :mod:`avsim.deadline.actions` - raising the GPU pool and the EKS node group, within bounds.

Submodules are imported where used, so importing this package imports no Airflow.
"""
