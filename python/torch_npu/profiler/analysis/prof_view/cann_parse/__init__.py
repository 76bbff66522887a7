"""The parsers that run CANN's ``msprof`` tool on a run's ``PROF_*`` folder (see ``prof_view``)."""
