"""The parsers that read the host records and prepare them for the views (see ``prof_view``)."""
