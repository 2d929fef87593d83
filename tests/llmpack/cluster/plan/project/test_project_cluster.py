"""``llmpack project`` validated, not asserted: on the loopback cluster, with gang
nodes brought up, pulled and started at paces drawn from a distribution (:mod:`standins.node_paces`),
measure 2-node gangs, project 8 and 16 nodes, then run real 8- and 16-node gangs and check that their
measured median and p90 fall inside the projected intervals; and that the same measurements are
refused for a p99 they cannot support.

One light-tailed (uniform) and one heavy-tailed (lognormal) distribution, on two paths. The
interval checked is :func:`llmpack.cluster.plan.project.model.predict_measured`'s: what that many real runs will
measure (the fit's uncertainty and the runs' own scatter), not only the true quantile's.
Virtual time: the paces are tens of seconds of the cluster's clock, played in milliseconds.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from standins.loopback import LoopbackCluster
from standins.node_paces import NodePaces, fixed, lognormal, uniform

from components.errors import InputError
from llmpack.cluster.compare import cluster
from llmpack.cluster.plan.project import data
from llmpack.cluster.plan.project.fit import fit_paths
from llmpack.cluster.plan.project.model import predict_measured, project_path

MEASURED_RUNS, CHECK_RUNS = 10, 4  # 2-node gangs measured; real 8- and 16-node gangs run to check

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("loopback_env")]


CASES: dict[str, tuple[str, Callable[[], NodePaces]]] = {
    "light-uniform": ("argo", lambda: NodePaces(node_create=fixed(1), node_ready=uniform(20, 60),
                                                pull=uniform(5, 15), start=fixed(1), seed=5)),
    "heavy-lognormal": ("mlflow", lambda: NodePaces(node_create=fixed(1), node_ready=lognormal(30, 0.45),
                                                    pull=lognormal(10, 0.5), start=fixed(1), seed=7)),
}


def _gang_ready(result: dict) -> list[float]:
    assert result["failed"] == [], result["failed"]
    return [r["metrics"]["gang_ready_s"] for r in result["runs"]]


@pytest.mark.parametrize("case", list(CASES))
def test_projected_intervals_hold_the_real_bigger_gangs(case: str, tmp_path: Path) -> None:
    path, paces = CASES[case]
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    with LoopbackCluster(tmp_path, uri, node_paces=paces()) as c:
        measured = cluster.compare_cluster(**c.options(backends=path, nodes=2, gpus=1, repeats=MEASURED_RUNS))
        _gang_ready(measured)
        # Through MLflow, as `llmpack project --run-group` reads it.
        fit = fit_paths(data.from_mlflow([measured["run_group"]], uri))[path]
        assert fit.node_samples == 2 * MEASURED_RUNS and fit.runs == MEASURED_RUNS and fit.gang_sizes == (2,)
        with pytest.raises(InputError, match=rf"^path {path}: 20 node samples, too few for p99 \(needs 100\)"):
            project_path(fit, [8, 16], [0.5, 0.9, 0.99])
        projected = {row.nodes: row for row in project_path(fit, [2, 8, 16], [0.5, 0.9])}
        for nodes in (8, 16):
            real = _gang_ready(cluster.compare_cluster(**c.options(backends=path, nodes=nodes, gpus=1,
                                                                   repeats=CHECK_RUNS)))
            expect = predict_measured(fit, nodes, [0.5, 0.9], CHECK_RUNS)
            for q, level in (("p50", 0.5), ("p90", 0.9)):
                got = float(np.quantile(real, level))
                e = expect[q]
                assert e.low <= got <= e.high, (case, nodes, q, got, e, sorted(real))
                # The true quantile's interval lies inside what a few runs may show, and grows with N.
                assert e.low <= projected[nodes].gang_ready[q].value <= e.high
            assert projected[nodes].gang_ready["p50"].value > projected[2].gang_ready["p50"].value
