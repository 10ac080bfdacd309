"""The table wing: how a table's runs are stored, planned and turned into results (above the engine, below the
`reproduce` command line)."""
