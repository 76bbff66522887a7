#!/usr/bin/env bash
# Installs what the build needs on a fresh Debian machine: Bazel (Debian's
# bazel-bootstrap 4.2.3, offline with the stubs in third_party/) and nox.
set -euo pipefail
if ! command -v bazel >/dev/null 2>&1; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bazel-bootstrap >/dev/null
fi
if ! command -v nox >/dev/null 2>&1; then
  python3 -m pip install -q --disable-pip-version-check nox
fi
