"""``llmpack cluster plan``: before anything is submitted, each path x GPU type x on-demand/spot estimated from
the user's own measured history (docs/plan.md).

Not :mod:`llmpack.compare.plan`, which is the comparison's round plan (which runs to submit).
The modules, in the order data flows: :mod:`.history`, :mod:`.phases`, :mod:`.estimate`,
:mod:`.costs`, :mod:`.prices`, :mod:`.choice`, :mod:`.render`, :mod:`.chart`, :mod:`.calibration`,
:mod:`.record`, :mod:`.run` (all of it without click) and :mod:`.command` (the click command); what
each does: docs/plan.md, 'The code'.

It imports :mod:`llmpack.cluster.plan.project` (the gang model), :mod:`llmpack.report` (the run records, the
estimate's tag format) and :mod:`components.record.cost` (prices). Nothing below imports it but
``cli`` and the ``--plan`` hooks of ``submit`` (run/submit_command.py) and ``compare`` (cli.py),
each inside the function that uses it.
"""
