"""Views: how a report is shown to a person, shared by the prompts, the service's pages
and the command line.

- :mod:`nndx.views.text`: how numbers print (``num``), one way everywhere.
- :mod:`nndx.views.plots`: every figure of a report, as plotly figure specs.

Torch-free: this layer imports only nndx.report, nndx.vocab, nndx.errors and its
plotting helpers, so that the service renders reports without torch installed.
"""
