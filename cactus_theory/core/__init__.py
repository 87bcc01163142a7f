"""The rules and their exact one-step law: array helpers, input checks, divergences, the rules, their
registry, the exact law, batched verification, the sampling transforms and DropMatch's path laws.
Imports only ``util``."""
