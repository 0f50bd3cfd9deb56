"""Registers the avsim Airflow plugin (reports app, UI links); everything it holds lives in avsim."""

from avsim.plugin import AvsimPlugin

__all__ = ["AvsimPlugin"]
