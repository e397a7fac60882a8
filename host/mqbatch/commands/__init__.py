"""commands — one thin module per `mqbatch` subcommand: parse the arguments,
check them, call the package that does the work, print its result.

May import: every package. Imported only by ``mqbatch.cli``.
"""
