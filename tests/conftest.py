"""xdist groups that hold under pytest 9.

``pytest.mark.xdist_group(name)`` keeps tests in one xdist worker (``--dist loadgroup``, what
``make test`` runs): pytest-xdist appends ``@name`` to each test's node id and schedules a
group as one unit. pytest-xdist 3.8 does so by writing ``item._nodeid``, which pytest 9 no
longer reads (the id lives in ``item._id``), so every group was silently spread over both
workers: the trained LM's worker trained while the other waited on its lock, and both workers
loaded every full-size zoo model. The hook below gives each grouped test its suffixed id the
way pytest 9 stores it (a no-op where xdist's own suffix took effect).

It also groups the rule tests that read zoo models (``tests/rules``, ``test_zoo_*``):
``testing.rules.zoo_model`` keeps each zoo graph in memory once loaded (a full-size export
takes seconds to load, the ``torch`` source a 10-25 s Dynamo trace), so in one worker each is
loaded once instead of once per worker.
"""

from __future__ import annotations

import pytest


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.originalname.startswith("test_zoo") and "tests/rules/" in item.nodeid:
            item.add_marker(pytest.mark.xdist_group("rules_zoo"))


@pytest.hookimpl(tryfirst=True)  # before xdist's worker sends the collected ids
def pytest_collection_finish(session: pytest.Session) -> None:
    if not getattr(session.config.option, "loadgroup", False):
        return
    from _pytest.nodeid import NodeId

    for item in session.items:
        names = sorted(
            {
                str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                for m in item.iter_markers("xdist_group")
            }
        )
        if names and "@" not in item.nodeid:
            item._id = NodeId.parse(f"{item.nodeid}@{'_'.join(names)}")
