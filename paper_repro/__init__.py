"""Reproduction of Hao & Mou (ICLR 2026): one script per figure or table, one entry point.

``python -m paper_repro`` (see ``main.py``) runs every step, caches each step's numbers under
``paper_repro/results/`` (atomic writes, so an interrupted run resumes), draws ``figures/`` and
writes ``paper_repro/REPORT.md``. ``CACTUS_FAST=1`` (or ``--fast``) shrinks every step for CI.
"""
