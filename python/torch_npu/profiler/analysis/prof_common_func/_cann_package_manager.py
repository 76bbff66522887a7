"""``CannPackageManager``: what the installed CANN toolkit's ``msprof`` can export, as torch_npu.

torch_npu asks ``msprof --help``: ``--type`` means it can export a database, and the text
"text(which will also export the database)" that its text export writes one as well. The
simulator's CANN has no ``msprof``; with the toolkit's ``msprof`` on ``PATH`` the answers
are its, otherwise both are False. Answers are cached per process.
"""
import shutil
import subprocess

from ._path_manager import ProfilerPathManager

__all__ = []


def check_msprof_help_output(search_text: str) -> bool:
    """Whether ``msprof --help`` (msprof found on PATH, owned by root or this user and not
    writable by others) succeeds and mentions search_text."""
    msprof = shutil.which("msprof")
    if not msprof or not ProfilerPathManager.check_path_permission(msprof):
        return False
    try:
        done = subprocess.run([msprof, "--help"], capture_output=True, shell=False, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0 and search_text in done.stdout


def check_cann_package_support_export_db() -> bool:
    return check_msprof_help_output("--type")


def check_cann_package_support_default_export_db() -> bool:
    return check_msprof_help_output("text(which will also export the database)")


class CannPackageManager:
    SUPPORT_EXPORT_DB = None
    SUPPORT_DEFAULT_EXPORT_DB = None

    @classmethod
    def is_support_export_db(cls) -> bool:
        if cls.SUPPORT_EXPORT_DB is None:
            cls.SUPPORT_EXPORT_DB = check_cann_package_support_export_db()
        return cls.SUPPORT_EXPORT_DB

    @classmethod
    def is_support_default_export_db(cls) -> bool:
        if cls.SUPPORT_DEFAULT_EXPORT_DB is None:
            cls.SUPPORT_DEFAULT_EXPORT_DB = check_cann_package_support_default_export_db()
        return cls.SUPPORT_DEFAULT_EXPORT_DB
