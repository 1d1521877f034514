"""The command line: one module per command group (`main` holds the group and `run`,
`run_flags` what run's flags make: its RunRequest). Commands parse arguments (into a
study's request), call studies and renderers (the tables are vmtax.report's), and print;
no command imports another's module but the shared `progress` (a study's progress on
stderr) and `consoles`.

May import: every part but the plugin packages.
"""
