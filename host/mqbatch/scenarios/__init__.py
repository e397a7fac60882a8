"""scenarios — whole-system runs with faults injected (lab).

``demo``: `mqbatch demo`; ``netcut``: network cuts through a relay; ``baseline``:
the umqtt.simple comparison client (installed at run time, never vendored);
``e2escenario``/``e2edevice``: end-to-end ack fault scenarios; ``secmatrix``: the
authorisation matrix against a real broker.

May import: ``mqbatch.conformance``, ``mqbatch.lab`` and the product packages.
"""
