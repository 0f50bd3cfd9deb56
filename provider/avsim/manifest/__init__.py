"""The weekly manifest: models, validation, loading, the run's immutable snapshot, a sample.

The submodules are imported on use (``from avsim.manifest.loader import load_manifest``) so that
importing the package stays cheap.
"""

from __future__ import annotations
