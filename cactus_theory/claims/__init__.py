"""Claims: the ledger of verdicts (``ledger``) and the ``cactus-theory verify`` command that checks the
theory's claims on fresh cases (``report``)."""
