"""Experiments with real language models: task accuracy and distribution tests (``eval``, ``tasks``,
``lawtests``; the ``cactus-theory eval`` command) and the decoding benchmark (``experiment``)."""
