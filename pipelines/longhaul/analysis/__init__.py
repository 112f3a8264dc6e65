"""Pure analysis of tracked runs: no MLflow, no network, no files.

What `longhaul compare`, the eval stage and the watchdog decide from values the tracking adapter
(`longhaul.tracking`) reads and writes: the tag schema of a run (`tags`), evaluation summaries as flat metric keys
(`evalmetrics`), checkpoint selection (`selection`), the ablation table (`ablation`) and its figures (`figures`),
the statistics over seeds × tasks × samples (`study`, `verdicts`, `study_render`) and the collapse watchdog
(`watchdog`). Every function takes values and returns values, so each can be tested from literals; the adapter
above does the I/O and calls them.
"""
