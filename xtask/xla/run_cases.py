"""Runs Kiln's exported StableHLO modules on XLA's CPU client and compares
them with Kiln's own results (`cargo xtask xla` runs it; see README.md,
"Beyond one machine").

Each case is a folder under the directory given on the command line, as
`kiln_tests::xla::write_case` writes it: `module.mlir`, `case.json` (its
runs: inputs and Kiln's outputs as raw little-endian files, the mesh and
shardings, a training loop's feedback and losses, the collectives XLA must
insert) and the data files.

It uses jax's private compile entry points (pinned to jax 0.10.2 by the
xtask): `get_backend().compile_and_load`, `compiler.get_compile_options`,
`execute_sharded`. Set XLA_FLAGS=--xla_force_host_platform_device_count=8
before it starts (the xtask does) for the sharded cases.
"""

import json
import os
import re
import sys
import time

import jax
import jax.extend
import ml_dtypes
import numpy as np
from jax._src import compiler
from jax._src.interpreters import mlir
from jax._src.lib import xla_client
from jax._src.lib.mlir import ir
from jax.sharding import Mesh, NamedSharding, PartitionSpec

DTYPES = {
    "f32": np.float32,
    "f16": np.float16,
    "bf16": ml_dtypes.bfloat16,
    "i32": np.int32,
    "u32": np.uint32,
    "bool": np.bool_,
    "u8": np.uint8,
}

# (atol, rtol) per dtype: kiln_tests::conformance::tolerance.
TOLERANCE = {"f32": (1e-5, 1e-4), "f16": (2e-3, 4e-3), "bf16": (1.6e-2, 1.6e-2)}

# Below these a result may be flushed to zero.
SMALLEST_NORMAL = {"f32": 2.0**-126, "bf16": 2.0**-126, "f16": 2.0**-14}

MLIR_TYPES = {
    "f32": "f32", "f16": "f16", "bf16": "bf16", "i32": "i32",
    "u32": "ui32", "bool": "i1", "u8": "ui8",
}


def load(folder, entry):
    raw = np.fromfile(os.path.join(folder, entry["file"]), dtype=DTYPES[entry["dtype"]])
    return raw.reshape(entry["shape"])


def tensor_type(entry):
    dims = "".join(f"{d}x" for d in entry["shape"])
    return f"tensor<{dims}{MLIR_TYPES[entry['dtype']]}>"


def specialize(text, run):
    """A module whose `@main` takes and returns the static types of `run`:
    the exported (shapeless) `@main` renamed and called through
    `stablehlo.convert`s, then refined by StableHLO's shape refinement, as
    `jax.export` calls a shape-polymorphic module."""
    signature = re.search(r"func\.func public @main\((.*)\) -> \((.*)\) \{", text)
    dyn_args = re.findall(r"%arg\d+: (tensor<[^>]*>)", signature.group(1))
    dyn_results = re.findall(r"(tensor<[^>]*>) \{", signature.group(2))
    text = text.replace("func.func public @main(", "func.func private @kiln_main(", 1)
    static_args = [tensor_type(e) for e in run["inputs"]]
    static_results = [tensor_type(e) for e in run["outputs"]]
    lines = []
    params = ", ".join(f"%a{i}: {t}" for i, t in enumerate(static_args))
    lines.append(f"  func.func public @main({params}) -> ({', '.join(static_results)}) {{")
    for i, (s, d) in enumerate(zip(static_args, dyn_args)):
        lines.append(f"    %c{i} = stablehlo.convert %a{i} : ({s}) -> {d}")
    operands = ", ".join(f"%c{i}" for i in range(len(static_args)))
    lines.append(
        f"    %r:{len(dyn_results)} = func.call @kiln_main({operands}) : "
        f"({', '.join(dyn_args)}) -> ({', '.join(dyn_results)})")
    for i, (s, d) in enumerate(zip(static_results, dyn_results)):
        lines.append(f"    %o{i} = stablehlo.convert %r#{i} : ({d}) -> {s}")
    outs = ", ".join(f"%o{i}" for i in range(len(static_results)))
    lines.append(f"    return {outs} : {', '.join(static_results)}")
    lines.append("  }")
    end = text.rstrip().rfind("}")
    text = text[:end] + "\n".join(lines) + "\n}\n"
    with mlir.make_ir_context():
        module = ir.Module.parse(text)
        return str(mlir.refine_polymorphic_shapes(module))


def compile_module(text, devices):
    backend = jax.extend.backend.get_backend()
    options = compiler.get_compile_options(
        num_replicas=1,
        num_partitions=len(devices),
        device_assignment=np.array(devices).reshape(1, len(devices)),
    )
    return backend.compile_and_load(text, xla_client.DeviceList(tuple(devices)), options)


# (atol, rtol) of a training loop's parameters after its steps: Adam divides
# each update by the gradient's root mean square, so a gradient near zero
# that rounds to the other sign moves its parameter by up to the learning
# rate per step. The losses are held to TOLERANCE.
AFTER_STEPS = (1e-3, 1e-3)


def compare(name, got, want, dtype, rule, tolerance=None):
    got = np.asarray(got)
    if got.shape != want.shape:
        return f"{name}: shape {got.shape}, Kiln's {want.shape}"
    g = got.astype(np.float64)
    w = want.astype(np.float64)
    if rule == "exact" or dtype not in TOLERANCE:
        same = (g == w) & (np.signbit(g) == np.signbit(w))
        same |= np.isnan(g) & np.isnan(w)
    else:
        atol, rtol = tolerance or TOLERANCE[dtype]
        same = np.isclose(g, w, atol=atol, rtol=rtol, equal_nan=True)
    if dtype in SMALLEST_NORMAL:
        # XLA's CPU client flushes subnormals to zero, as WGSL may
        # (kiln_tests::conformance::may_flush).
        same |= (g == 0) & (w != 0) & (np.abs(w) < SMALLEST_NORMAL[dtype])
    if not same.all():
        at = np.argwhere(~same)[0]
        return f"{name}: element {tuple(at)} is {g[tuple(at)]!r}, Kiln's {w[tuple(at)]!r}"
    return None


def run_case(folder):
    case = json.load(open(os.path.join(folder, "case.json")))
    text = open(os.path.join(folder, "module.mlir")).read()
    mesh_axes = case.get("mesh")
    count = 1
    for _, size in mesh_axes or []:
        count *= size
    devices = jax.devices()[:count]
    if len(devices) < count:
        return [f"needs {count} devices, XLA has {len(devices)}"]
    failures = []
    for r, run in enumerate(case["runs"]):
        module = specialize(text, run) if "?x" in text or "<?" in text else text
        start = time.perf_counter()
        exe = compile_module(module, devices)
        compile_ms = (time.perf_counter() - start) * 1e3
        hlo = exe.hlo_modules()[0].to_string()
        for collective in case.get("collectives", []):
            if collective not in hlo:
                failures.append(f"run {r}: no `{collective}` in XLA's optimized HLO")
        inputs = [load(folder, e) for e in run["inputs"]]
        if mesh_axes:
            mesh = Mesh(np.array(devices).reshape([s for _, s in mesh_axes]),
                        tuple(n for n, _ in mesh_axes))
            specs = case["shardings"]
            put = lambda i, x: jax.device_put(
                x, NamedSharding(mesh, PartitionSpec(*specs[i])))
        else:
            put = lambda i, x: jax.device_put(x, devices[0])
        loop = case.get("loop")
        steps = loop["steps"] if loop else 1
        losses = []
        start = time.perf_counter()
        for _ in range(steps):
            outs = exe.execute_sharded([put(i, x) for i, x in enumerate(inputs)])
            outs = [np.asarray(o[0]) for o in outs.disassemble_into_single_device_arrays()]
            if loop:
                losses.append(float(outs[loop["loss"]]))
                for out_index, in_index in loop["feed"]:
                    inputs[in_index] = outs[out_index]
        run_ms = (time.perf_counter() - start) * 1e3 / steps
        if loop:
            want = np.array(loop["losses"], np.float32)
            problem = compare("losses", np.array(losses, np.float32), want, "f32", "tolerance")
            if problem:
                failures.append(f"run {r}: {problem} (XLA {losses}, Kiln {list(want)})")
        for k, entry in enumerate(run["outputs"]):
            want = load(folder, entry)
            problem = compare(f"run {r} output {k}", outs[k], want, entry["dtype"], case["rule"],
                              AFTER_STEPS if loop and steps > 1 else None)
            if problem:
                failures.append(problem)
        print(f"  {case['name']} run {r}: compile {compile_ms:.0f} ms, run {run_ms:.2f} ms "
              f"on {count} device(s)")
    return failures


def main():
    root = sys.argv[1]
    folders = sorted(os.path.join(root, d) for d in os.listdir(root)
                     if os.path.isdir(os.path.join(root, d)))
    failed = 0
    for folder in folders:
        try:
            failures = run_case(folder)
        except Exception as e:  # the case's failure, reported with the others
            failures = [f"{type(e).__name__}: {e}"]
        if failures:
            failed += 1
            print(f"FAIL {os.path.basename(folder)}")
            for f in failures:
                print(f"    {f}")
        else:
            print(f"ok   {os.path.basename(folder)}")
    print(f"{len(folders) - failed} of {len(folders)} exported cases match Kiln on XLA")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
