"""The `specsample` command line (main: the group; one module per command)."""
