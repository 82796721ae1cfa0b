"""Prepared programs keyed by catalog cost key: jitted, lowerable and compiled ahead of time.

    programs = build_programs(model_config, param_shapes(model_config), engine, engine.catalog())
    programs.compile_all()                      # AOT: lower + compile every program
    state = programs.init_state()
    prefill = programs[key]                     # key: a catalog CostKey (or use .find(...))
    state, out = prefill(params, state, prefill.pack(slot=0, tokens=..., page_table=...))

Over a tensor-parallel mesh (`EngineConfig.tensor_parallel > 1`) the programs are lowered with the
shardings of `placement.py`; `programs.place_params(params)` lays the weights out to match and
`init_state()` allocates the state sharded. On one device both are the plain forms.

The state argument is donated: the caller must use the returned state (the old buffers are
deleted after the call). `Program.pack` forwards to `packing.py` with the program's shape.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import jax

from helios_jax.catalog import Catalog, CostKey, GraphDescriptor, GraphKind
from helios_jax.engine_config import EngineConfig
from helios_jax.model import ModelConfig
from helios_jax.model.sharding import check_tensor_parallel, place_params, tensor_parallel_mesh
from helios_jax.programs import packing, row_packing
from helios_jax.programs.builders import BUILDERS
from helios_jax.programs.impls import DEFAULT_IMPL, Impl
from helios_jax.programs.inputs import ProgramShape, input_spec
from helios_jax.programs.placement import init_sharded_state, jit_program
from helios_jax.programs.state import DeviceState, init_state, state_shapes

_PACKERS: dict[GraphKind, Callable[..., Any]] = {
    GraphKind.PREFILL: packing.pack_prefill,
    GraphKind.SCORED_PREFILL: packing.pack_prefill,
    GraphKind.DECODE: packing.pack_decode,
    GraphKind.SPECULATIVE: packing.pack_speculative,
    GraphKind.MIXED: packing.pack_mixed,
    GraphKind.INITIALIZE: row_packing.pack_initialize,
    GraphKind.SNAPSHOT: row_packing.pack_snapshot,
    GraphKind.RESTORE: row_packing.pack_restore,
}


@dataclasses.dataclass
class Program:
    """One prepared program: descriptor, static shape, jitted function and its compiled form."""

    descriptor: GraphDescriptor
    shape: ProgramShape
    fn: Any  # jax.jit(pure_fn, donate_argnums=1): (params, state, inputs) -> (state, outputs)
    input_spec: Any  # the inputs pytree as ShapeDtypeStructs
    compiled: Any = None  # jax.stages.Compiled after compile()
    compile_seconds: float | None = None

    @property
    def key(self) -> CostKey:
        return self.descriptor.key

    @property
    def name(self) -> str:
        return self.descriptor.name

    @property
    def confidence_width(self) -> int:
        """Columns of the sidecar this program writes: its actual D."""
        return self.shape.depth if self.shape.kind in (GraphKind.SPECULATIVE, GraphKind.MIXED) else 0

    def lower(self, params_spec, state_spec):
        return self.fn.lower(params_spec, state_spec, self.input_spec)

    def compile(self, params_spec, state_spec):
        start = time.perf_counter()
        self.compiled = self.lower(params_spec, state_spec).compile()
        self.compile_seconds = time.perf_counter() - start
        return self.compiled

    def pack(self, **host_data):
        """Host data -> this program's inputs (see `packing.py` for each kind's arguments)."""
        packer = packing.pack_multistep if self.shape.steps > 1 else _PACKERS[self.shape.kind]
        return packer(self.shape, **host_data)

    def __call__(self, params, state: DeviceState, inputs):
        run = self.compiled if self.compiled is not None else self.fn
        return run(params, state, inputs)


@dataclasses.dataclass
class ProgramSet(Mapping):
    """Every program of a catalog, keyed by CostKey."""

    model_config: ModelConfig
    engine_config: EngineConfig
    catalog: Catalog
    params_spec: Any
    programs: dict[CostKey, Program]
    impl: Impl = DEFAULT_IMPL

    def __getitem__(self, key: CostKey) -> Program:
        return self.programs[key]

    def __iter__(self) -> Iterator[CostKey]:
        return iter(self.programs)

    def __len__(self) -> int:
        return len(self.programs)

    @property
    def state_spec(self) -> DeviceState:
        return state_shapes(self.model_config, self.engine_config)

    @property
    def mesh(self) -> jax.sharding.Mesh | None:
        """The tensor-parallel mesh; None on one device."""
        return self.impl.mesh

    def init_state(self, *, fill: float = 0.0) -> DeviceState:
        if self.mesh is None:
            return init_state(self.model_config, self.engine_config, fill=fill)
        return init_sharded_state(
            self.mesh, lambda: init_state(self.model_config, self.engine_config, fill=fill), self.state_spec
        )

    def place_params(self, params):
        """The parameters laid out as the programs were lowered (unchanged on one device)."""
        return params if self.mesh is None else place_params(self.mesh, params)

    def find(self, kind: GraphKind | str, **extents) -> Program:
        """The one program of `kind` whose descriptor matches `extents` (descriptor field names)."""
        kind = GraphKind(kind)
        found = [
            p
            for p in self.programs.values()
            if p.descriptor.kind is kind and all(getattr(p.descriptor, f) == v for f, v in extents.items())
        ]
        if len(found) != 1:
            raise KeyError(f"{len(found)} programs of kind {kind.value} match {extents}")
        return found[0]

    def compile_all(
        self, progress: Callable[[int, int, Program], None] | None = None, *, workers: int | None = None
    ) -> None:
        """Lowers and compiles every program ahead of time on `workers` threads (None:
        :func:`compile_workers`); `progress` hears of each program as it finishes, in catalog
        order with one worker. Tracing holds the interpreter lock, XLA's compilation does not:
        on a GPU a program's compilation is seconds of autotuning and PTX assembly (about 6 s for
        each of the default model's programs on an H200, docs/benchmarks-gpu.md), which threads
        overlap. The compiled programs are the same whatever the order."""
        state_spec = self.state_spec
        programs = list(self.programs.values())
        workers = compile_workers() if workers is None else max(1, workers)
        if workers == 1:
            for i, program in enumerate(programs):
                program.compile(self.params_spec, state_spec)
                if progress is not None:
                    progress(i + 1, len(programs), program)
            return
        with concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="compile") as pool:
            running = [pool.submit(p.compile, self.params_spec, state_spec) for p in programs]
            owner = dict(zip(running, programs))
            try:
                for i, done in enumerate(concurrent.futures.as_completed(running)):
                    done.result()  # a failed compilation raises here
                    if progress is not None:
                        progress(i + 1, len(programs), owner[done])
            except BaseException:
                pool.shutdown(cancel_futures=True)  # the programs not yet started never start
                raise


def compile_workers() -> int:
    """Threads that compile a catalog: `HELIOS_COMPILE_WORKERS` if set; else on a GPU one per
    core up to eight, and one on a CPU (two threads took 0.91 of one thread's time on a
    two-core machine, docs/programs.md: too little to give up the serial order for)."""
    configured = os.environ.get("HELIOS_COMPILE_WORKERS")
    if configured:
        return max(1, int(configured))
    if jax.default_backend() == "gpu":
        return max(1, min(8, os.cpu_count() or 1))
    return 1


def build_program(
    model_config: ModelConfig,
    engine_config: EngineConfig,
    descriptor: GraphDescriptor,
    impl: Impl = DEFAULT_IMPL,
    params_spec=None,
) -> Program:
    """One program; over a mesh (`impl.mesh`) `params_spec` names the parameter tree to shard."""
    if impl.mesh is not None and params_spec is None:
        raise ValueError("a program over a tensor-parallel mesh needs params_spec (the tree to shard)")
    shape = ProgramShape.of(descriptor, engine_config, vocab=model_config.vocab_size)
    fn = BUILDERS[descriptor.kind](model_config, shape, impl)
    state_spec = None if impl.mesh is None else state_shapes(model_config, engine_config)
    jitted = jit_program(fn, impl.mesh, params_spec, state_spec)
    return Program(descriptor=descriptor, shape=shape, fn=jitted, input_spec=input_spec(shape))


def build_programs(
    model_config: ModelConfig,
    params_shapes,
    engine_config: EngineConfig,
    catalog: Catalog,
    *,
    impl: Impl = DEFAULT_IMPL,
) -> ProgramSet:
    """One program per catalog descriptor (vision graphs have no builder and are refused). Over a
    model without an MTP head, the speculative and mixed programs verify copy proposals only.

    Args:
      model_config: the model (its dtype must equal the engine's).
      params_shapes: the parameter tree (arrays or ShapeDtypeStructs) used to lower.
      engine_config: the engine the catalog was planned for.
      catalog: the graphs to build; its request_slots must equal the engine's.
      impl: kernel choices; its mesh is set here from `engine_config.tensor_parallel`.

    Raises:
      ValueError: mismatched dtype or slots, or a tensor-parallel degree that does not divide the
        model (`model.sharding.check_tensor_parallel`) or exceeds the devices.
    """
    if model_config.dtype != engine_config.dtype:
        raise ValueError(f"model dtype {model_config.dtype} differs from the engine's {engine_config.dtype}")
    if catalog.request_slots != engine_config.request_slots:
        raise ValueError(
            f"catalog request_slots {catalog.request_slots} differs from the engine's "
            f"{engine_config.request_slots}"
        )
    params_spec = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), params_shapes)
    degree = engine_config.tensor_parallel
    if degree > 1:
        check_tensor_parallel(model_config, degree, devices=jax.device_count())
        impl = dataclasses.replace(impl, mesh=tensor_parallel_mesh(degree))
    programs = {
        g.key: build_program(model_config, engine_config, g, impl, params_spec) for g in catalog.graphs
    }
    return ProgramSet(model_config, engine_config, catalog, params_spec, programs, impl)
