"""Theory built on ``core``: cvxpy programs (``optimize``), matched trade-offs (``tradeoff``), toy
models and their exact sequence laws (``toy``, ``tree``), ResiSpec reconstructed (``resispec``), independent
references (``reference``), statistical tests (``stats``) and the randomised cases of the checks (``cases``).
Never imports ``lm``."""
