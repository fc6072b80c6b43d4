"""The preflight: every host checks itself, and the hosts check each other, before the job's program.

``run`` (what ``train`` calls) runs ``probe`` (a PyTorch program, in its own process: the
dispatcher imports no framework) and decides with ``checks`` (pure rules); ``fatbin`` reads the GPU
architectures compiled into a library. ``docs/preflight.md`` describes every check, the settings
(``sagemaker_preflight`` / ``DTC_PREFLIGHT``: ``off``, ``quick``, ``full``) and
``preflight.json``.
"""
