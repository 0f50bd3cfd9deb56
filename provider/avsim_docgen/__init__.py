"""Documentation generators, for a source checkout only: not part of the ``airflow-provider-avsim`` wheel.

:mod:`avsim_docgen.manifest_reference` renders ``docs/manifest.md`` from the manifest's models
(``avsim manifest reference -o docs/manifest.md`` from a checkout; a unit test keeps the committed
page equal to what it renders). The wheel packages ``provider/avsim`` only.
"""
