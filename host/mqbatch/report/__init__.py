"""report — the self-contained HTML report and its SVG charts (product).

May import: ``mqbatch.wire``, ``mqbatch.util``.
"""
