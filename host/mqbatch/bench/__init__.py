"""bench — `mqbatch bench`: benchmarks that print median [min–max] figures (lab).

``wire``, ``device``, ``ingest``, ``latency``: one benchmark each; ``out``: the
result files and machine description; ``report``: docs/benchmarks.md and its plots.

May import: everything except ``mqbatch.commands`` and ``mqbatch.cli``.
"""
