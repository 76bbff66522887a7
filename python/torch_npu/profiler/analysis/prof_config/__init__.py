"""How the analysis is put together: which file holds which FRAMEWORK records
(``_fwk_file_parser_config``), and each parser's dependencies and concurrency mode
(``_parser_deps_config``)."""
