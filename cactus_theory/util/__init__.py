"""Infrastructure with no project imports: atomic file writes (``atomic``), command-line value checks
(``args``), public module-path aliases (``aliases``), keyed result caches (``keyed_cache``)."""
