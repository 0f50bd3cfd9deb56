"""The avsim pages in Airflow's light or dark colour mode, whichever the user's Airflow UI shows.

The Airflow 3.3 UI keeps the mode on its ``<html>`` element's class (``light`` or ``dark``) and the
user's choice in ``localStorage["theme"]`` (``light``, ``dark`` or ``system``). The pages open in the
UI's tabs as same-origin frames: :data:`SCRIPT` follows the parent's class (and its changes), else
the stored choice, else the system's ``prefers-color-scheme``; with scripts off, the system's.
"""

from __future__ import annotations

#: Colour roles -> (light, dark), close to the Airflow UI's neutral palette.
PALETTE: dict[str, tuple[str, str]] = {
    "bg": ("#ffffff", "#09090b"),
    "fg": ("#18181b", "#fafafa"),
    "muted": ("#52525b", "#a1a1aa"),
    "panel": ("#ffffff", "#18181b"),
    "head": ("#f4f4f5", "#27272a"),
    "border": ("#e4e4e7", "#3f3f46"),
    "link": ("#0369a1", "#7dd3fc"),
    "warn": ("#c0262d", "#f87171"),
    "ok": ("#1c7c3c", "#4ade80"),
    "shadow": ("#0000001f", "#00000099"),
}


def _vars(index: int) -> str:
    return ";".join(f"--{role}:{pair[index]}" for role, pair in PALETTE.items())


#: The palette as CSS variables: light by default, dark when the script says so (or, with scripts
#: off, when the system prefers it).
CSS = (
    f":root{{{_vars(0)};color-scheme:light}}\n"
    f"@media (prefers-color-scheme: dark){{:root:not(.light){{{_vars(1)};color-scheme:dark}}}}\n"
    f":root.dark{{{_vars(1)};color-scheme:dark}}\n"
)

SCRIPT = r"""
(function () {
  const root = document.documentElement, media = window.matchMedia("(prefers-color-scheme: dark)");
  function parentMode() {
    try {
      if (window.parent === window) return null;
      const c = window.parent.document.documentElement.classList;
      return c.contains("dark") ? "dark" : c.contains("light") ? "light" : null;
    } catch (e) { return null; }
  }
  function storedMode() {
    try { const t = window.localStorage.getItem("theme"); return t === "dark" || t === "light" ? t : null; }
    catch (e) { return null; }
  }
  function apply() {
    const mode = parentMode() || storedMode() || (media.matches ? "dark" : "light");
    root.classList.toggle("dark", mode === "dark");
    root.classList.toggle("light", mode === "light");
    root.dataset.theme = mode;
  }
  apply();
  media.addEventListener("change", apply);
  window.addEventListener("storage", (e) => { if (e.key === "theme") apply(); });
  try {
    if (window.parent !== window) {
      new MutationObserver(apply).observe(window.parent.document.documentElement, {attributes: true, attributeFilter: ["class"]});
    }
  } catch (e) { /* not the Airflow UI's frame */ }
})();
"""
