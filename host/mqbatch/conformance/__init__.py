"""conformance — `mqbatch conformance`: the rules checked requirement by requirement (lab).

``proxy``: the inspecting MQTT proxy; ``packets``: its MQTT 5 packet parser;
``session``: the per-connection rule checks; ``publisher``/``subscriber``/``broker``/
``spark_job``/``paho``: the harnesses; ``matrix``: the requirement rows and the report.

May import: ``mqbatch.lab`` and the product packages.
"""
