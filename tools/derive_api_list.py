#!/usr/bin/env python3
"""Derive python/tests/data/torch_npu_api.json from Huawei's torch_npu (Ascend/pytorch).

Ascend/pytorch keeps the public API of torch_npu in ``test/torch_npu_schema.json``: one key
per public function, class and method (``"torch_npu.npu.memory_allocated": {"signature":
"(device=None)"}``), per NPU native function (``"func: npu_format_cast"``), per C++ header
declaration (``"torch_c_func: ..."``) and per public environment variable
(``"torch_npu_public_env: ..."``). This script keeps the names and signatures (facts about the
API, nothing else) that ``python/tests/test_public_api.py`` checks:

    tools/derive_api_list.py /path/to/Ascend/pytorch                  # a checkout
    tools/derive_api_list.py /path/to/pytorch.git --ref master        # a (bare) git repository
    tools/derive_api_list.py ... --out python/tests/data/torch_npu_api.json   (the default)

Excluded prefixes (the rule: an entry is kept iff it can be checked from Python against
``import torch_npu``):

* ``torch_c_func:`` -- C++ declarations in torch_npu's installed headers (``c10_npu::NPUStream``,
  ``at_npu::native::OpCommand``, ...): not reachable from Python; Huawei checks them against
  the header text, a separate C++ SDK surface.
* ``torch_npu_public_env:`` -- value tables of environment variables as written in a C++
  source (OptionsManager.h): a text snippet of Huawei's implementation, not an API signature.

Everything else is kept, including ``func:`` entries (the schemas of the ``torch.ops.npu``
native functions; checked against ``torch.ops.npu.<name>.<overload>._schema``).
"""

import argparse
import json
import os
import subprocess
import sys

SCHEMA_PATH = "test/torch_npu_schema.json"
EXCLUDED_PREFIXES = {
    "torch_c_func:": "C++ header declarations (c10_npu::, at_npu::): not reachable from Python, "
                     "a separate C++ SDK surface",
    "torch_npu_public_env:": "environment-variable value tables quoted from a C++ source "
                             "(OptionsManager.h), not an API signature",
}
HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_OUT = os.path.join(HERE, "..", "python", "tests", "data", "torch_npu_api.json")


def _git(repo, *args):
    return subprocess.run(["git", "-C", repo, *args], check=True, capture_output=True,
                          text=True).stdout


def load_schema(repo, ref):
    """(schema dict, source description) from a checkout or, with ref, from git objects."""
    if ref:
        text = _git(repo, "show", f"{ref}:{SCHEMA_PATH}")
        commit = _git(repo, "rev-parse", f"{ref}^{{commit}}").strip()
        return json.loads(text), {"ref": ref, "commit": commit}
    with open(os.path.join(repo, SCHEMA_PATH), encoding="utf-8") as f:
        schema = json.load(f)
    try:
        commit = _git(repo, "rev-parse", "HEAD").strip()
        branch = _git(repo, "rev-parse", "--abbrev-ref", "HEAD").strip()
    except (subprocess.CalledProcessError, FileNotFoundError):
        commit, branch = "unknown", "unknown"
    return schema, {"ref": branch, "commit": commit}


def derive(schema):
    entries, excluded = {}, {p: 0 for p in EXCLUDED_PREFIXES}
    for name, value in schema.items():
        prefix = next((p for p in EXCLUDED_PREFIXES if name.startswith(p)), None)
        if prefix is not None:
            excluded[prefix] += 1
            continue
        entries[name] = value["signature"]
    return dict(sorted(entries.items())), excluded


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("repo", help="Ascend/pytorch checkout (or git directory with --ref)")
    parser.add_argument("--ref", help="read the schema of this branch/commit from git objects")
    parser.add_argument("--out", default=DEFAULT_OUT)
    args = parser.parse_args(argv)

    schema, source = load_schema(args.repo, args.ref)
    entries, excluded = derive(schema)
    data = {
        "_about": "Public API of Huawei's torch_npu: qualified name -> signature string, derived "
                  "by tools/derive_api_list.py from Ascend/pytorch " + SCHEMA_PATH + ". "
                  "Checked by python/tests/test_public_api.py. 'func: X[.overload]' entries are "
                  "torch.ops.npu schemas (an empty signature: an aten op with an npu kernel).",
        "_source": {"repository": "https://github.com/Ascend/pytorch", "path": SCHEMA_PATH,
                    **source, "schema_entries": len(schema)},
        "_excluded_prefixes": {p: {"reason": r, "count": excluded[p]}
                               for p, r in EXCLUDED_PREFIXES.items()},
        "entries": entries,
    }
    out = os.path.abspath(args.out)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print(f"{out}: {len(entries)} entries ({sum(excluded.values())} excluded) "
          f"from {source['ref']} {source['commit']}", file=sys.stderr)


if __name__ == "__main__":
    main()
