"""How a run is shown: the HTML page, the panel, the notebook view and the trace.

Owns:
  ``_html``         ``bellis report``: one self-contained HTML page from tracking stores
  ``_data``         what the page reads: every store under the given paths, one snapshot
  ``_figures``      the page's plotly figures, as plain dictionaries
  ``_gantt``        the worker timeline (Gantt chart) of the page
  ``_failures``     the Failures section and the block details a click shows (errors.jsonl)
  ``_advice``       advice lines, each derived from the store's figures alone
  ``_page_script``  the page's script: draws the figures and the volume browser, shows
                    a block's failed attempts on a click
  ``_panel``        the Resource Utilization panel (text)
  ``_notebook``     Jupyter's ``_repr_html_`` of the reports
  ``_trace``        a run as a Chrome/Perfetto trace
  ``_live``         the live page's JSON, from stores read read-only (``bellis serve``)
  ``_live_recent``  the live page's worker lanes and block wall times (per-block stamps)
  ``_live_page``    the live page: static HTML, its script inline
  ``_live_server``  the live page's HTTP server (stdlib, a daemon thread, token-guarded)

Reads stores and reports, writes files; runs nothing but the live page's server thread.

May import: ``plumbing``, ``model``, ``_tracking``, ``_stats``.
Imported by: ``_run``, ``_plan``, ``face``, ``_cli``.
The groups are those of ``tests/unit/test_layering.py``'s table, which checks these two
lines (``task`` is ``_task`` and ``_task_params``; ``face`` the public modules).

Anything below ``_run`` that shows a report reaches it through :mod:`bellis._seams`.
"""
