"""The Textual console: live attach, replay and demos over one TraceModel.

Imports analysis, store and events; nothing outside ``tui``/``cli`` imports it.
"""
