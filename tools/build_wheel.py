"""Writes a reproducible wheel (stdlib only): sorted entries, fixed timestamps, RECORD.

usage: build_wheel.py --out X.whl --version V --requires REQ --tag T
                      [--strip-prefix P ...] FILE...
Each FILE is stored under its path with the first matching prefix removed.
"""
import argparse
import ast
import base64
import hashlib
import zipfile

NAME = "torch_npu"
EPOCH = (1980, 1, 1, 0, 0, 0)

METADATA = """Metadata-Version: 2.1
Name: torch_npu
Version: {version}
Summary: Ascend NPU plugin for PyTorch (NPU simulator build)
License: BSD-3-Clause
Requires-Python: >=3.9
Requires-Dist: {requires}

torch_npu registers the `npu` device with PyTorch. This build runs on a faithful NPU
simulator: device memory is host memory and kernels run on the CPU.
"""

WHEEL = """Wheel-Version: 1.0
Generator: torch_npu build_wheel
Root-Is-Purelib: false
Tag: {tag}
"""

# Entry point group -> lines "name = module:attribute". Add a line to declare one more.
ENTRY_POINTS = {
    "torch.backends": ["torch_npu = torch_npu:_autoload"],
    # Dynamo backends: read from the BACKENDS table of this package file, the same table
    # `import torch_npu` registers at run time (add a backend there, not here).
    "torch_dynamo_backends": "torch_npu/dynamo/__init__.py:BACKENDS",
    "console_scripts": ["npu-smi = torch_npu.npu_smi:main"],
}


def _dict_literal(source: bytes, name: str) -> dict:
    """The literal dict assigned to ``name`` at the top level of a Python source."""
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name for t in node.targets):
            return ast.literal_eval(node.value)
    raise SystemExit(f"build_wheel: no top-level {name} = {{...}} found")


def entry_points(entries: dict) -> str:
    """entry_points.txt; ``entries`` maps archive paths to file contents."""
    text = ""
    for group, lines in ENTRY_POINTS.items():
        if isinstance(lines, str):  # "path:NAME" of a {name: "module:attribute"} table
            path, name = lines.rsplit(":", 1)
            lines = [f"{k} = {v}" for k, v in _dict_literal(entries[path], name).items()]
        text += f"[{group}]\n" + "".join(line + "\n" for line in lines) + "\n"
    return text


def digest(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--version", required=True)
    p.add_argument("--requires", required=True)
    p.add_argument("--tag", required=True)
    p.add_argument("--strip-prefix", action="append", default=[])
    p.add_argument("files", nargs="+")
    a = p.parse_args()

    entries = {}
    for f in a.files:
        arc = f
        for prefix in sorted(a.strip_prefix, key=len, reverse=True):
            if arc.startswith(prefix):
                arc = arc[len(prefix):]
                break
        if not arc.startswith(NAME + "/"):
            raise SystemExit(f"{f}: not under {NAME}/ after stripping prefixes")
        with open(f, "rb") as fh:
            entries[arc] = fh.read()

    dist = f"{NAME}-{a.version}.dist-info"
    entries[f"{dist}/METADATA"] = METADATA.format(version=a.version, requires=a.requires).encode()
    entries[f"{dist}/WHEEL"] = WHEEL.format(tag=a.tag).encode()
    entries[f"{dist}/entry_points.txt"] = entry_points(entries).encode()
    entries[f"{dist}/top_level.txt"] = (NAME + "\n").encode()
    record = [f"{k},{digest(v)},{len(v)}" for k, v in sorted(entries.items())]
    record.append(f"{dist}/RECORD,,")
    entries[f"{dist}/RECORD"] = ("\n".join(record) + "\n").encode()

    with zipfile.ZipFile(a.out, "w", zipfile.ZIP_DEFLATED) as z:
        for arc in sorted(entries):
            info = zipfile.ZipInfo(arc, EPOCH)
            info.external_attr = (0o755 if arc.endswith(".so") else 0o644) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, entries[arc])


if __name__ == "__main__":
    main()
