"""Rank side: patching torch.distributed, the Recorder thread, probes and merges.

Imports ``events`` and ``store`` only (plus torch); never ``analysis`` or ``tui``.
"""
