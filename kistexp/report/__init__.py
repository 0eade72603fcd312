"""Reports people look at: the HTML report of an experiment or of a plan before any run, and the
announcement the network team sends (docs/reports.md).

Layers: ``data`` reads the experiment directory (journal, predictions, metrics) and decides
nothing; ``wording`` puts the judge's numbers in plain words; ``plots`` draws; ``html`` and
``announce`` fill the Jinja2 templates in ``templates/``.
Files are written whole or not at all (``kistexp.safeio.write_atomic``).
"""
