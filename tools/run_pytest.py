"""Runs pytest on the folders given as arguments (the main of Bazel's py_tests)."""
import os
import sys

import pytest

if __name__ == "__main__":
    # Bazel gives each test a writable temp dir; keep caches out of the source tree.
    args = ["-q", "-p", "no:cacheprovider"] + sys.argv[1:]
    if os.environ.get("XML_OUTPUT_FILE"):
        args.append("--junitxml=" + os.environ["XML_OUTPUT_FILE"])
    sys.exit(pytest.main(args))
