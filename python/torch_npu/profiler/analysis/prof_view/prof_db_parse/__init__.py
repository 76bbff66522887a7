"""The parsers of the db export's tables (see ``prof_view``): ``BasicDbParser`` (msprof's
database as the base, the rank / device map, host info, environment and metadata) and
``FwkApiDbParser`` (the host APIs with their connection to CANN's launches)."""
