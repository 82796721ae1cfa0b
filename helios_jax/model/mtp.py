"""Deprecated: the MTP proposal loop that lived here has moved.

The one production draft loop is `helios_jax.programs.proposals.draft_proposals` (per-lane
sampling settings, copy lanes, draft confidence). The loop this module held, `propose`, is now the
independent oracle that tests compare the production loop against:
`helios_jax.reference.mtp.paged_proposals` (same arguments, same results), returning
`helios_jax.reference.mtp.Proposals`. `propose` and `Proposals` stay importable from here and from
`helios_jax.model` with a DeprecationWarning.
"""

from __future__ import annotations

import importlib
import warnings

MOVED = {"propose": "paged_proposals", "Proposals": "Proposals"}  # old name -> helios_jax.reference.mtp


def moved(name: str, *, stacklevel: int) -> object:
    """The new home of a moved name, with a DeprecationWarning at the caller `stacklevel` up."""
    new = MOVED[name]
    warnings.warn(
        f"helios_jax.model.{name} moved to helios_jax.reference.mtp.{new} (a test oracle); the production "
        "draft loop is helios_jax.programs.proposals.draft_proposals",
        DeprecationWarning,
        stacklevel=stacklevel,
    )
    # Imported here, not at the top: helios_jax.reference.mtp itself imports helios_jax.model.
    return getattr(importlib.import_module("helios_jax.reference.mtp"), new)


def __getattr__(name: str) -> object:
    if name in MOVED:
        return moved(name, stacklevel=3)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
