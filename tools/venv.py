"""Creates (or reuses) the venv of a version pair: .venv/<pt..> with its pinned torch.

usage: python3 tools/venv.py <pair>        e.g. v2.13.0-8.5.0
Prints the venv's python path. PyYAML (torchgen, which the build runs to generate the
op registrations, needs it) and the test-only packages are installed alongside torch.
"""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# ml_dtypes (iree.runtime imports it): 0.7.0's extension took 0.7-1.0 s to load here, 0.6.0's
# 8 ms; that second was most of a warm MLIR compile.
# transformers: examples/llama_finetune (LlamaForCausalLM, get_linear_schedule_with_warmup) and its test;
# deepspeed, accelerate, peft: the example's ZeRO modes and the ecosystem tests (tests/test_ecosystem.py);
# torchdata: accelerate's stateful data loader cases there.
# pytest-xdist: the matrix runs each pair's tests in one worker per core, a file per worker.
# en-dtypes: Huawei's numpy dtypes, the HiFloat8 oracle of tests/test_custom_dtypes.py (and of op-plugin's tests).
PACKAGES = ["pyyaml", "numpy", "expecttest", "pytest", "pytest-xdist==3.8.0", "hypothesis==6.140.3",
            "iree-base-compiler==3.13.0", "iree-base-runtime==3.13.0", "ml_dtypes==0.6.0",
            "transformers==5.25.0", "deepspeed==0.19.8", "accelerate==1.16.0", "peft==0.21.2",
            "torchdata==0.11.0", "en-dtypes==0.0.4"]


def ensure(pair: str) -> str:
    spec_path = os.path.join(ROOT, "versions", pair, "pair.json")
    if not os.path.exists(spec_path):
        raise SystemExit(f"unknown version pair {pair!r} (no {spec_path})")
    with open(spec_path) as f:
        spec = json.load(f)
    venv = os.path.join(ROOT, spec["venv"])
    python = os.path.join(venv, "bin", "python")
    if not os.path.exists(python):
        subprocess.check_call([sys.executable, "-m", "venv", venv])
    # The venv records what it was given; a changed PACKAGES list (or torch) reinstalls.
    wanted = "\n".join([f"torch=={spec['torch']}", *PACKAGES])
    stamp = os.path.join(venv, "torch_npu_packages.txt")
    probe = subprocess.run([python, "-c", "import torch; print(torch.__version__)"], capture_output=True, text=True)
    current = open(stamp).read() if os.path.exists(stamp) else None
    if probe.returncode != 0 or probe.stdout.strip().split("+")[0] != spec["torch"] or current != wanted:
        subprocess.check_call([python, "-m", "pip", "install", "-q", "--disable-pip-version-check",
                               f"torch=={spec['torch']}", *PACKAGES])
        with open(stamp, "w") as f:
            f.write(wanted)
    return python


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    print(ensure(sys.argv[1]))
