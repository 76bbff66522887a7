#!/bin/sh
# The environment of the simulated CANN toolkit, as an installed toolkit's set_env.sh sets it:
#   source <site-packages>/torch_npu/cann/set_env.sh
# `import torch_npu` sets the same variables for its own process when ASCEND_HOME_PATH is unset.
if [ -n "${BASH_SOURCE:-}" ]; then _cann_script="${BASH_SOURCE}"; else _cann_script="$0"; fi
ASCEND_TOOLKIT_HOME="$(cd "$(dirname "${_cann_script}")" && pwd)"
unset _cann_script
export ASCEND_TOOLKIT_HOME
export ASCEND_HOME_PATH="${ASCEND_TOOLKIT_HOME}"
export ASCEND_AICPU_PATH="${ASCEND_TOOLKIT_HOME}"
export ASCEND_OPP_PATH="${ASCEND_TOOLKIT_HOME}/opp"
export LD_LIBRARY_PATH="${ASCEND_TOOLKIT_HOME}/lib64${LD_LIBRARY_PATH:+:${LD_LIBRARY_PATH}}"
