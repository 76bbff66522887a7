"""Prints what the torch repository rule needs, as key=value lines.

Run by the rule with the selected pair's venv python:
    python probe.py <workspace_root> <pair>
"""
import json
import os
import sys
import sysconfig

root, pair = sys.argv[1], sys.argv[2]
pair_file = os.path.join(root, "versions", pair, "pair.json")
if not os.path.exists(pair_file):
    sys.exit(f"unknown version pair {pair!r}: {pair_file} does not exist")
with open(pair_file) as f:
    spec = json.load(f)

try:
    import torch
except ImportError as e:  # the venv exists but lacks torch
    sys.exit(f"pair {pair}: the venv at {sys.prefix} has no torch ({e}); "
             f"run `python tools/venv.py {pair}` to create it")

installed = torch.__version__.split("+")[0]
if installed != spec["torch"]:
    sys.exit(f"pair {pair} pins torch=={spec['torch']} but the venv at {sys.prefix} "
             f"has torch {torch.__version__}")

torch_dir = os.path.dirname(torch.__file__)
print("torch_version=" + installed)
print("cann_version=" + spec["cann"])
print("post=" + str(spec["post"]))
print("pair=" + pair)
print("torch_include=" + os.path.join(torch_dir, "include"))
print("torch_lib=" + os.path.join(torch_dir, "lib"))
print("python_include=" + sysconfig.get_paths()["include"])
print("python=" + sys.executable)
print("py_tag=cp%d%d" % sys.version_info[:2])
print("cxx11_abi=" + str(int(torch._C._GLIBCXX_USE_CXX11_ABI)))
