"""ingest — from the broker to the landing zone (product).

``recorder``: the paho-mqtt recorder behind `mqbatch ingest` (a shared subscription,
every PUBLISH landed durably before it is acknowledged); ``landing``: the WAL and
the Parquet landing zone; ``e2eack``: the end-to-end acknowledgements it sends back.

May import: ``mqbatch.fleet`` (the broker policy's limits), ``mqbatch.wire``, ``mqbatch.util``.
"""
