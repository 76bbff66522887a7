"""torchnpugen: the op table (ops/npu_native_functions.yaml) -> registrations for one pair.

Reads the table and PyTorch's own native_functions.yaml (through torchgen, from the torch
of the pair being built) and writes:

  --cpp   the PrivateUse1 registrations of the supported zero-copy operators, the
          SparsePrivateUse1 / SparseCsrPrivateUse1 ones of the sparse section, and the
          per-operator data the kernels consult (dtype masks, why an operator is missing);
  --py    torch_npu/_op_table.py: the supported / unsupported operators (and those served on
          quantized npu tensors), for torch.npu.is_op_supported and the op-support CLI;
  --md    this pair's section of docs/OPS.md.

With --registered (ops/torch_npu_registered_ops.txt: the overloads Huawei's torch_npu registers
an NPU kernel for), every overload of the table that reaches the PrivateUse1 key on its own
(a CPU kernel, no composite one) but that torch_npu does not register is a CPU-fallback
operator, as in torch_npu: no registration here, so it runs through the boxed CPU fallback
(ops/src/op_support.cpp: one warning per operator, an error under
TORCH_NPU_FALLBACK_CPU_DISABLE=1). A structured op's out= overload counts as registered when
torch_npu registers its functional or in-place form (they compute through it here). A
hand-written (`kernel: native`) entry torch_npu does not register is an error, and so is an
entry of the `quantized:` section that torch_npu does not register for QuantizedPrivateUse1.

usage: torchnpugen.py --table T --torch 2.13.0 --cann 8.5.0 --version 2.13.0.post1 --pair P
                      [--registered R] [--cpp F] [--py F] [--md F]
"""
import argparse
import os
import re
import sys
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import yaml

DTYPES = {  # table name -> c10::ScalarType enumerator
    "uint8": "Byte", "int8": "Char", "int16": "Short", "int32": "Int", "int64": "Long",
    "float16": "Half", "float32": "Float", "float64": "Double", "complex64": "ComplexFloat",
    "complex128": "ComplexDouble", "bool": "Bool", "bfloat16": "BFloat16",
}
ENTRY_KEYS = {"op", "kernel", "cann", "dtypes", "supported", "note", "autograd"}
KERNELS = {"zero_copy", "native"}


@dataclass
class Entry:
    op: str
    kernel: str = "zero_copy"
    cann: str = ""
    dtypes: Optional[List[str]] = None
    supported: bool = True
    note: str = ""
    autograd: bool = False


@dataclass
class PairTable:
    supported: List[Entry] = field(default_factory=list)
    registered: List[str] = field(default_factory=list)         # zero-copy ops without a composite kernel
    unsupported: Dict[str, str] = field(default_factory=dict)   # op -> why (cpu_fallback's ops included)
    cpu_fallback: List[str] = field(default_factory=list)       # torch_npu registers no kernel: CPU fallback
    absent: List[str] = field(default_factory=list)             # in the table, not in this torch
    untabled: List[str] = field(default_factory=list)           # CPU kernels the table lacks
    custom: List[Entry] = field(default_factory=list)
    # The `sparse:` section: overloads on sparse npu tensors (COO: SparsePrivateUse1;
    # CSR/CSC/BSR/BSC: SparseCsrPrivateUse1), run by ops/src/sparse.cpp.
    sparse: List[Entry] = field(default_factory=list)
    sparse_registered: Dict[str, List[str]] = field(default_factory=dict)  # op -> ["Sparse", "SparseCsr"]
    sparse_unsupported: Dict[str, str] = field(default_factory=dict)
    # The `quantized:` section: overloads on quantized npu tensors (QuantizedPrivateUse1),
    # hand-written in ops/src/quantized.cpp.
    quantized: List[Entry] = field(default_factory=list)


def version_tuple(text: str) -> Tuple[int, ...]:
    return tuple(int(p) for p in text.split("."))


def cann_admits(spec: str, cann: str) -> bool:
    """`spec` is a comma-separated list of comparisons such as ">=8.5,<9.1"."""
    have = version_tuple(cann)
    for clause in filter(None, (c.strip() for c in spec.split(","))):
        m = re.fullmatch(r"(>=|<=|==|>|<)\s*(\d+(?:\.\d+)*)", clause)
        if not m:
            raise ValueError(f"bad cann range {spec!r}: expected clauses like '>=9.1' or '<9.1'")
        want = version_tuple(m.group(2))
        want += (0,) * (len(have) - len(want))
        ok = {">=": have >= want, "<=": have <= want, "==": have == want, ">": have > want,
              "<": have < want}[m.group(1)]
        if not ok:
            return False
    return True


def parse_entry(raw, where: str) -> Entry:
    if isinstance(raw, str):
        return Entry(op=raw)
    if not isinstance(raw, dict) or "op" not in raw:
        raise ValueError(f"{where}: expected an operator name or a mapping with 'op', got {raw!r}")
    unknown = set(raw) - ENTRY_KEYS
    if unknown:
        raise ValueError(f"{where} ({raw['op']}): unknown keys {sorted(unknown)}; allowed: {sorted(ENTRY_KEYS)}")
    e = Entry(**raw)
    if e.kernel not in KERNELS:
        raise ValueError(f"{where} ({e.op}): kernel must be one of {sorted(KERNELS)}, got {e.kernel!r}")
    for d in e.dtypes or []:
        if d not in DTYPES:
            raise ValueError(f"{where} ({e.op}): unknown dtype {d!r}; known: {sorted(DTYPES)}")
    if e.cann:
        cann_admits(e.cann, "1.0")  # validates the syntax
    return e


@dataclass
class Operator:
    has_cpu: bool        # a CPU kernel: what the zero-copy path runs
    has_composite: bool  # a CompositeExplicitAutograd(NonFunctional) kernel serves every backend
    sparse_keys: Tuple[str, ...] = ()  # "Sparse" / "SparseCsr": SparseCPU / SparseCsrCPU kernels
    computes: Tuple[str, ...] = ()     # structured out= overload: the forms computed through it


def torch_operators() -> Dict[str, Operator]:
    """Every overload of this torch's native_functions.yaml, with its kernels."""
    import torchgen
    from torchgen.gen import parse_native_yaml
    from torchgen.model import DispatchKey

    root = os.path.join(os.path.dirname(torchgen.__file__), "packaged", "ATen", "native")
    parsed = parse_native_yaml(os.path.join(root, "native_functions.yaml"), os.path.join(root, "tags.yaml"))
    cpu = parsed.backend_indices[DispatchKey.CPU]
    explicit = parsed.backend_indices[DispatchKey.CompositeExplicitAutograd]
    non_functional = parsed.backend_indices[DispatchKey.CompositeExplicitAutogradNonFunctional]
    sparse = {"Sparse": parsed.backend_indices[DispatchKey.SparseCPU],
              "SparseCsr": parsed.backend_indices[DispatchKey.SparseCsrCPU]}
    by_name = {f.func.name: f for f in parsed.native_functions}
    computes: Dict[str, List[str]] = {}
    for f in parsed.native_functions:
        if f.structured_delegate is not None:
            computes.setdefault(str(f.structured_delegate), []).append(str(f.func.name))
    ops = {}
    for f in parsed.native_functions:
        delegate = f.structured_delegate
        ops[str(f.func.name)] = Operator(
            has_cpu=cpu.has_kernel(f) or (delegate is not None and cpu.has_kernel(by_name[delegate])),
            # Structured ops' functional and in-place forms are registered under
            # CompositeExplicitAutogradNonFunctional by PyTorch's codegen.
            has_composite=explicit.has_kernel(f) or non_functional.has_kernel(f) or delegate is not None,
            sparse_keys=tuple(k for k, index in sparse.items() if index.has_kernel(f)),
            computes=tuple(computes.get(str(f.func.name), ())))
    return ops


FALLBACK_WHY = "torch_npu registers no NPU kernel for it: CPU fallback"
REGISTERED_KEYS = {"PrivateUse1", "CatchAll"}


def read_registered(path: str, keys=frozenset(REGISTERED_KEYS)) -> frozenset:
    """The overloads ops/torch_npu_registered_ops.txt gives a kernel for one of `keys`
    (by default PrivateUse1 or CatchAll)."""
    names = set()
    with open(path) as f:
        for line in f:
            if not line.strip() or line.startswith("#"):
                continue
            name, *regs = line.split()
            if keys & {r.split("(", 1)[0] for r in regs}:
                names.add(name)
    if not names:
        raise ValueError(f"{path}: no {'/'.join(sorted(keys))} registrations")
    return frozenset(names)


def torch_npu_registers(op: str, operators: Dict[str, "Operator"], registered: frozenset) -> bool:
    """Whether torch_npu has an NPU kernel for `op`; a structured out= overload follows the
    functional / in-place forms computed through it."""
    return op in registered or any(form in registered for form in operators[op].computes)


def build_pair_table(table: dict, cann: str, operators: Dict[str, Operator],
                     registered: Optional[frozenset] = None,
                     quantized_registered: Optional[frozenset] = None) -> PairTable:
    out = PairTable()
    seen = set()
    for i, raw in enumerate(table.get("aten") or []):
        e = parse_entry(raw, f"aten[{i}]")
        if e.op in seen:
            raise ValueError(f"aten[{i}]: {e.op} is listed twice")
        seen.add(e.op)
        if e.op not in operators:
            out.absent.append(e.op)
            continue
        if not e.supported:
            out.unsupported[e.op] = e.note or "no NPU kernel"
        elif e.cann and not cann_admits(e.cann, cann):
            out.unsupported[e.op] = f"needs CANN {e.cann}" + (f": {e.note}" if e.note else "")
        elif e.kernel == "zero_copy" and not operators[e.op].has_cpu:
            # Torch releases differ: the overload exists here without a CPU kernel.
            out.unsupported[e.op] = "no CPU kernel in this torch release for the zero-copy path to run"
        elif (registered is not None and operators[e.op].has_cpu and not operators[e.op].has_composite
              and not torch_npu_registers(e.op, operators, registered)):
            if e.kernel == "native":
                raise ValueError(f"aten[{i}] ({e.op}): a hand-written kernel for an overload torch_npu does "
                                 "not register (it takes torch_npu's CPU fallback): drop the kernel and "
                                 "list the overload by name")
            out.cpu_fallback.append(e.op)
            out.unsupported[e.op] = FALLBACK_WHY + (f" ({e.note})" if e.note else "")
        else:
            out.supported.append(e)
            # An operator with a composite kernel reaches the NPU through it (e.g. add.Tensor
            # allocates and calls add.out); registering the zero-copy kernel would override it.
            if e.kernel == "zero_copy" and not operators[e.op].has_composite:
                out.registered.append(e.op)
    for name, o in sorted(operators.items()):
        if o.has_cpu and name not in seen:
            out.untabled.append(name)
            out.unsupported[name] = "not in the op table (ops/npu_native_functions.yaml)"
    for i, raw in enumerate(table.get("custom") or []):
        out.custom.append(parse_entry(raw, f"custom[{i}]"))
    build_sparse(table, cann, operators, out)
    build_quantized(table, operators, quantized_registered, out)
    return out


def build_quantized(table: dict, operators: Dict[str, Operator], registered: Optional[frozenset],
                    out: PairTable) -> None:
    """The `quantized:` section: the overloads served on quantized npu tensors, every one a
    QuantizedPrivateUse1 kernel of torch_npu's, hand-written in ops/src/quantized.cpp."""
    seen = set()
    for i, raw in enumerate(table.get("quantized") or []):
        e = parse_entry(raw, f"quantized[{i}]")
        if e.op in seen:
            raise ValueError(f"quantized[{i}]: {e.op} is listed twice")
        seen.add(e.op)
        if e.dtypes or e.cann or not e.supported or e.kernel != "zero_copy":
            raise ValueError(f"quantized[{i}] ({e.op}): quantized entries are operator names (with a note) only")
        if registered is not None and e.op not in registered:
            raise ValueError(f"quantized[{i}] ({e.op}): torch_npu registers no QuantizedPrivateUse1 kernel for it")
        if e.op in operators:
            out.quantized.append(e)
        else:
            out.absent.append(e.op)


def build_sparse(table: dict, cann: str, operators: Dict[str, Operator], out: PairTable) -> None:
    """The `sparse:` section: which overloads run on sparse npu tensors, for which layouts."""
    seen = set()
    for i, raw in enumerate(table.get("sparse") or []):
        e = parse_entry(raw, f"sparse[{i}]")
        if e.op in seen:
            raise ValueError(f"sparse[{i}]: {e.op} is listed twice")
        if e.dtypes:
            raise ValueError(f"sparse[{i}] ({e.op}): sparse entries take no dtypes: the sparse CPU kernel's dtypes apply")
        seen.add(e.op)
        if e.op not in operators:
            out.absent.append(e.op)
            continue
        keys = operators[e.op].sparse_keys
        if not e.supported:
            out.sparse_unsupported[e.op] = e.note or "no sparse NPU kernel"
        elif e.cann and not cann_admits(e.cann, cann):
            out.sparse_unsupported[e.op] = f"needs CANN {e.cann}" + (f": {e.note}" if e.note else "")
        elif e.kernel == "zero_copy" and not keys:
            out.sparse_unsupported[e.op] = "no sparse CPU kernel in this torch release for the zero-copy path to run"
        else:
            out.sparse.append(e)
            if e.kernel == "zero_copy":
                out.sparse_registered[e.op] = list(keys)
    for name, o in sorted(operators.items()):
        if o.sparse_keys and name not in seen:
            out.sparse_unsupported[name] = "not in the op table's sparse section (ops/npu_native_functions.yaml)"


def c_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def dtype_mask(e: Entry) -> str:
    if not e.dtypes:
        return "kAnyDtype"
    return " | ".join(f"dtype_bit(c10::ScalarType::{DTYPES[d]})" for d in e.dtypes)


def write_cpp(path: str, t: PairTable, torch_version: str, cann: str, version: str) -> None:
    restricted = sorted((e for e in t.supported if e.dtypes), key=lambda e: e.op)
    lines = [
        f"// Generated by ops/torchnpugen from ops/npu_native_functions.yaml for torch {torch_version}, "
        f"CANN {cann}. Do not edit.",
        '#include <torch/library.h>',
        '',
        '#include "ops/src/op_table.h"',
        '',
        'namespace torch_npu::ops {',
        '',
        f'const char* const kPairDescription = {c_string(f"torch_npu {version}, CANN {cann}")};',
        '',
        'const OpDtypes kRestrictedDtypes[] = {',
        *[f"    {{{c_string(e.op)}, {dtype_mask(e)}}}," for e in restricted],
        '    {nullptr, 0},',
        '};',
        '',
        'const OpNote kUnsupportedOps[] = {',
        *[f"    {{{c_string(op)}, {c_string(why)}}}," for op, why in sorted(t.unsupported.items())],
        '    {nullptr, nullptr},',
        '};',
        '',
        'extern const OpNote kUnsupportedSparseOps[];  // read by ops/src/sparse.cpp (external linkage)',
        'const OpNote kUnsupportedSparseOps[] = {',
        *[f"    {{{c_string(op)}, {c_string(why)}}}," for op, why in sorted(t.sparse_unsupported.items())],
        '    {nullptr, nullptr},',
        '};',
        '',
        '// ops/src/sparse.cpp: the sparse CPU kernel on CPU stand-ins of sparse npu tensors.',
        'void sparse_zero_copy_kernel(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack);',
        '',
        '}  // namespace torch_npu::ops',
        '',
        'TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {',
        '  const auto kernel = [] { return torch::CppFunction::makeFromBoxedFunction<&torch_npu::ops::zero_copy_kernel>(); };',
        *[f"  m.impl({c_string(op)}, kernel());" for op in sorted(t.registered)],
        '}',
        '',
    ]
    for key in ("Sparse", "SparseCsr"):
        lines += [
            f'TORCH_LIBRARY_IMPL(aten, {key}PrivateUse1, m) {{',
            '  const auto kernel = [] { return torch::CppFunction::makeFromBoxedFunction<&torch_npu::ops::sparse_zero_copy_kernel>(); };',
            *[f"  m.impl({c_string(op)}, kernel());" for op, keys in sorted(t.sparse_registered.items()) if key in keys],
            '}',
            '',
        ]
    with open(path, "w") as f:
        f.write("\n".join(lines))


def write_py(path: str, t: PairTable, torch_version: str, cann: str) -> None:
    supported = sorted(e.op for e in t.supported)
    with open(path, "w") as f:
        f.write(f'"""Generated by ops/torchnpugen for torch {torch_version}, CANN {cann}. Do not edit."""\n\n')
        f.write(f"TORCH = {torch_version!r}\nCANN = {cann!r}\n\n")
        f.write("# aten overloads the NPU serves\nSUPPORTED = frozenset({\n")
        f.writelines(f"    {op!r},\n" for op in supported)
        f.write("})\n\n# aten overloads that reach a backend but have no NPU kernel in this pair, and why\n")
        f.write("UNSUPPORTED = {\n")
        f.writelines(f"    {op!r}: {why!r},\n" for op, why in sorted(t.unsupported.items()))
        f.write("}\n\n# of those, the overloads torch_npu registers no NPU kernel for (they take its CPU fallback)\n")
        f.write("CPU_FALLBACK = frozenset({\n")
        f.writelines(f"    {op!r},\n" for op in sorted(t.cpu_fallback))
        f.write("})\n\n# torch.ops.npu fused operators -> whether they have their own backward\nCUSTOM = {\n")
        f.writelines(f"    {e.op!r}: {e.autograd!r},\n" for e in t.custom)
        f.write("}\n\n# aten overloads served on sparse (COO, CSR, CSC, BSR, BSC) npu tensors\nSPARSE = frozenset({\n")
        f.writelines(f"    {op!r},\n" for op in sorted(e.op for e in t.sparse))
        f.write("})\n\n# aten overloads with sparse CPU kernels but none for sparse npu tensors, and why\n")
        f.write("SPARSE_UNSUPPORTED = {\n")
        f.writelines(f"    {op!r}: {why!r},\n" for op, why in sorted(t.sparse_unsupported.items()))
        f.write("}\n\n# aten overloads served on quantized npu tensors (QuantizedPrivateUse1)\nQUANTIZED = frozenset({\n")
        f.writelines(f"    {op!r},\n" for op in sorted(e.op for e in t.quantized))
        f.write("})\n\n# aten overloads whose dtypes are restricted on the NPU\nDTYPES = {\n")
        f.writelines(f"    {e.op!r}: {tuple(e.dtypes)!r},\n" for e in t.supported if e.dtypes)
        f.write("}\n")


def write_md(path: str, t: PairTable, torch_version: str, cann: str, pair: str) -> None:
    native = sorted(e.op for e in t.supported if e.kernel == "native")
    zero_copy = sorted(e.op for e in t.supported if e.kernel == "zero_copy")
    out = [f"## {pair}: torch {torch_version}, CANN {cann}", "",
           f"{len(t.supported)} ATen overloads supported ({len(zero_copy)} through the zero-copy path, "
           f"{len(native)} native), {len(t.unsupported)} without an NPU kernel (they fall back to the CPU: "
           f"{len(t.cpu_fallback)} of them because torch_npu registers no kernel for them), "
           f"{len(t.custom)} fused `torch.ops.npu` operators.", ""]
    fallback = set(t.cpu_fallback)
    out += ["### Without an NPU kernel: CPU fallback", "",
            "The overloads torch_npu itself registers no NPU kernel for (ops/torch_npu_registered_ops.txt) run "
            "through its CPU fallback here too; the others lack a kernel in this pair.", "",
            "| operator | why |", "|---|---|"]
    out += [f"| `aten::{op}` | {why} |" for op, why in sorted(t.unsupported.items()) if op in fallback]
    out += [f"| `aten::{op}` | {why} |" for op, why in sorted(t.unsupported.items()) if op not in fallback]
    notes = {e.op: e.note for e in t.supported if e.note or e.dtypes}
    out += ["", "### Supported with notes", "", "| operator | kernel | note |", "|---|---|---|"]
    for e in sorted(t.supported, key=lambda e: e.op):
        if e.op in notes:
            extra = f"dtypes: {', '.join(e.dtypes)}. " if e.dtypes else ""
            out.append(f"| `aten::{e.op}` | {e.kernel} | {extra}{e.note} |")
    out += ["", "### Fused operators (`torch.ops.npu`, `torch_npu.<name>`)", "",
            ", ".join(f"`{e.op}`" + (" (autograd)" if e.autograd else "") for e in t.custom), "",
            "### All supported ATen overloads", "", ", ".join(f"`{op}`" for op in sorted(zero_copy + native)), ""]
    out += ["### Sparse layouts", "",
            f"{len(t.sparse)} ATen overloads run on sparse npu tensors (COO, and CSR/CSC/BSR/BSC where PyTorch's "
            f"CPU has the kernel; ops/src/sparse.cpp), {len(t.sparse_unsupported)} raise.", "",
            ", ".join(f"`{e.op}`" for e in sorted(t.sparse, key=lambda e: e.op)), ""]
    if t.sparse_unsupported:
        out += ["| operator (sparse npu tensors) | why |", "|---|---|"]
        out += [f"| `aten::{op}` | {why} |" for op, why in sorted(t.sparse_unsupported.items())]
        out += [""]
    out += ["### Quantized tensors", "",
            f"{len(t.quantized)} ATen overloads run on quantized npu tensors (quint8, qint8, qint32; per-tensor "
            "and per-channel affine; ops/src/quantized.cpp), the ones torch_npu registers for "
            "QuantizedPrivateUse1; float32 npu tensors become quantized ones through `aten::quantize_per_tensor` and "
            "`aten::quantize_per_channel`.", "",
            ", ".join(f"`{e.op}`" for e in sorted(t.quantized, key=lambda e: e.op)), ""]
    if t.absent:
        out += ["", f"Listed in the table but absent from torch {torch_version}: "
                + ", ".join(f"`{op}`" for op in sorted(t.absent)), ""]
    with open(path, "w") as f:
        f.write("\n".join(out))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for name in ("table", "torch", "cann", "version", "pair"):
        p.add_argument("--" + name, required=True)
    for name in ("registered", "cpp", "py", "md"):
        p.add_argument("--" + name)
    args = p.parse_args(argv)
    with open(args.table) as f:
        table = yaml.safe_load(f)
    try:
        registered = read_registered(args.registered) if args.registered else None
        quantized = read_registered(args.registered, frozenset({"QuantizedPrivateUse1"})) if args.registered else None
        t = build_pair_table(table, args.cann, torch_operators(), registered, quantized)
    except ValueError as err:
        raise SystemExit(f"torchnpugen: {args.table}: {err}")
    if t.untabled:
        print(f"torchnpugen: {len(t.untabled)} operator(s) of torch {args.torch} with CPU kernels are not in the "
              f"op table and will be unsupported: {', '.join(t.untabled[:20])}"
              + (" ..." if len(t.untabled) > 20 else ""), file=sys.stderr)
    if args.cpp:
        write_cpp(args.cpp, t, args.torch, args.cann, args.version)
    if args.py:
        write_py(args.py, t, args.torch, args.cann)
    if args.md:
        write_md(args.md, t, args.torch, args.cann, args.pair)


if __name__ == "__main__":
    main()
