"""migrate() and open_saver(): threads copied between LangGraph savers, resumably, and
verified. Stands on the facade: imports ``_saver`` and ``errors``.
"""
