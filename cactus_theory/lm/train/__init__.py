"""Training the project's draft head: ``draft_build`` (the ``cactus-theory build-draft`` command)."""
