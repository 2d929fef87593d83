"""The lab: what runs against a Kubernetes cluster, beside the pack (``pip install llmpack[cluster]``).

The pod watcher (``k8s/``), ``doctor/``, ``plan/`` (with ``project`` inside it), submission
(``submit.py``, ``submit_command.py``) and the cluster comparison (``compare/``); ``cli.py`` is the
``llmpack cluster`` group. The lab may import the pack (``components``, the backends, the rest of
``llmpack``); no module of the pack imports the lab (tests/test_layering.py). Nothing is imported here.
"""
