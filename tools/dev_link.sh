#!/usr/bin/env bash
# Development without installing the wheel: builds the extension of a pair and links
# it (and the generated version.py and _op_table.py, the C++ SDK folders include/ and lib/ and
# the simulated CANN home cann/) into python/torch_npu/ (all gitignored).
#   tools/dev_link.sh [bazel config, default pt213_cann85]
# then: PYTHONPATH=python .venv/pt213/bin/python -c "import torch_npu"
set -euo pipefail
cd "$(dirname "$0")/.."
config="${1:-pt213_cann85}"
bazel build "//python:torch_npu/_C.so" //python:version_py //python:op_table_py //python:sdk_include \
    //python:sdk_libs //python:sdk_cann_home "--config=$config"
ln -sf "$(pwd)/bazel-bin/python/torch_npu/_C.so" python/torch_npu/_C.so
ln -sf "$(pwd)/bazel-bin/python/torch_npu/version.py" python/torch_npu/version.py
ln -sf "$(pwd)/bazel-bin/python/torch_npu/_op_table.py" python/torch_npu/_op_table.py
# torch_npu/include, torch_npu/lib (the C++ SDK) and torch_npu/cann (the simulated CANN home),
# as in the wheel: links to bazel-bin's.
for d in include lib cann; do
  if [ -e "python/torch_npu/$d" ] && [ ! -L "python/torch_npu/$d" ]; then
    echo "dev_link.sh: python/torch_npu/$d exists and is not a link; not replacing it" >&2
    exit 1
  fi
  ln -sfn "$(pwd)/bazel-bin/python/torch_npu/$d" "python/torch_npu/$d"
done
