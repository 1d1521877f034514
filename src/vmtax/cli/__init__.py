"""The command line: one module per command group (`main` holds the group and `run`).
Commands parse arguments, call studies and renderers, and print; no command imports
another's module.

May import: every part but the plugin packages.
"""
