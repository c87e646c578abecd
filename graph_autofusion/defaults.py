"""The default values of the fusion options, in one place (no imports: every layer reads them).

:class:`~graph_autofusion.options.FuseOptions` is the record built from them; the CLI's
argument defaults, the API's keyword defaults and the pipelines' read these names.
"""

#: Minimum estimated relative saving for a fusion to be planned.
BENEFIT_THRESHOLD = 0.2
#: Cosine-similarity floor of the whole fused model against the original.
E2E_COSINE = 0.9999
#: Automatic clustering limits: nodes per cluster, distinct external inputs per cluster.
MAX_CLUSTER_NODES = 64
MAX_CLUSTER_INPUTS = 8
