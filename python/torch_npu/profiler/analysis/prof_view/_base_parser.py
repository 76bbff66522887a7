"""``BaseParser``: a parser of the analysis, a ``ConcurrentTask`` named as in
``ParserDepsConfig`` (which gives its dependencies and mode: ``COMMON_CONFIG`` when the run
has msprof data, else ``ONLY_FWK_CONFIG``). ``param_dict``: ``profiler_path`` (the result
directory), ``output_path`` (where the views go), ``Constant.EXPORT_TYPE`` (["text"], ["db"]).
``_run_logged(work, error)``: a parser's run in the parse's log (``logs/``): start, finish, or
the error with its traceback and (``Constant.FAIL``, ``fail_output``)."""
from abc import ABC

from ..prof_common_func._constant import Constant
from ..prof_common_func._log import ProfilerLogger
from ..prof_common_func._path_manager import ProfilerPathManager
from ..prof_common_func._task_manager import ConcurrentMode, ConcurrentTask
from ..prof_config._parser_deps_config import ParserDepsConfig

__all__ = []


class BaseParser(ConcurrentTask, ABC):
    def __init__(self, name: str, param_dict: dict):
        self._param_dict = param_dict
        self._profiler_path = param_dict.get("profiler_path")
        self._output_path = param_dict.get("output_path")
        self._export_type = param_dict.get(Constant.EXPORT_TYPE, [])
        deps, mode = self._init_param(name)
        super().__init__(name, deps, mode)

    def _init_param(self, name: str) -> tuple:
        configs = (ParserDepsConfig.COMMON_CONFIG if ProfilerPathManager.get_cann_path(self._profiler_path)
                   else ParserDepsConfig.ONLY_FWK_CONFIG)
        config = configs.get(name, {})
        return config.get(Constant.DEPS, []), config.get(Constant.MODE, ConcurrentMode.SUB_PROCESS)

    def _run_logged(self, work, error: str, fail_output=None, on_error=None):
        """(SUCCESS, ``work()``), or (FAIL, ``fail_output``) when it raises (after ``on_error(err)``)."""
        name = type(self).__name__
        ProfilerLogger.init(self._profiler_path, name)
        self.logger = ProfilerLogger.get_instance()
        self.logger.info("%s start.", name)
        try:
            output = work()
        except Exception as err:
            if on_error is not None:
                on_error(err)
            self.logger.error("%s, error: %s", error, str(err), exc_info=True)
            return Constant.FAIL, fail_output
        self.logger.info("%s finish.", name)
        return Constant.SUCCESS, output
