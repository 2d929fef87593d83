"""Serving: what the register step turns a tuned model into, and which version the registry ships.

``promotion`` decides, from plain values, whether a new version takes the ``champion`` alias;
``package`` writes the MLflow pyfunc model (and, on request, merged Hugging Face weights);
``pyfunc_model`` is the served code itself, a self-contained file that imports no llmpack module.
Imports ``components`` only; torch, transformers, peft and MLflow inside functions.
"""
