"""Helpers of torch_npu's profiler (its ``prof_common_func._utils``): the environment
variables recorded in profiler_metadata.json, whether the msprof command line tool owns
profiling, and a decorator that turns exceptions into an error message."""
import functools
import os

from ._constant import Constant, print_error_msg, print_warn_msg

__all__ = []

_ENV_VARS = ("ASCEND_GLOBAL_LOG_LEVEL", "HCCL_RDMA_TC", "HCCL_RDMA_SL", "ACLNN_CACHE_LIMIT", "HOST_CACHE_CAPACITY",
             "ASCEND_ENHANCE_ENABLE", "PYTORCH_NPU_ALLOC_CONF", "ASCEND_LAUNCH_BLOCKING", "HCCL_ALGO")


def collect_env_vars() -> dict:
    return {"ENV_VARIABLES": {name: os.environ.get(name, "") for name in _ENV_VARS}}


def check_msprof_env() -> bool:
    """False (with a warning) when msprof drives profiling ($PROFILER_SAMPLECONFIG or
    $PROFILING_MODE): torch_npu's profiler API then records nothing. Checked once."""
    if not hasattr(check_msprof_env, "_cached_result"):
        static_env = os.getenv(Constant.MSPROF_STATIC_ENV)
        dynamic_env = os.getenv(Constant.MSPROF_DYNAMIC_ENV)
        if static_env:
            print_warn_msg("If performance data is collected using the 'msprof' tool. "
                           "torch_npu profiler api is not effective.")
        if dynamic_env:
            print_warn_msg(f"Environment variable '{Constant.MSPROF_DYNAMIC_ENV}' is set. torch_npu profiler api "
                           f"is not effective. Please execute 'unset {Constant.MSPROF_DYNAMIC_ENV}'.")
        check_msprof_env._cached_result = not (static_env or dynamic_env)
    return check_msprof_env._cached_result


def no_exception_func(default_ret=None):
    """A decorator: the function's exception becomes an error message and ``default_ret``."""
    def decorator(func):
        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            try:
                return func(*args, **kwargs)
            except Exception as ex:  # noqa: BLE001
                print_error_msg(f"Call {func.__name__} failed. Exception: {ex}")
                return default_ret
        return wrapper
    return decorator
