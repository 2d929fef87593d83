"""``llmpack plan``: before anything is submitted, each path x GPU type x on-demand/spot estimated from
the user's own measured history (docs/plan.md).

Not :mod:`llmpack.compare.plan`, which is the comparison's round plan (which runs to submit).
The modules, in the order data flows: :mod:`.history` (measured runs of MLflow run groups or kubectl
dumps, one :class:`~.history.RunSample` each), :mod:`.phases` (which measured phases an option uses,
and which it borrows from another GPU type or path), :mod:`.estimate` (the gang by
:mod:`llmpack.project`'s max-of-N model, times p50/p90 with intervals), :mod:`.costs` (cost per run,
spot preemption waste), :mod:`.prices` (the catalogue's row per option, stale rows flagged),
:mod:`.choice` (the chosen row and why), :mod:`.render` (table, JSON), :mod:`.chart` (the PNG),
:mod:`.calibration` (coverage over past planned runs), :mod:`.record` (the estimate as run tags,
``--plan``'s hooks), :mod:`.run` (all of it without click) and :mod:`.command` (the click command).

It imports :mod:`llmpack.project` (the gang model), :mod:`llmpack.report` (the run records, the
estimate's tag format) and :mod:`components.record.cost` (prices). Nothing below imports it but
``cli`` and the ``--plan`` hooks of ``submit`` (run/submit_command.py) and ``compare`` (cli.py),
each inside the function that uses it.
"""
