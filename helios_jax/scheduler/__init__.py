"""The host scheduler: pure Python and numpy, no jax.

Modules keep the names of the spec's Rust modules: ``policy`` (candidates and selection),
``utility`` (value arithmetic and cohort selection), ``service`` (service prices), ``cost``
(duration estimates), ``speculation`` (acceptance estimates), ``rounds`` (speculative round
candidates and confidence forecasts); ``view`` holds the plain data exchanged with the selector
and ``config`` the policy preferences. The lifecycle object ``core.Scheduler`` delegates pricing
views to ``pricing`` (pure functions), resident requests and lane effects to ``residents``,
captures and image windows to ``captures`` (over the ``checkpoints`` rows), commit and completion
checks to ``plan``, freezing a plan, recording a frame and the window's rules to ``frames``,
pooled estimates to ``learning`` and its counters to ``stats``; ``reads`` names what callers
read of its state.
"""
