"""The few jax APIs the kernels use that moved or may move within the supported jax range.

pyproject.toml allows jax >= 0.10.2, < 0.12 (the device machines bring their own 0.11.x with
CUDA 13). Each name here is looked up once, with a fallback, so a rename inside that range
degrades to the XLA path or a slower check rather than an import error:

- `is_tracer`: `jax.core.Tracer` (jax.core is being thinned out since 0.8); the fallback
  tries a concrete conversion, which raises for tracers.
- `pltriton`: `jax.experimental.pallas.triton`, deprecated in jax 0.11 (Mosaic GPU is the
  successor) and to be removed later; None when absent, and then the Pallas path is not
  offered on a GPU (`TRITON_PROBLEM` says why).
- `triton_compiler_params`: `pltriton.CompilerParams` (named `TritonCompilerParams` before
  jax 0.7).
- `triton_dot`: `pltriton.dot`, else `lax.dot_general` with float32 results (what it lowers to).
"""

from __future__ import annotations

import jax
import numpy as np
from jax import lax

try:
    from jax.experimental.pallas import triton as pltriton
except ImportError:  # a jax without the Pallas Triton backend
    pltriton = None

TRITON_PROBLEM = (
    None if pltriton is not None else f"jax {jax.__version__} has no Pallas Triton backend (pallas.triton)"
)

_TRACER = getattr(getattr(jax, "core", None), "Tracer", None)


def is_tracer(x) -> bool:
    """Whether `x` is traced (inside a caller's jit), i.e. its values cannot be read here."""
    if _TRACER is not None:
        return isinstance(x, _TRACER)
    try:
        np.asarray(x)
    except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError):
        return True
    return False


def triton_compiler_params(**kwargs):
    params = getattr(pltriton, "CompilerParams", None) or pltriton.TritonCompilerParams
    return params(**kwargs)


def triton_dot(a, b, *, trans_b: bool = False, precision=None):
    """a @ b (b transposed with trans_b), float32 results."""
    if pltriton is not None and hasattr(pltriton, "dot"):
        return pltriton.dot(a, b, trans_b=trans_b, precision=precision)
    contract_b = 1 if trans_b else 0
    return lax.dot_general(
        a, b, (((1,), (contract_b,)), ((), ())), precision=precision, preferred_element_type=np.float32
    )
