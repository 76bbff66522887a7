#!/usr/bin/env python3
"""The ATen overloads Huawei's torch_npu registers an NPU kernel for (derived from its sources).

An ATen overload that reaches the PrivateUse1 key without a kernel of torch_npu's runs
through torch_npu's boxed fallback: copied to the CPU, with "... will fall back to run on the
CPU" (refused under TORCH_NPU_FALLBACK_CPU_DISABLE=1). This script reads checkouts of
Ascend/pytorch and Ascend/op-plugin and lists, for one torch minor version, the overloads
that do have a kernel, with the dispatch key(s) and the file each registration comes from:

    tools/torch_npu_registrations.py --pytorch /path/to/Ascend/pytorch \\
        --op-plugin /path/to/Ascend/op-plugin [--torch-version 2.13] \\
        [--out ops/torch_npu_registered_ops.txt] [--table ops/npu_native_functions.yaml]

Run it with the python of the torch release in question: PyTorch's own native_functions.yaml
(through torchgen) says which overloads exist, which are CompositeImplicitAutograd and which
have shared CPU/CUDA kernels, facts torch_npu's code generator also takes from torchgen.

Where the registrations come from (the rules of torch_npu's code generator,
torchnpugen/gen_backend_stubs.py and op-plugin's torchnpugen, restated):

* op-plugin op_plugin/config/op_plugin_functions.yaml, sections official / quant / autograd:
  an entry counts for version vX.Y if vX.Y is among its `acl_op`, `op_api` or `sparse`
  versions (`all_version`, `[vA.B, newest]`, `[vA.B, vC.D]` or a comma list; `dvm` alone
  does not count). official -> PrivateUse1 (when it has acl_op/op_api versions at all, or
  a device_check key) and SparsePrivateUse1 (when vX.Y is among its `sparse` versions);
  quant -> QuantizedPrivateUse1; autograd -> AutogradPrivateUse1. `custom` entries are
  torch.ops.npu operators, not ATen; `symint` only marks names listed elsewhere.
* Ascend/pytorch torch_npu/csrc/aten/npu_native_functions.yaml, section supported ->
  PrivateUse1 (a plain name, or a mapping with op_api / device_check).
* Every PrivateUse1 overload above that PyTorch makes CompositeImplicitAutograd (and gives no
  Autograd kernel, nor a derivative in op-plugin's derivatives.yaml) is registered for
  AutogradPrivateUse1 too, so the NPU kernel is used instead of the decomposition.
* op-plugin op_plugin/config/derivatives.yaml (version-gated by `version`): an ATen name with
  a derivative there gets torch_npu's autograd wrapper (AutogradPrivateUse1) for itself and
  for the non-CompositeImplicitAutograd overloads sharing its base name. This is an autograd
  wrapper only: the computation still needs a PrivateUse1 kernel.
* `_foreach_*` overloads with a CPU kernel and no PrivateUse1 entry: PrivateUse1 with PyTorch's
  device-generic CPU kernel (the per-tensor "slow" loop; ForeachRegister.cpp).
* SparsePrivateUse1 / SparseCsrPrivateUse1: overloads whose SparseCPU and SparseCUDA (resp.
  SparseCsrCPU and SparseCsrCUDA) kernels are one device-generic function.
* QuantizedPrivateUse1 / NestedTensorPrivateUse1 extras written into gen_backend_stubs.py.
* Hand-written TORCH_LIBRARY_IMPL(aten, <key>, m) blocks in the C++ of both repositories, for
  every key naming PrivateUse1 (Autocast excluded: not a kernel) and CatchAll.
  torch_npu/csrc/aten/ops/SparseCsrReductionFallbackKernelNpu.cpp is one of them; its kernels
  copy to the CPU on purpose (explicit CPU fallback), so they are tagged `explicit-cpu`.

Output: one overload per line, sorted: `name  KEY(repo:path) KEY(repo:path) ...`.
With --table, also prints how the `aten:` entries of our op table fare: registered, reached
through a composite kernel, or falling back to the CPU.
"""

import argparse
import collections
import glob
import os
import re
import subprocess
import sys

import yaml

OP_PLUGIN_YAML = "op_plugin/config/op_plugin_functions.yaml"
DERIVATIVES_YAML = "op_plugin/config/derivatives.yaml"
PTA_YAML = "torch_npu/csrc/aten/npu_native_functions.yaml"
STUBS = "torchnpugen/gen_backend_stubs.py"
# Overloads torch_npu keeps on PrivateUse1 only although PyTorch makes them
# CompositeImplicitAutograd (torchnpugen/utils.py, COMPOSITEIMPLICITAUTOGRAD_EXCEPT_LIST).
COMPOSITE_EXCEPT = {"isclose", "isfinite"}
# Derivatives whose autograd wrapper torch_npu's generator skips (torchnpugen/autograd/utils.py).
AUTOGRAD_BLACK_LIST = {"npu_format_cast.Tensor", "npu_format_cast_", "npu_format_cast_.acl_format"}
# Files with hand-written registrations that copy to the CPU by design.
EXPLICIT_CPU = {"torch_npu/csrc/aten/ops/SparseCsrReductionFallbackKernelNpu.cpp"}
HERE = os.path.dirname(os.path.abspath(__file__))


def versions(spec, all_version):
    """The versions an op-plugin version spec covers (op-plugin's get_version rules)."""
    if spec is None:
        return []
    if isinstance(spec, list):
        start = all_version.index(spec[0])
        if spec[1] == "newest":
            return all_version[start:]
        return all_version[start:all_version.index(spec[1]) + 1]
    if spec == "all_version":
        return list(all_version)
    return [v.strip() for v in str(spec).split(",")]


def op_name(entry):
    """`name.overload` of a yaml entry (a string or a mapping with `func`)."""
    func = entry["func"] if isinstance(entry, dict) else entry
    return func.split("(")[0].strip()


class Torch:
    """What PyTorch's native_functions.yaml (the running torch's torchgen) says about overloads."""

    def __init__(self):
        import torchgen
        from torchgen.gen import parse_native_yaml
        from torchgen.model import DispatchKey as K

        root = os.path.join(os.path.dirname(torchgen.__file__), "packaged", "ATen", "native")
        parsed = parse_native_yaml(os.path.join(root, "native_functions.yaml"),
                                   os.path.join(root, "tags.yaml"))
        idx = parsed.backend_indices
        self.functions = {str(f.func.name): f for f in parsed.native_functions}
        by_name = {f.func.name: f for f in parsed.native_functions}

        def has(key, f):
            return idx[key].has_kernel(f)

        def kernel(key, f):
            m = idx[key].get_kernel(f)
            return m.kernel if m is not None else None

        self.implicit, self.autograd, self.cpu, self.composite = set(), set(), set(), {}
        self.shared_sparse = {"SparsePrivateUse1": set(), "SparseCsrPrivateUse1": set()}
        for name, f in self.functions.items():
            if has(K.CompositeImplicitAutograd, f):
                self.implicit.add(name)
            if has(K.Autograd, f):
                self.autograd.add(name)
            delegate = f.structured_delegate
            if has(K.CPU, f) or (delegate is not None and has(K.CPU, by_name[delegate])):
                self.cpu.add(name)
            if delegate is not None:
                self.composite[name] = f"structured, computed by {delegate}"
            elif has(K.CompositeExplicitAutograd, f) or has(K.CompositeExplicitAutogradNonFunctional, f):
                self.composite[name] = "CompositeExplicitAutograd"
            for key, cpu, cuda in (("SparsePrivateUse1", K.SparseCPU, K.SparseCUDA),
                                   ("SparseCsrPrivateUse1", K.SparseCsrCPU, K.SparseCsrCUDA)):
                k = kernel(cpu, f)
                if k is not None and k == kernel(cuda, f):
                    self.shared_sparse[key].add(name)
        self.explicit_cpu_kernel = {name for name, f in self.functions.items() if has(K.CPU, f)}
        import torch
        self.version = ".".join(torch.__version__.split(".")[:2])


class Registry:
    def __init__(self, torch):
        self.torch = torch
        self.regs = collections.defaultdict(set)  # name -> {(key, source)}

    def add(self, name, key, source):
        if name in self.torch.functions:  # ATen overloads of this torch only
            self.regs[name].add((key, source))

    def keys(self, name):
        return {k for k, _ in self.regs.get(name, ())}


def read_yaml(path):
    with open(path, encoding="utf-8") as f:
        return yaml.safe_load(f)


def collect(pytorch, op_plugin, torch):
    reg = Registry(torch)
    version = "v" + torch.version
    src_op = "op-plugin:" + OP_PLUGIN_YAML
    src_pta = "pytorch:" + PTA_YAML
    src_stubs = "pytorch:" + STUBS

    plugin = read_yaml(os.path.join(op_plugin, OP_PLUGIN_YAML))
    all_version = plugin["all_version"]
    if version not in all_version:
        sys.exit(f"torch {torch.version}: {version} is not in op-plugin's all_version {all_version}")

    def applies(e):
        return version in (versions(e.get("acl_op"), all_version) + versions(e.get("op_api"), all_version)
                           + versions(e.get("sparse"), all_version))

    dense = set()  # what torch_npu's generator calls `supported`
    for e in plugin.get("official") or []:
        if not applies(e):
            continue
        name = op_name(e)
        if versions(e.get("acl_op"), all_version) or versions(e.get("op_api"), all_version) \
                or "device_check" in e:
            dense.add(name)
            reg.add(name, "PrivateUse1", src_op)
        if version in versions(e.get("sparse"), all_version):
            reg.add(name, "SparsePrivateUse1", src_op)
    for e in plugin.get("quant") or []:
        if applies(e):
            reg.add(op_name(e), "QuantizedPrivateUse1", src_op + "#quant")
    for e in plugin.get("autograd") or []:
        if applies(e):
            reg.add(op_name(e), "AutogradPrivateUse1", src_op + "#autograd")

    pta = read_yaml(os.path.join(pytorch, PTA_YAML))
    for e in pta.get("supported") or []:
        if isinstance(e, dict) and not ({"op_api", "device_check", "impl_ns"} & set(e)):
            continue
        dense.add(op_name(e))
        reg.add(op_name(e), "PrivateUse1", src_pta)
    for e in pta.get("autograd") or []:
        reg.add(op_name(e), "AutogradPrivateUse1", src_pta + "#autograd")

    derivatives = read_yaml(os.path.join(op_plugin, DERIVATIVES_YAML))
    with_derivative = {op_name(e["name"]) for e in derivatives["backward"]
                       if version in versions(e.get("version"), derivatives["all_version"])}
    with_derivative -= AUTOGRAD_BLACK_LIST
    for name in sorted(torch.functions):
        base = str(torch.functions[name].func.name.name.base)
        if name in with_derivative or (base in with_derivative and name not in torch.implicit):
            reg.add(name, "AutogradPrivateUse1", "op-plugin:" + DERIVATIVES_YAML)

    for name in sorted(dense):
        if (name in torch.implicit and name not in torch.autograd and name not in with_derivative
                and name not in COMPOSITE_EXCEPT):
            reg.add(name, "AutogradPrivateUse1", src_stubs + "#composite-implicit")
    for name in sorted(torch.explicit_cpu_kernel):
        if name.startswith("_foreach") and name not in dense:
            reg.add(name, "PrivateUse1", src_stubs + "#foreach")
    for key, names in torch.shared_sparse.items():
        for name in sorted(names):
            reg.add(name, key, src_stubs + "#device-generic")
    stubs_special(reg, os.path.join(pytorch, STUBS), src_stubs)

    for repo, label in ((pytorch, "pytorch"), (op_plugin, "op-plugin")):
        hand_written(reg, repo, label)
    return reg


def stubs_special(reg, path, source):
    """The extra kernels gen_backend_stubs.py writes into its quantized / nested registrations."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    blocks = {
        "QuantizedPrivateUse1": re.search(r"def _quantized_extra_impls\(.*?\n(?=def )", text, re.S),
        "NestedTensorPrivateUse1": re.search(r'"nestedtensor": SpecialRegisterConfig\(.*?\n    \),', text, re.S),
    }
    for key, block in blocks.items():
        names = re.findall(r'm\.impl\("([^"]+)"', block.group(0)) if block else []
        if not names:
            sys.exit(f"{path}: found no {key} extra registrations (the file changed?)")
        for name in names:
            reg.add(name, key, source + "#extra")


def hand_written(reg, repo, label):
    """m.impl calls inside TORCH_LIBRARY_IMPL(aten, <key>, m) blocks of a repository's C++."""
    skip = re.compile(r"(^|/)(test|tests|examples|third_party|build)/")
    block = re.compile(r"TORCH_LIBRARY_IMPL\(\s*aten\s*,\s*(\w+)\s*,\s*\w+\s*\)\s*\{(.*?)\n\s*\}", re.S)
    impl = re.compile(r'\.impl\(\s*(?:TORCH_SELECTIVE_NAME\()?\s*"(?:aten::)?([\w.]+)"')
    files = []
    for ext in ("cpp", "cc", "h"):
        files += glob.glob(os.path.join(repo, "**", f"*.{ext}"), recursive=True)
    for path in sorted(files):
        rel = os.path.relpath(path, repo)
        if skip.search(rel):
            continue
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
        for key, body in block.findall(text):
            if key != "CatchAll" and ("PrivateUse1" not in key or key.startswith("Autocast")):
                continue
            tag = "#explicit-cpu" if rel in EXPLICIT_CPU else ""
            for name in impl.findall(body):
                reg.add(name, key, f"{label}:{rel}{tag}")


def git_head(repo):
    try:
        return subprocess.run(["git", "-C", repo, "log", "-1", "--format=%H %cI"], check=True,
                              capture_output=True, text=True).stdout.strip()
    except (subprocess.CalledProcessError, FileNotFoundError):
        return "unknown"


def render(reg, pytorch, op_plugin):
    lines = [
        "# ATen overloads Huawei's torch_npu registers a kernel for on the NPU (any *PrivateUse1 key,",
        "# or CatchAll), for torch " + reg.torch.version + ": `name  KEY(repo:path[#how]) ...`, sorted.",
        "# Any other overload that reaches PrivateUse1 runs through torch_npu's CPU fallback",
        "# (\"will fall back to run on the CPU\"); an AutogradPrivateUse1 entry alone is an autograd",
        "# wrapper that still needs a PrivateUse1 kernel; #explicit-cpu kernels copy to the CPU.",
        f"# Derived from Ascend/pytorch {git_head(pytorch)}",
        f"#          and Ascend/op-plugin {git_head(op_plugin)}",
        "# Regenerate (with the python of that torch release, e.g. .venv/pt213):",
        "#   python tools/torch_npu_registrations.py --pytorch <Ascend/pytorch> --op-plugin <Ascend/op-plugin> \\",
        "#       --out ops/torch_npu_registered_ops.txt",
    ]
    for name in sorted(reg.regs):
        lines.append(name + "  " + " ".join(f"{k}({s})" for k, s in sorted(reg.regs[name])))
    return "\n".join(lines) + "\n"


TABLE_GROUPS = {
    "registered": "torch_npu registers an NPU kernel (PrivateUse1 or CatchAll; for a "
                  "CompositeImplicitAutograd overload, AutogradPrivateUse1)",
    "other-key": "registered only for quantized / sparse / nested npu tensors: on a dense npu "
                 "tensor it falls back to the CPU",
    "composite": "no registration, but PyTorch's composite kernel serves the NPU; a structured "
                 "overload computes through its out= overload, whose fate is given",
    "fallback": "no registration and no composite kernel: torch_npu's CPU fallback",
    "absent": "not in this torch release",
}


def classify_table(reg, table_path):
    """Our table's `aten:` entries: (group, name, detail) with the groups of TABLE_GROUPS."""
    torch = reg.torch
    rows = []
    for raw in read_yaml(table_path).get("aten") or []:
        name = raw["op"] if isinstance(raw, dict) else raw
        ours = ""
        if isinstance(raw, dict) and raw.get("supported") is False:
            ours = "ours: unsupported"
        elif isinstance(raw, dict) and raw.get("kernel") == "native":
            ours = "ours: native kernel"
        keys = reg.keys(name)
        if name not in torch.functions:
            group, detail = "absent", ""
        elif {"PrivateUse1", "CatchAll"} & keys or ("AutogradPrivateUse1" in keys and name in torch.implicit):
            group, detail = "registered", ""
        elif name in torch.composite:
            group, detail = "composite", torch.composite[name]
            delegate = re.match(r"structured, computed by (\S+)", detail)
            if delegate:
                served = {"PrivateUse1", "CatchAll"} & reg.keys(delegate.group(1))
                detail += " (registered)" if served else " (which falls back)"
        elif keys - {"AutogradPrivateUse1"}:
            group, detail = "other-key", ", ".join(sorted(keys))
        else:
            group, detail = "fallback", ""
        rows.append((group, name, "; ".join(x for x in (detail, ours) if x)))
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pytorch", required=True, help="Ascend/pytorch checkout")
    parser.add_argument("--op-plugin", required=True, help="Ascend/op-plugin checkout")
    parser.add_argument("--torch-version", help="X.Y; default and required: the running torch's")
    parser.add_argument("--out", help="write the list here (default: stdout)")
    parser.add_argument("--table", help="classify the aten: entries of this op table")
    args = parser.parse_args(argv)

    torch = Torch()
    if args.torch_version and args.torch_version != torch.version:
        sys.exit(f"--torch-version {args.torch_version}: run this with that torch's python "
                 f"(this one has torch {torch.version})")
    reg = collect(args.pytorch, args.op_plugin, torch)
    text = render(reg, args.pytorch, args.op_plugin)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text)
        print(f"{args.out}: {len(reg.regs)} overloads", file=sys.stderr)
    elif not args.table:
        sys.stdout.write(text)
    if args.table:
        rows = classify_table(reg, args.table)
        for group, meaning in TABLE_GROUPS.items():
            names = [(n, d) for g, n, d in rows if g == group]
            print(f"== {group} ({len(names)}): {meaning}")
            for name, detail in names:
                print(f"  {name}" + (f"  -- {detail}" if detail else ""))


if __name__ == "__main__":
    main()
