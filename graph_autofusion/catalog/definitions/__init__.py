"""Operator definitions: importing this package registers every operator of the catalog."""

from graph_autofusion.catalog.definitions import (  # noqa: F401
    attention,
    binary,
    contrib,
    control,
    conv,
    data,
    elementwise,
    nn,
    reduction,
    resize,
    rnn,
    shape,
)
