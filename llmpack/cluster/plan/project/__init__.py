"""``llmpack cluster plan project``: from measured gangs to gangs nobody can rehearse (docs/plan.md).

A gang is ready when its slowest node is, so its ready time is the maximum over N nodes; every
GPU ready early waits, billed, for the last. The modules, in the order data flows:
:mod:`.data` (measured gangs from MLflow run groups or kubectl dumps), :mod:`.fit` (per path:
per-node ready samples and per-run overheads), :mod:`.tail` (the quantile function of those
samples, with an exponential tail past the largest), :mod:`.model` (bootstrap projection per
gang size), :mod:`.flip` (where two paths' monthly costs cross), :mod:`.charts`, :mod:`.render`
(terminal table, JSON, HTML) and :mod:`.command` (the click command).
"""
