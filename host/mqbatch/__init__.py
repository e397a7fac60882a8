"""mqbatch host side: reference batch-format v1 codec, CLI, recorder and Spark job support."""

__version__ = "0.1.0"
