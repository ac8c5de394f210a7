"""lightning-scale's benchmarks: one module per benchmark (``python -m benchmarks.<name>``), each exposing ``main()``
(its measurement, writing ``benchmarks/results/<name>.json``), ``rows(result)`` (its lines of the summary table, with
targets and verdicts) and ``details(result)`` (its figures on the site's Performance page). :mod:`benchmarks.registry`
lists them; ``python -m benchmarks.run`` (``make bench``) runs them all."""
