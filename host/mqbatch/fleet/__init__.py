"""fleet — everything a real deployment is set up with (product).

``provision``: `mqbatch fleet init|add|remove|show` (fleet directory, accounts,
broker configuration); ``brokerconf``: the broker's security policy and limits;
``pki``: the certificate authority; ``deploy``: `mqbatch deploy` to a board.

May import: ``mqbatch.wire``, ``mqbatch.util``.
"""
